// kernels/attention/attention.cu — DeviceAbsorbedAttention (latentq/attention_cuda.h): per segment two cuBLAS
// sgemm for the scores (c_kv, then k_pe accumulated), one softmax block per row, one sgemm for o_lat; then
// one strided-batched sgemm over the heads for out = o_lat·W_UVᵀ. error_terms(): one block per (row, head)
// for attention_error's terms against a kept reference (KL, top-8 keys, the output sums).
//
// cuBLAS is column-major: a row-major [m, n] matrix with row stride ld is, to cuBLAS, its transpose, a
// column-major [n, m] matrix with leading dimension ld. Each call below is written for the row-major
// product in its comment and passes the transposed (column-major) form Cᵀ = op(B)ᵀ·op(A)ᵀ.
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels.cuh"
#include "latentq/attention_cuda.h"
#include "latentq/gpu/device_buffer.h"
#include "latentq/quantize_cuda.h"

#if !defined(LQ_EMULATE)
#include <dlfcn.h>
#endif

#define LQ_CUBLAS_CHECK(expr) check_cublas((expr), #expr, __FILE__, __LINE__)

namespace latentq {
namespace {

// The cuBLAS entry points used here, resolved once with dlopen (kernels/CMakeLists.txt says why it is not
// linked): the library found at build time (LATENTQ_CUBLAS_PATH), else the loader's libcublas.so.<major>.
// The emulator links its stand-ins directly.
struct CublasApi {
  decltype(&cublasCreate) create = nullptr;
  decltype(&cublasDestroy) destroy = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasGetStatusName) status_name = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
  decltype(&cublasSgemm) sgemm = nullptr;
  decltype(&cublasSgemmStridedBatched) sgemm_strided_batched = nullptr;
  std::string error;  // why it is unusable; empty when loaded
};

const CublasApi& cublas() {
  static const CublasApi api = [] {
    CublasApi a;
#if defined(LQ_EMULATE)
    a.create = cublasCreate, a.destroy = cublasDestroy, a.set_math_mode = cublasSetMathMode;
    a.status_name = cublasGetStatusName, a.status_string = cublasGetStatusString;
    a.sgemm = cublasSgemm, a.sgemm_strided_batched = cublasSgemmStridedBatched;
#else
    void* h = dlopen(LATENTQ_CUBLAS_PATH, RTLD_NOW | RTLD_LOCAL);
    std::string tried = LATENTQ_CUBLAS_PATH;
    if (!h) {
      tried += std::string(" (") + dlerror() + "), " + LATENTQ_CUBLAS_SONAME;
      h = dlopen(LATENTQ_CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    }
    if (!h) {
      a.error = "cuBLAS could not be loaded: tried " + tried + " (" + dlerror() + ")";
      return a;
    }
    const auto sym = [&](auto& f, const char* name) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)> >(dlsym(h, name));
      if (!f && a.error.empty()) a.error = std::string("cuBLAS has no ") + name;
    };
    sym(a.create, "cublasCreate_v2");
    sym(a.destroy, "cublasDestroy_v2");
    sym(a.set_math_mode, "cublasSetMathMode");
    sym(a.status_name, "cublasGetStatusName");
    sym(a.status_string, "cublasGetStatusString");
    sym(a.sgemm, "cublasSgemm_v2");
    sym(a.sgemm_strided_batched, "cublasSgemmStridedBatched");
#endif
    return a;
  }();
  return api;
}

void check_cublas(cublasStatus_t s, const char* expr, const char* file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + expr +
                           " failed: " + cublas().status_name(s) + ": " + cublas().status_string(s));
}

constexpr int kSoftmaxThreads = 256;

// Block reduction (max for floats, or sum) of one value per thread through shared memory (a fixed tree: the
// same order every run).
template <bool Max, typename T>
__device__ T block_reduce(T v, T* sh) {
  const int t = static_cast<int>(threadIdx.x);
  sh[t] = v;
  __syncthreads();
  for (int s = kSoftmaxThreads / 2; s > 0; s >>= 1) {
    if (t < s) {
      if constexpr (Max)
        sh[t] = fmaxf(sh[t], sh[t + s]);
      else
        sh[t] = sh[t] + sh[t + s];
    }
    __syncthreads();
  }
  const T r = sh[0];
  __syncthreads();  // sh is reused by the next reduction
  return r;
}

