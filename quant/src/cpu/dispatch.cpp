// quant/src/cpu/dispatch.cpp — the CPU kernel selection (CpuKernel, set_cpu_threads,
// set_cpu_stream_min_bytes) and the drivers that split a matrix's rows or token groups across threads and
// pick each ISA's entry point (dispatch.h): the fused integer quantize and dequantize, the block formats on
// every kernel, and the NaN/Inf pass before the non-fused paths.
#include "dispatch.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#if LQ_HAVE_AVX2_KERNEL && defined(__clang__)
#include <cpuid.h>
#endif

namespace latentq::cpu {
namespace {

// An output (decoded floats, packed codes) of at least this many bytes is written with non-temporal
// stores: it does not fit the caches, and a normal store first reads each line it writes
// (read-for-ownership), a third more memory traffic for dequantize. Smaller outputs stay in cache for
// whoever reads them next.
// Default 4 MiB (kStreamMinBytes); set_cpu_stream_min_bytes changes it (tests: 0 runs the streamed paths on
// small inputs).
constexpr int64_t kStreamMinBytes = int64_t{4} << 20;
std::atomic<int64_t> g_stream_min{kStreamMinBytes};

std::atomic<int> g_kernel{static_cast<int>(CpuKernel::Auto)};
std::atomic<int> g_threads{1};

bool cpu_has_avx2() {
#if LQ_HAVE_AVX2_KERNEL && defined(__clang__)
  // clang (14, the fuzz build's) has no "f16c" for __builtin_cpu_supports: CPUID leaf 1, ECX bit 29.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __builtin_cpu_supports("avx2") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
#elif LQ_HAVE_AVX2_KERNEL
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

// Runs fn(begin, end) over [0, n) split into `threads` contiguous ranges (the calling thread takes the
// first); rethrows the exception of the lowest range that threw (the first error in row order).
template <class Fn>
void split_ranges(int64_t n, int threads, Fn&& fn) {
  threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, n)));
  if (threads == 1) {
    fn(int64_t{0}, n);
    return;
  }
  std::vector<std::exception_ptr> err(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  auto run = [&](int i) {
    try {
      fn(n * i / threads, n * (i + 1) / threads);
    } catch (...) {
      err[static_cast<size_t>(i)] = std::current_exception();
    }
  };
  for (int i = 1; i < threads; ++i) pool.emplace_back(run, i);
  run(0);
  for (std::thread& th : pool) th.join();
  for (const std::exception_ptr& e : err)
    if (e) std::rethrow_exception(e);
}

constexpr int64_t kThreadMinElems = int64_t{1} << 20;

// The blocks of rows [t0, t1) of a block format in storage order: fn(t, d0, n, gi) for block j of row t, which
// covers columns [d0, d0 + n) and is scale group gi = t · blocks_per_row + j (quantize and dequantize).
template <class Fn>
void for_each_block(const Layout& L, int64_t D, int64_t t0, int64_t t1, Fn&& fn) {
  const int64_t nb = L.blocks_per_row > 0 ? L.blocks_per_row : 1, blk = L.desc.block;
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t j = 0; j < nb; ++j) {
      const int64_t d0 = j * blk;
      fn(t, d0, std::min(D, d0 + blk) - d0, t * nb + j);
    }
}

// Which AVX2 element path a block format takes under `kernel` (none outside Avx2 and for the ggml kinds).
struct BlockPath {
  bool e4m3 = false, e2m1 = false, ggml = false;
};
BlockPath block_path([[maybe_unused]] CpuKernel kernel, [[maybe_unused]] const q::BlockDesc& f) {
  BlockPath b;
#if LQ_HAVE_AVX2_KERNEL
  b.e4m3 = kernel == CpuKernel::Avx2 && e4m3_elements(f);
  b.e2m1 = kernel == CpuKernel::Avx2 && e2m1_elements(f);
  b.ggml = kernel == CpuKernel::Avx2 && ggml_elements(f);
#endif
  return b;
}

}  // namespace

int64_t stream_min_bytes() { return g_stream_min.load(); }