// One block per row q of a segment's scores S [M, ld]: row q is sorted row p = q / H, which reads its first
// nkeys[p] keys. x ← softmax(x · scale) over them (max-subtracted, as the CPU's softmax_row), 0 past them.
__global__ void __launch_bounds__(kSoftmaxThreads)
    softmax_rows_kernel(float* S, int64_t ld, const int64_t* nkeys, int H, float scale) {
  __shared__ float sh[kSoftmaxThreads];
  const int64_t q = blockIdx.x;
  const int64_t n = nkeys[q / H];
  float* x = S + q * ld;
  const int t = static_cast<int>(threadIdx.x);
  float m = -INFINITY;
  for (int64_t j = t; j < n; j += kSoftmaxThreads) {
    const float v = x[j] * scale;
    x[j] = v;
    m = fmaxf(m, v);
  }
  m = block_reduce<true>(m, sh);
  float s = 0;
  for (int64_t j = t; j < n; j += kSoftmaxThreads) {
    const float e = expf(x[j] - m);
    x[j] = e;
    s += e;
  }
  s = block_reduce<false>(s, sh);
  for (int64_t j = t; j < n; j += kSoftmaxThreads) x[j] = x[j] / s;
  for (int64_t j = n + t; j < ld; j += kSoftmaxThreads) x[j] = 0;
}

// ---- attention_error's terms on the device ---------------------------------------------------------

constexpr int kTop = 8;  // top-8 agreement (probes::AttentionError::top8_agree); top-1 is its first entry

// The order of probes' top_m: larger value first, equal values by the lower key index.
__device__ __forceinline__ bool top_before(float va, int32_t ia, float vb, int32_t ib) {
  return va > vb || (va == vb && ia < ib);
}

// The top-kTop keys of x[0, n) in top_before order into idx[0, min(n, kTop)) (all threads of the block see
// them on return). Each thread keeps a sorted list of its strided keys (j = t, t + 256, ...), then the lists are
// merged pairwise in a fixed tree; the result is the same set and order as top_m for any finite x.
__device__ void block_top(const float* x, int64_t n, float (*sv)[kTop], int32_t (*si)[kTop], int* sn, int32_t* idx) {
  const int t = static_cast<int>(threadIdx.x);
  float lv[kTop];
  int32_t li[kTop];
  int ln = 0;
  for (int64_t j = t; j < n; j += kSoftmaxThreads) {
    const float v = x[j];
    const int32_t jj = static_cast<int32_t>(j);
    if (ln == kTop && !top_before(v, jj, lv[kTop - 1], li[kTop - 1])) continue;
    int pos = ln < kTop ? ln++ : kTop - 1;
    while (pos > 0 && top_before(v, jj, lv[pos - 1], li[pos - 1])) {
      lv[pos] = lv[pos - 1], li[pos] = li[pos - 1];
      --pos;
    }
    lv[pos] = v, li[pos] = jj;
  }
  for (int k = 0; k < ln; ++k) sv[t][k] = lv[k], si[t][k] = li[k];
  sn[t] = ln;
  __syncthreads();
  for (int s = kSoftmaxThreads / 2; s > 0; s >>= 1) {
    if (t < s) {
      const int na = sn[t], nb = sn[t + s];
      int a = 0, b = 0, k = 0;
      while (k < kTop && (a < na || b < nb)) {
        const bool take_a = b >= nb || (a < na && top_before(sv[t][a], si[t][a], sv[t + s][b], si[t + s][b]));
        if (take_a)
          lv[k] = sv[t][a], li[k] = si[t][a], ++a;
        else
          lv[k] = sv[t + s][b], li[k] = si[t + s][b], ++b;
        ++k;
      }
      for (int q = 0; q < k; ++q) sv[t][q] = lv[q], si[t][q] = li[q];
      sn[t] = k;
    }
    __syncthreads();
  }
  if (t == 0)
    for (int k = 0; k < sn[0]; ++k) idx[k] = si[0][k];
  __syncthreads();  // idx is visible to every thread; sv/si/sn may be reused by the next call
}

__device__ __forceinline__ bool not_finite(float x) { return !(fabsf(x) <= 3.402823466e38f); }

// ---- a cache mixed per (row, key) from two stores (run_mixed) ----------------------------------------

// What mix_kernel does with X [M, ld] and Y [M, ld] of a segment, per element (q, j), with in = key j of
// sorted row q / H is read from store A for the target the range names (ranges [rows, 4]: c_kv [r0, r1),
// k_pe [r2, r3), clipped to the row's keys).
enum MixOp : int {
  kPickA = 0,  // X ← in ? X : Y        (X: store A's partial scores, Y: store B's)
  kAddA = 1,   // X ← X + (in ? Y : 0)  (Y: store A's partial scores of the other target)
  kAddB = 2,   // X ← X + (in ? 0 : Y)  (Y: store B's)
  kKeepA = 3,  // Y ← in ? X : 0        (X: the probabilities; Y: the part read from A)
  kKeepB = 4,  // Y ← in ? 0 : X        (the part read from B)
};

__global__ void mix_kernel(float* X, float* Y, int64_t M, int64_t ld, const int64_t* ranges, int H, int target,
                           int op) {
  const int64_t n = M * ld;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t q = e / ld, j = e % ld;
    const int64_t* rg = ranges + (q / H) * 4 + 2 * target;
    const bool in = j >= rg[0] && j < rg[1];
    switch (op) {
      case kPickA:
        X[e] = in ? X[e] : Y[e];
        break;
      case kAddA:
        X[e] = in ? X[e] + Y[e] : X[e];
        break;
      case kAddB:
        X[e] = in ? X[e] : X[e] + Y[e];
        break;
      case kKeepA:
        Y[e] = in ? X[e] : 0.0f;
        break;
      default:
        Y[e] = in ? 0.0f : X[e];
        break;
    }
  }
}

// One block per row q of a segment's probabilities P [M, ld] (sorted row q / H reads nkeys[q / H] keys): its
// top-kTop key indices into top [M, kTop] (-1 past min(nkeys, kTop)).
__global__ void __launch_bounds__(kSoftmaxThreads)
    top_rows_kernel(const float* P, int64_t ld, const int64_t* nkeys, int H, int32_t* top) {
  __shared__ float sv[kSoftmaxThreads][kTop];
  __shared__ int32_t si[kSoftmaxThreads][kTop];
  __shared__ int sn[kSoftmaxThreads];
  __shared__ int32_t idx[kTop];
  const int64_t q = blockIdx.x;
  const int64_t n = nkeys[q / H];
  block_top(P + q * ld, n, sv, si, sn, idx);
  if (threadIdx.x == 0)
    for (int k = 0; k < kTop; ++k) top[q * kTop + k] = k < min(static_cast<int>(n), kTop) ? idx[k] : -1;
}

// One block per row q of a segment: the terms of pair q between the reference (P_ref, top_ref, out_ref) and the
// test (P, out): out rows [M, v] of the segment. The sums are float64 in a fixed tree (the same every run).
__global__ void __launch_bounds__(kSoftmaxThreads)
    error_terms_kernel(const float* P_ref, const float* P, int64_t ld, const int64_t* nkeys, int H,
                       const int32_t* top_ref, const float* out_ref, const float* out, int v, double kl_floor,
                       DeviceAttentionTerms* terms) {
  __shared__ float sv[kSoftmaxThreads][kTop];
  __shared__ int32_t si[kSoftmaxThreads][kTop];
  __shared__ int sn[kSoftmaxThreads];
  __shared__ int32_t idx[kTop];
  __shared__ double shd[kSoftmaxThreads];
  __shared__ int shi[kSoftmaxThreads];
  const int64_t q = blockIdx.x;
  const int64_t n = nkeys[q / H];
  const float* p = P_ref + q * ld;
  const float* ph = P + q * ld;
  const int t = static_cast<int>(threadIdx.x);
  double kl = 0;
  int bad_p = 0;
  for (int64_t j = t; j < n; j += kSoftmaxThreads) {
    const double pj = p[j];
    bad_p += not_finite(ph[j]) ? 1 : 0;
    if (pj > 0) kl += pj * log(pj / fmax(static_cast<double>(ph[j]), kl_floor));
  }
  double dot = 0, na = 0, nb = 0, e2 = 0;
  int diff = 0, bad_o = 0;
  for (int j = t; j < v; j += kSoftmaxThreads) {
    const float fa = out_ref[q * v + j], fb = out[q * v + j];
    const double a = fa, b = fb;
    dot += a * b, na += a * a, nb += b * b, e2 += (b - a) * (b - a);
    diff += fa != fb ? 1 : 0;
    bad_o += not_finite(fb) ? 1 : 0;
  }
  kl = block_reduce<false>(kl, shd);
  dot = block_reduce<false>(dot, shd);
  na = block_reduce<false>(na, shd);
  nb = block_reduce<false>(nb, shd);
  e2 = block_reduce<false>(e2, shd);
  diff = block_reduce<false>(diff, shi);
  bad_p = block_reduce<false>(bad_p, shi);
  bad_o = block_reduce<false>(bad_o, shi);
  block_top(ph, n, sv, si, sn, idx);
  if (t == 0) {
    const int m = min(static_cast<int>(n), kTop);
    const int32_t* r = top_ref + q * kTop;
    int common = 0;
    for (int a = 0; a < m; ++a)
      for (int b = 0; b < m; ++b) common += r[a] == idx[b] ? 1 : 0;
    DeviceAttentionTerms x;
    x.kl = kl, x.dot = dot, x.ref2 = na, x.test2 = nb, x.err2 = e2;
    x.equal = diff == 0 ? 1 : 0;
    x.top1 = m > 0 && r[0] == idx[0] ? 1 : 0;
    x.top_common = common;
    x.nonfinite_probs = bad_p, x.nonfinite_out = bad_o, x.pad = 0;
    terms[q] = x;
  }
}