float check_finite(const float* X, int64_t T, int64_t D, CpuKernel kernel) {
  // The Avx2 kernel checks NaN/Inf and takes max|x| in one pass (abs_bits_max_avx2); the count for the message
  // is made only when there is one.
  float amax_x = -1.0f;  // max|x| when that pass ran
#if LQ_HAVE_AVX2_KERNEL
  if (kernel == CpuKernel::Avx2 && T * D > 0) {
    const uint32_t m = abs_bits_max_avx2(X, T * D);
    if (m >= 0x7f800000u) throw std::invalid_argument(nonfinite_message(count_nonfinite(X, T * D), T, D));
    amax_x = q::f32_from_bits(m);
  } else
#endif
      if (const int64_t bad = count_nonfinite(X, T * D))
    throw std::invalid_argument(nonfinite_message(bad, T, D));
  return amax_x;
}

// The fused integer quantize (CpuKernel Baseline / Avx2).
// Into qt (quantize(): a new tensor; quantize_into(): a reused one). The kernels write every byte of
// codes, scales and offsets, so a buffer that already has the needed size is neither reallocated nor
// zero-filled (no page faults, no extra pass over memory).
void quantize_int_fast(QuantizedTensor& qt, const QuantSpec& spec_in, Target target, const float* X, int64_t T,
                       int64_t D, std::span<const int64_t> seq_offsets, CpuKernel kernel) {
  auto sized = [](std::vector<uint8_t>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) != n) assign_zeroed(v, static_cast<size_t>(n));
  };
  uint32_t bad = 0;
  try {
    validate_spec_fields(spec_in);
    validate_seq_offsets(seq_offsets, T);
    qt.spec = spec_in.stored_for(target);
    const QuantSpec& spec = qt.spec;
    (void)latentq::layout(spec, D);
    qt.rows = T;
    qt.cols = D;
    qt.group_bounds.clear();
    qt.global.clear();
    if (spec.scheme == Scheme::Sym) qt.offsets.clear();
    sized(qt.codes, T * qt.row_bytes());
    const bool asym = spec.scheme == Scheme::Asym;
    const int64_t sb = q::scale_dtype_bytes(spec.scale_dtype);
    IntJob job{&qt, X, 0, 0, 0.0f, 0.0f, T * qt.row_bytes() >= g_stream_min.load()};
    int64_t n = T;
    const int threads = T * D >= kThreadMinElems ? g_threads.load() : 1;
    switch (spec.granularity) {
      case Granularity::Tensor: {
        std::vector<float> mns(static_cast<size_t>(threads)), mxs(static_cast<size_t>(threads));
        std::vector<uint32_t> bads(static_cast<size_t>(threads), 0);
        std::vector<int64_t> starts(static_cast<size_t>(threads));
        // statistics of contiguous element ranges, then the reference's fold over the range results in order
        split_ranges(threads, threads, [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i) {
            const int64_t e0 = T * D * i / threads, e1 = T * D * (i + 1) / threads;
            starts[static_cast<size_t>(i)] = e0;
            float* mn_i = &mns[static_cast<size_t>(i)];
            float* mx_i = &mxs[static_cast<size_t>(i)];
#if LQ_HAVE_AVX2_KERNEL
            if (kernel == CpuKernel::Avx2) {
              bads[static_cast<size_t>(i)] = e1 > e0 ? minmax_span_avx2(X + e0, e1 - e0, *mn_i, *mx_i) : 0;
              continue;
            }
#endif
            bads[static_cast<size_t>(i)] = e1 > e0 ? minmax_span_baseline(X + e0, e1 - e0, *mn_i, *mx_i) : 0;
            if (e1 == e0) mns[static_cast<size_t>(i)] = mxs[static_cast<size_t>(i)] = X[0];
          }
        });
        float mn = X[0], mx = X[0];
        for (int i = 0; i < threads; ++i) {
          bad |= bads[static_cast<size_t>(i)];
          mn = q::min_num(mn, mns[static_cast<size_t>(i)]);  // the first zero wins ties, as in one fold
          mx = q::max_num(mx, mxs[static_cast<size_t>(i)]);
        }
        if (bad) break;
        const q::ScaleOffset p = store_tensor_params(qt, mn, mx);
        job.tensor_scale = p.scale;
        job.tensor_offset = p.offset;
        break;
      }
      case Granularity::Channel: {
        qt.group_bounds = channel_groups(seq_offsets, T, spec.group_size);
        n = static_cast<int64_t>(qt.group_bounds.size()) - 1;
        sized(qt.scales, n * D * sb);
        if (asym) sized(qt.offsets, n * D * sb);
        break;
      }
      case Granularity::Token: {
        const int64_t nt = qt.scales_per_row();
        sized(qt.scales, T * nt * sb);
        if (asym) sized(qt.offsets, T * nt * sb);
        break;
      }
    }
    if (!bad) {
      std::atomic<uint32_t> any_bad{0};
      split_ranges(n, threads, [&](int64_t b, int64_t e) {
        IntJob j = job;
        j.begin = b;
        j.end = e;
#if LQ_HAVE_AVX2_KERNEL
        const uint32_t r = kernel == CpuKernel::Avx2 ? int_quantize_avx2(j) : int_quantize_baseline(j);
#else
        const uint32_t r = int_quantize_baseline(j);
#endif
        any_bad.fetch_or(r);
      });
      bad |= any_bad.load();
    }
  } catch (...) {
    // the reference checks NaN/Inf before anything else: the same input gives the same error
    if (const int64_t c = count_nonfinite(X, T * D)) throw std::invalid_argument(nonfinite_message(c, T, D));
    throw;
  }
  if (bad) throw std::invalid_argument(nonfinite_message(count_nonfinite(X, T * D), T, D));
}