// The key columns of a segment that some row reads from store A for one target, [a_lo, a_hi), and from store
// B, b[0..nb) (a row reads B on [0, begin) and [end, n) of its range, all of [0, n) when it is empty); as the
// CPU's run_impl per chunk. Outside A's columns every row reads B, and inside [b_lo, b_hi) every row reads A,
// so the GEMMs of each store run on its columns only (a decode order reads B on its sink and residual window).
struct StoreColumns {
  int64_t a_lo, a_hi;
  int64_t b[2][2];
  int nb;
};

StoreColumns store_columns(const int64_t* ranges, const std::vector<int64_t>& nkeys, int64_t begin, int64_t end,
                           int64_t nk, int target) {
  int64_t a_lo = nk, a_hi = 0, b_lo = 0, b_hi = nk;
  for (int64_t p = begin; p < end; ++p) {
    const int64_t rb = ranges[p * 4 + 2 * target], re = ranges[p * 4 + 2 * target + 1], n = nkeys[p];
    const bool some = re > rb;
    if (some) a_lo = std::min(a_lo, rb), a_hi = std::max(a_hi, re);
    b_lo = std::max(b_lo, some ? rb : n);
    b_hi = std::min(b_hi, some ? re : n);
  }
  StoreColumns c{a_lo, a_hi, {{0, 0}, {0, 0}}, 0};
  if (b_lo >= b_hi) {
    c.b[c.nb][0] = 0, c.b[c.nb][1] = nk, ++c.nb;
  } else {
    if (b_lo > 0) c.b[c.nb][0] = 0, c.b[c.nb][1] = b_lo, ++c.nb;
    if (b_hi < nk) c.b[c.nb][0] = b_hi, c.b[c.nb][1] = nk, ++c.nb;
  }
  return c;
}

int cublas_int(int64_t n, const char* what) {
  if (n < 0 || n > std::numeric_limits<int>::max())
    throw std::invalid_argument(std::string("DeviceAbsorbedAttention: ") + what + " " + std::to_string(n) +
                                " exceeds the cuBLAS integer (2^31 - 1)");
  return static_cast<int>(n);
}

}  // namespace

struct DeviceAbsorbedAttention::Impl {
  int64_t H = 0, r = 0, rope = 0, v = 0, T = 0, Tq = 0;
  std::vector<int64_t> nkeys;  // [Tq] by sorted row (host copy: run_mixed's column bounds)
  float scale = 0;
  std::vector<DeviceAttentionSegment> segments;
  std::vector<int64_t> s_offset;                     // [segments + 1] start of each segment's scores in d_S
  gpu::DeviceBuffer<float> d_q_lat, d_q_pe, d_w_uv;  // [Tq·H, r], [Tq·H, rope], [H·v, r]
  gpu::DeviceBuffer<int64_t> d_nkeys;                // [Tq]
  gpu::DeviceBuffer<float> d_c_kv, d_k_pe;           // [T, r], [T, rope]
  gpu::DeviceBuffer<float> d_S;                      // Σ (end − begin)·H × nk
  gpu::DeviceBuffer<float> d_o_lat, d_out;           // [Tq·H, r], [Tq·H·v]
  // The kept reference (keep_reference): its probabilities (as d_S), outputs and top keys [Tq·H, kTop].
  gpu::DeviceBuffer<float> d_S_ref, d_out_ref;
  gpu::DeviceBuffer<int32_t> d_top_ref;
  gpu::DeviceBuffer<DeviceAttentionTerms> d_terms;  // [Tq·H]
  bool has_ref = false;
  // run_mixed's store B and the rows' ranges: [T, r], [T, rope], [Tq, 4]; a second scores buffer (as d_S).
  gpu::DeviceBuffer<float> d_c_kv_b, d_k_pe_b, d_S2;
  gpu::DeviceBuffer<int64_t> d_ranges;
  cublasHandle_t handle = nullptr;

  void compute(const float* c_kv, const float* k_pe, const DeviceMixedStores* mixed);
  void mix(float* X, float* Y, int64_t M, int64_t ld, const int64_t* ranges, int target, int op);  // op: a MixOp

  ~Impl() {
    if (handle) cublas().destroy(handle);
  }
};

DeviceAbsorbedAttention::DeviceAbsorbedAttention(int64_t num_heads, int64_t kv_lora_rank, int64_t qk_rope_head_dim,
                                                 int64_t v_head_dim, int64_t num_tokens, float softmax_scale,
                                                 std::span<const int64_t> nkeys,
                                                 std::span<const DeviceAttentionSegment> segments, const float* q_lat,
                                                 const float* q_pe, const float* w_uv)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.H = num_heads, m.r = kv_lora_rank, m.rope = qk_rope_head_dim, m.v = v_head_dim, m.T = num_tokens;
  m.Tq = static_cast<int64_t>(nkeys.size());
  m.scale = softmax_scale;
  const auto bad = [](const std::string& what) { throw std::invalid_argument("DeviceAbsorbedAttention: " + what); };
  if (m.H < 1 || m.r < 1 || m.rope < 0 || m.v < 1 || m.T < 1 || m.Tq < 1)
    bad("bad dims (num_heads " + std::to_string(m.H) + ", kv_lora_rank " + std::to_string(m.r) + ", qk_rope_head_dim " +
        std::to_string(m.rope) + ", v_head_dim " + std::to_string(m.v) + ", T " + std::to_string(m.T) + ", Tq " +
        std::to_string(m.Tq) + ")");
  m.segments.assign(segments.begin(), segments.end());
  m.s_offset.assign(1, 0);
  int64_t next = 0;
  for (size_t g = 0; g < m.segments.size(); ++g) {
    const DeviceAttentionSegment& s = m.segments[g];
    if (s.begin != next || s.end <= s.begin || s.end > m.Tq || s.key_begin < 0 || s.nk < 1 || s.key_begin + s.nk > m.T)
      bad("segment " + std::to_string(g) + " [" + std::to_string(s.begin) + ", " + std::to_string(s.end) + ") keys [" +
          std::to_string(s.key_begin) + ", " + std::to_string(s.key_begin + s.nk) + ") does not continue at row " +
          std::to_string(next) + " within Tq = " + std::to_string(m.Tq) + " and T = " + std::to_string(m.T));
    for (int64_t p = s.begin; p < s.end; ++p)
      if (nkeys[p] < 1 || nkeys[p] > s.nk)
        bad("nkeys[" + std::to_string(p) + "] = " + std::to_string(nkeys[p]) + " outside [1, " + std::to_string(s.nk) +
            "] (its segment's keys)");
    cublas_int((s.end - s.begin) * m.H, "segment rows");
    cublas_int(s.nk, "segment keys");
    m.s_offset.push_back(m.s_offset.back() + (s.end - s.begin) * m.H * s.nk);
    next = s.end;
  }
  if (next != m.Tq)
    bad("the segments cover rows [0, " + std::to_string(next) + "), not [0, Tq = " + std::to_string(m.Tq) + ")");
  cublas_int(m.Tq * m.H * std::max(m.r, m.v), "rows × heads × dims");

  m.d_q_lat.upload(q_lat, static_cast<size_t>(m.Tq * m.H * m.r), nullptr, "q_lat");
  if (m.rope > 0) m.d_q_pe.upload(q_pe, static_cast<size_t>(m.Tq * m.H * m.rope), nullptr, "q_pe");
  m.d_w_uv.upload(w_uv, static_cast<size_t>(m.H * m.v * m.r), nullptr, "W_UV");
  m.d_nkeys.upload(nkeys.data(), nkeys.size(), nullptr, "nkeys");
  m.nkeys.assign(nkeys.begin(), nkeys.end());
  m.d_S.resize(static_cast<size_t>(m.s_offset.back()), "attention scores");
  m.d_o_lat.resize(static_cast<size_t>(m.Tq * m.H * m.r), "o_lat");
  m.d_out.resize(static_cast<size_t>(m.Tq * m.H * m.v), "attention output");
  if (!cublas().error.empty()) throw std::runtime_error("DeviceAbsorbedAttention: " + cublas().error);
  LQ_CUBLAS_CHECK(cublas().create(&m.handle));
  LQ_CUBLAS_CHECK(cublas().set_math_mode(m.handle, CUBLAS_PEDANTIC_MATH));
  LQ_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