void dequantize_int(const QuantizedTensor& qt, float* out, CpuKernel k) {
  if (k == CpuKernel::Reference) return dequantize_int_reference(qt, out);
  const int64_t T = qt.rows, D = qt.cols;
  const int64_t n = qt.spec.granularity == Granularity::Channel ? static_cast<int64_t>(qt.group_bounds.size()) - 1 : T;
  const int threads = T * D >= kThreadMinElems ? g_threads.load() : 1;
  split_ranges(n, threads, [&](int64_t b, int64_t e) {
    const DecJob job{&qt, out, b, e};
#if LQ_HAVE_AVX2_KERNEL
    if (k == CpuKernel::Avx2) return int_dequantize_avx2(job);
#endif
    int_dequantize_baseline(job);
  });
}

void quantize_blocks(QuantizedTensor& qt, const Layout& L, const QuantizeInput& in) {
  const QuantSpec& spec = qt.spec;
  const float* X = in.X;
  const int64_t T = in.T, D = in.D, rb = qt.row_bytes();
  const float amax_x = in.amax;
  // The fast kernels run the same block math on several threads (rows split; split_ranges rethrows the
  // first error in row order), the Avx2 kernel the 8-bit e4m3 elements and max|x| eight at a time.
  const CpuKernel kernel = in.kernel;
  // max|x| of the matrix: the per-tensor scale, and whether the decode must be checked for overflow
  float amax = 0.0f;
  if (amax_x >= 0.0f)
    amax = amax_x;
  else
    for (int64_t i = 0; i < T * D; ++i) amax = q::max_num(amax, q::abs_f(X[i]));
  float global = 0.0f;
  if (L.tensor_bytes > 0) {
    global = q::global_scale(L.desc.kind, amax, spec.rule == ScaleRule::Unit);
    qt.global.assign(4, 0);
    q::store_dtype(qt.global.data(), global, ScaleDtype::F32);
  }
  const int sb = L.scale_bytes;
  qt.scales.assign(static_cast<size_t>(L.blocks_per_row > 0 ? T * L.blocks_per_row * sb : 0), 0);
  if (L.offsets) qt.offsets.assign(qt.scales.size(), 0);
  const BlockPath path = block_path(kernel, L.desc);
  const auto rows = [&](int64_t t0, int64_t t1) {
    for_each_block(L, D, t0, t1, [&](int64_t t, int64_t d0, int64_t n, int64_t gi) {
      const float* x = X + t * D + d0;
      uint8_t* codes = qt.codes.data() + t * rb + d0 * L.code_bits / 8;
      uint8_t* sc = sb ? qt.scales.data() + gi * sb : nullptr;
      uint8_t* of = L.offsets ? qt.offsets.data() + gi * sb : nullptr;
      q::BlockStatus st;
#if LQ_HAVE_AVX2_KERNEL
      if (path.ggml) {  // quantize_block = block_params (its own statistics, in element order), then the codes
        const q::BlockParams p = q::block_params(L.desc, x, static_cast<int>(n), global, sc, of, st);
        encode_ggml_avx2(L.desc, p, x, static_cast<int>(n), codes);
      } else if (path.e2m1) {  // quantize_block = block_params, then encode_block_bytes (scaled_element, e2m1)
        const q::BlockParams p = q::block_params_amax(L.desc, q::f32_from_bits(abs_bits_max_avx2(x, n)), x,
                                                      static_cast<int>(n), global, sc, of, st);
        encode_e2m1_avx2(L.desc, p, x, static_cast<int>(n), codes);
      } else if (path.e4m3) {  // quantize_block = block_params, then encode_block_bytes (scaled_element, e4m3)
        // Fp8Tensor's parameters are the per-tensor scale alone (p.s = global), and p.amax is not read here:
        // its rows skip the block's max|x|.
        const float block_amax =
            L.desc.kind == q::BlockKind::Fp8Tensor ? 0.0f : q::f32_from_bits(abs_bits_max_avx2(x, n));
        const q::BlockParams p = q::block_params_amax(L.desc, block_amax, x, static_cast<int>(n), global, sc, of, st);
        const bool inv = q::scales_by_inverse(L.desc.kind);
        encode_e4m3_avx2(x, n, inv, inv ? p.inv : p.s, codes);
      } else
#endif
        st = q::quantize_block(L.desc, x, static_cast<int>(n), global, codes, sc, of);
      if (st.overflow)
        throw std::invalid_argument(
            overflow_message(spec, st.overflow_offset ? "offset" : "scale", st.raw, group_name(qt, gi)));
    });
  };
  split_ranges(T, kernel != CpuKernel::Reference && T * D >= kThreadMinElems ? g_threads.load() : 1, rows);
  if (amax >= kDecodeCheckAmax) check_decodable(qt, X);
}