DeviceAbsorbedAttention::~DeviceAbsorbedAttention() = default;

bool cuda_attention_available(std::string* why) {
  std::string reason;  // cuBLAS first: loading it needs no GPU
  if (!cublas().error.empty()) {
    reason = cublas().error;
  } else if (!cuda_device_available(&reason)) {
    reason = "no CUDA device: " + reason;
  } else {
    return true;
  }
  if (why) *why = reason;
  return false;
}

int64_t DeviceAbsorbedAttention::probs_size() const { return impl_->s_offset.back(); }

void DeviceAbsorbedAttention::Impl::mix(float* X, float* Y, int64_t M, int64_t ld, const int64_t* ranges, int target,
                                        int op) {
  const int64_t n = M * ld;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, int64_t{1} << 20));
  LQ_LAUNCH(mix_kernel, dim3(blocks), dim3(256), 0, nullptr, X, Y, M, ld, ranges, static_cast<int>(H), target, op);
  LQ_CUDA_CHECK(cudaGetLastError());
}

// Uploads one cache (mixed: two stores and the rows' ranges) and evaluates it into d_S (probabilities) and
// d_out. Mixed, per segment: S = Q·C_Aᵀ, S2 = Q·C_Bᵀ, S ← pick by the c_kv ranges; S2 = q_pe·K_Aᵀ, S += S2 on
// the k_pe ranges, S2 = q_pe·K_Bᵀ, S += S2 off them (one addition per element, as the CPU's S + SA); softmax;
// o_lat = (P on the c_kv ranges)·C_A + (P off them)·C_B.
void DeviceAbsorbedAttention::Impl::compute(const float* c_kv, const float* k_pe, const DeviceMixedStores* mixed) {
  Impl& m = *this;
  const int H = static_cast<int>(m.H), r = static_cast<int>(m.r), rope = static_cast<int>(m.rope),
            v = static_cast<int>(m.v), Tq = static_cast<int>(m.Tq);
  m.d_c_kv.upload(c_kv, static_cast<size_t>(m.T * m.r), nullptr, "c_kv");
  if (rope > 0) m.d_k_pe.upload(k_pe, static_cast<size_t>(m.T * m.rope), nullptr, "k_pe");
  if (mixed) {
    m.d_c_kv_b.upload(mixed->c_kv_b, static_cast<size_t>(m.T * m.r), nullptr, "c_kv (store B)");
    if (rope > 0) m.d_k_pe_b.upload(mixed->k_pe_b, static_cast<size_t>(m.T * m.rope), nullptr, "k_pe (store B)");
    m.d_ranges.upload(mixed->ranges, static_cast<size_t>(m.Tq * 4), nullptr, "key ranges");
    m.d_S2.resize(m.d_S.size(), "attention scores (store B)");
  }
  const float one = 1, zero = 0;
  for (size_t g = 0; g < m.segments.size(); ++g) {
    const DeviceAttentionSegment& s = m.segments[g];
    const int M = static_cast<int>((s.end - s.begin) * m.H), nk = static_cast<int>(s.nk);
    float* S = m.d_S.data() + m.s_offset[g];
    float* S2 = mixed ? m.d_S2.data() + m.s_offset[g] : nullptr;
    const int64_t* ranges = mixed ? m.d_ranges.data() + s.begin * 4 : nullptr;
    const float* Q = m.d_q_lat.data() + s.begin * m.H * m.r;
    const float* Qp = m.d_q_pe.data() + s.begin * m.H * m.rope;
    const float* C = m.d_c_kv.data() + s.key_begin * m.r;
    const float* K = m.d_k_pe.data() + s.key_begin * m.rope;
    const float* CB = mixed ? m.d_c_kv_b.data() + s.key_begin * m.r : nullptr;
    const float* KB = mixed ? m.d_k_pe_b.data() + s.key_begin * m.rope : nullptr;
    // Row-major S [M, nk] = Q [M, r] · C[keys j0 .. j1) [.., r]ᵀ on columns [j0, j1) (column-major: the rows j0 ..
    // j1 of Sᵀ [nk, M] = C·Qᵀ); likewise q_pe·k_peᵀ; and O [M, r] (+)= P[:, j0 .. j1) · C[keys j0 .. j1).
    const auto scores = [&](const float* store, int64_t d, const float* Qx, float* dst, int64_t j0, int64_t j1,
                            const float* beta) {
      if (j1 > j0)
        LQ_CUBLAS_CHECK(cublas().sgemm(m.handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(j1 - j0), M,
                                       static_cast<int>(d), &one, store + j0 * d, static_cast<int>(d), Qx,
                                       static_cast<int>(d), beta, dst + j0, nk));
    };
    float* O = m.d_o_lat.data() + s.begin * m.H * m.r;
    bool o_set = false;  // O written by a first product (beta 0), then accumulated
    const auto output = [&](const float* store, const float* P, int64_t j0, int64_t j1) {
      if (j1 <= j0) return;
      LQ_CUBLAS_CHECK(cublas().sgemm(m.handle, CUBLAS_OP_N, CUBLAS_OP_N, r, M, static_cast<int>(j1 - j0), &one,
                                     store + j0 * m.r, r, P + j0, nk, o_set ? &one : &zero, O, r));
      o_set = true;
    };
    // The c_kv columns of each store (mixed), for the score and the output products alike.
    const StoreColumns cc = mixed ? store_columns(mixed->ranges, m.nkeys, s.begin, s.end, nk, 0) : StoreColumns{};
    if (!mixed) {
      scores(C, m.r, Q, S, 0, nk, &zero);
      if (rope > 0) scores(K, m.rope, Qp, S, 0, nk, &one);  // S += q_pe·k_peᵀ
    } else {
      scores(C, m.r, Q, S, cc.a_lo, cc.a_hi, &zero);
      for (int k = 0; k < cc.nb; ++k) scores(CB, m.r, Q, S2, cc.b[k][0], cc.b[k][1], &zero);
      m.mix(S, S2, M, nk, ranges, 0, kPickA);
      if (rope > 0) {
        // S2 = q_pe·k_peᵀ of each store in turn on its columns, added where the ranges read it
        const StoreColumns ck = store_columns(mixed->ranges, m.nkeys, s.begin, s.end, nk, 1);
        scores(K, m.rope, Qp, S2, ck.a_lo, ck.a_hi, &zero);
        m.mix(S, S2, M, nk, ranges, 1, kAddA);
        for (int k = 0; k < ck.nb; ++k) scores(KB, m.rope, Qp, S2, ck.b[k][0], ck.b[k][1], &zero);
        m.mix(S, S2, M, nk, ranges, 1, kAddB);
      }
    }
    LQ_LAUNCH(softmax_rows_kernel, dim3(static_cast<unsigned>(M)), dim3(kSoftmaxThreads), 0, nullptr, S,
              static_cast<int64_t>(nk), m.d_nkeys.data() + s.begin, H, m.scale);
    LQ_CUDA_CHECK(cudaGetLastError());
    if (!mixed) {
      output(C, S, 0, nk);  // o_lat [M, r] = P [M, nk] · C[keys] [nk, r]
    } else {
      // o_lat = P_A · C_A + P_B · C_B, P_A / P_B the probabilities on / off the c_kv ranges (S stays whole),
      // each product on its store's columns (P_A is 0 outside A's, P_B inside [b_lo, b_hi))
      m.mix(S, S2, M, nk, ranges, 0, kKeepA);
      output(C, S2, cc.a_lo, cc.a_hi);
      m.mix(S, S2, M, nk, ranges, 0, kKeepB);
      for (int k = 0; k < cc.nb; ++k) output(CB, S2, cc.b[k][0], cc.b[k][1]);
    }
    if (!o_set) LQ_CUDA_CHECK(cudaMemsetAsync(O, 0, static_cast<size_t>(M) * m.r * sizeof(float), nullptr));
  }
  // out[p, h, :] = o_lat[p·H + h, :] · W_UV[h]ᵀ, per head h ([Tq, r] with row stride H·r, times [v, r]ᵀ into
  // [Tq, v] with row stride H·v); column-major per head: outᵀ [v, Tq] = W_UV[h] (col-major [r, v], op T) · o_latᵀ.
  LQ_CUBLAS_CHECK(cublas().sgemm_strided_batched(m.handle, CUBLAS_OP_T, CUBLAS_OP_N, v, Tq, r, &one, m.d_w_uv.data(), r,
                                                 static_cast<long long>(m.v) * m.r, m.d_o_lat.data(), H * r,
                                                 static_cast<long long>(m.r), &zero, m.d_out.data(), H * v,
                                                 static_cast<long long>(m.v), H));
}

void DeviceAbsorbedAttention::run(const float* c_kv, const float* k_pe, float* out_sorted, float* probs) const {
  std::lock_guard<std::mutex> lock(mu_);
  Impl& m = *impl_;
  m.compute(c_kv, k_pe, nullptr);
  m.d_out.download(out_sorted, nullptr);
  if (probs) m.d_S.download(probs, nullptr);
}

void DeviceAbsorbedAttention::run_mixed(const float* c_kv_a, const float* k_pe_a, const DeviceMixedStores& b,
                                        float* out_sorted, float* probs) const {
  std::lock_guard<std::mutex> lock(mu_);
  Impl& m = *impl_;
  m.compute(c_kv_a, k_pe_a, &b);
  m.d_out.download(out_sorted, nullptr);
  if (probs) m.d_S.download(probs, nullptr);
}

void DeviceAbsorbedAttention::keep_reference(const float* c_kv, const float* k_pe, float* out_sorted) const {
  std::lock_guard<std::mutex> lock(mu_);
  Impl& m = *impl_;
  m.has_ref = false;
  m.compute(c_kv, k_pe, nullptr);
  m.d_S_ref.resize(m.d_S.size(), "reference probabilities");
  m.d_out_ref.resize(m.d_out.size(), "reference output");
  m.d_top_ref.resize(static_cast<size_t>(m.Tq * m.H * kTop), "reference top keys");
  LQ_CUDA_CHECK(cudaMemcpyAsync(m.d_S_ref.data(), m.d_S.data(), m.d_S.bytes(), cudaMemcpyDeviceToDevice, nullptr));
  LQ_CUDA_CHECK(
      cudaMemcpyAsync(m.d_out_ref.data(), m.d_out.data(), m.d_out.bytes(), cudaMemcpyDeviceToDevice, nullptr));
  for (size_t g = 0; g < m.segments.size(); ++g) {
    const DeviceAttentionSegment& s = m.segments[g];
    LQ_LAUNCH(top_rows_kernel, dim3(static_cast<unsigned>((s.end - s.begin) * m.H)), dim3(kSoftmaxThreads), 0, nullptr,
              m.d_S_ref.data() + m.s_offset[g], static_cast<int64_t>(s.nk), m.d_nkeys.data() + s.begin,
              static_cast<int>(m.H), m.d_top_ref.data() + s.begin * m.H * kTop);
    LQ_CUDA_CHECK(cudaGetLastError());
  }
  m.d_out.download(out_sorted, nullptr);
  m.has_ref = true;
}