void dequantize_blocks(const QuantizedTensor& qt, float* out, CpuKernel kernel) {
  const int64_t T = qt.rows, D = qt.cols, rb = qt.row_bytes();
  const Layout L = qt.layout();
  const int sb = L.scale_bytes;
  const float global = qt.global_scale();
  const BlockPath path = block_path(kernel, L.desc);
  const auto rows = [&](int64_t t0, int64_t t1) {
    for_each_block(L, D, t0, t1, [&](int64_t t, int64_t d0, int64_t n, int64_t gi) {
      const uint8_t* codes = qt.codes.data() + t * rb + d0 * L.code_bits / 8;
      const uint8_t* sc = sb ? qt.scales.data() + gi * sb : nullptr;
#if LQ_HAVE_AVX2_KERNEL
      if (path.e4m3) {
        decode_e4m3_avx2(codes, n, q::minifloat_block_multiplier(L.desc, sc, global), out + t * D + d0);
        return;
      }
      if (path.e2m1) {
        decode_e2m1_avx2(codes, static_cast<int>(n), q::minifloat_block_multiplier(L.desc, sc, global),
                         out + t * D + d0);
        return;
      }
#endif
      q::dequantize_block(L.desc, codes, sc, L.offsets ? qt.offsets.data() + gi * sb : nullptr, global,
                          static_cast<int>(n), out + t * D + d0);
    });
  };
  split_ranges(T, kernel != CpuKernel::Reference && T * D >= kThreadMinElems ? g_threads.load() : 1, rows);
}

}  // namespace latentq::cpu

// The public kernel selection (quantize.h), over the state above.
namespace latentq {

using cpu::cpu_has_avx2;
using cpu::g_kernel;
using cpu::g_stream_min;
using cpu::g_threads;
using cpu::kStreamMinBytes;

void set_cpu_kernel(CpuKernel k) {
  if (k == CpuKernel::Avx2 && !cpu_has_avx2())
    throw std::invalid_argument("set_cpu_kernel: this CPU or build has no AVX2 kernel");
  g_kernel.store(static_cast<int>(k));
}
CpuKernel active_cpu_kernel() {
  const auto k = static_cast<CpuKernel>(g_kernel.load());
  if (k != CpuKernel::Auto) return k;
  return cpu_has_avx2() ? CpuKernel::Avx2 : CpuKernel::Baseline;
}
std::vector<CpuKernel> available_cpu_kernels() {
  std::vector<CpuKernel> k{CpuKernel::Reference, CpuKernel::Baseline};
  if (cpu_has_avx2()) k.push_back(CpuKernel::Avx2);
  return k;
}
ScopedCpuKernel::ScopedCpuKernel(CpuKernel k) : previous_(g_kernel.load()) { set_cpu_kernel(k); }
ScopedCpuKernel::~ScopedCpuKernel() { g_kernel.store(previous_); }
void set_cpu_threads(int n) { g_threads.store(std::max(1, n)); }
void set_cpu_stream_min_bytes(int64_t n) { g_stream_min.store(n < 0 ? kStreamMinBytes : n); }
int cpu_threads() { return g_threads.load(); }

}  // namespace latentq