bool DeviceAbsorbedAttention::has_reference() const {
  std::lock_guard<std::mutex> lock(mu_);
  return impl_->has_ref;
}

void DeviceAbsorbedAttention::error_terms(const float* c_kv, const float* k_pe, const DeviceMixedStores* mixed,
                                          double kl_floor, DeviceAttentionTerms* terms) const {
  std::lock_guard<std::mutex> lock(mu_);
  Impl& m = *impl_;
  if (!m.has_ref) throw std::logic_error("DeviceAbsorbedAttention::error_terms: no reference kept (keep_reference)");
  m.compute(c_kv, k_pe, mixed);
  m.d_terms.resize(static_cast<size_t>(m.Tq * m.H), "attention error terms");
  for (size_t g = 0; g < m.segments.size(); ++g) {
    const DeviceAttentionSegment& s = m.segments[g];
    const int64_t row0 = s.begin * m.H;  // the segment's first pair
    LQ_LAUNCH(error_terms_kernel, dim3(static_cast<unsigned>((s.end - s.begin) * m.H)), dim3(kSoftmaxThreads), 0,
              nullptr, m.d_S_ref.data() + m.s_offset[g], m.d_S.data() + m.s_offset[g], static_cast<int64_t>(s.nk),
              m.d_nkeys.data() + s.begin, static_cast<int>(m.H), m.d_top_ref.data() + row0 * kTop,
              m.d_out_ref.data() + row0 * m.v, m.d_out.data() + row0 * m.v, static_cast<int>(m.v), kl_floor,
              m.d_terms.data() + row0);
    LQ_CUDA_CHECK(cudaGetLastError());
  }
  m.d_terms.download(terms, nullptr);
}

}  // namespace latentq
