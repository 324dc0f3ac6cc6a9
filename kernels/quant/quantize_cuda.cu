// kernels/quant/quantize_cuda.cu — host side of the CUDA quantizer: validation, launch plans, the
// per-format launch sequence, the device status read-back (NaN/Inf, scale overflow) and the host
// convenience wrappers. See latentq/quantize_cuda.h for the API and kernels/README.md for the design.
#include <algorithm>
#include <cstring>
#include <string>

#include "kernels.cuh"
#include "latentq/transform.h"
#include "latentq/turboquant.h"
#include "latentq/lloyd_max.h"
#include "latentq/transform_coding.h"
#include "latentq/quantize_cuda.h"

namespace latentq {
namespace gd = gpu::detail;
namespace {

// Bytes of the scales buffer (and of the offsets buffer when the layout has offsets), as quantize.h
// lays them out: from the format descriptor (latentq::layout).
int64_t scales_len(const QuantizedTensor& h) {
  const QuantSpec& s = h.spec;
  if (s.format == Format::BF16) return 0;
  const Layout L = h.layout();
  if (s.format == Format::Int && s.granularity == Granularity::Tensor) return qmath::scale_dtype_bytes(s.scale_dtype);
  if (L.channel) return (static_cast<int64_t>(h.group_bounds.size()) - 1) * h.cols * L.scale_bytes;
  return h.rows * L.blocks_per_row * L.scale_bytes;
}
bool is_asym(const QuantSpec& s) {
  return (s.format == Format::Int && s.scheme == Scheme::Asym) || s.format == Format::Q4_1;
}

std::string shape(int64_t T, int64_t D) {
  std::string s("[");
  s.append(std::to_string(T)).append(", ").append(std::to_string(D)).append("]");
  return s;
}

// Same checks and messages as latentq::quantize, plus the kernels' limits.
void check_shape(int64_t T, int64_t D) {
  if (T <= 0 || D <= 0) throw std::invalid_argument("cannot quantize an empty matrix " + shape(T, D));
  if (D > gpu::kMaxCols)
    throw std::invalid_argument("the CUDA quantizer supports at most " + std::to_string(gpu::kMaxCols) +
                                " columns (D), got a " + shape(T, D) + " matrix; use the CPU reference");
  if (T > gpu::kMaxRows)
    throw std::invalid_argument("the CUDA quantizer supports at most " + std::to_string(gpu::kMaxRows) +
                                " rows (T), got a " + shape(T, D) + " matrix; use the CPU reference");
}

// NaN/Inf count of d_x [n] with the workspace's CUB storage; synchronizes the stream.
unsigned long long count_nonfinite_ws(gpu::Workspace& ws, const float* d_x, int64_t n, cudaStream_t stream) {
  size_t temp = 0;
  LQ_CUDA_CHECK(gd::nonfinite_count(nullptr, temp, d_x, n, nullptr, stream));
  ws.cub_temp.resize(std::max<size_t>(temp, 1), "CUB temporary storage");
  ws.count.resize(1, "NaN/Inf count");
  LQ_CUDA_CHECK(gd::nonfinite_count(ws.cub_temp.data(), temp, d_x, n, ws.count.data(), stream));
  unsigned long long bad = 0;
  LQ_CUDA_CHECK(cudaMemcpyAsync(&bad, ws.count.data(), sizeof bad, cudaMemcpyDeviceToHost, stream));
  LQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  return bad;
}

// Throws the CPU reference's NaN/Inf error (nonfinite_message) when d_x [T, D] holds a NaN/Inf.
void throw_if_nonfinite(gpu::Workspace& ws, const float* d_x, int64_t T, int64_t D, cudaStream_t stream) {
  if (const unsigned long long bad = count_nonfinite_ws(ws, d_x, T * D, stream))
    throw std::invalid_argument(nonfinite_message(static_cast<int64_t>(bad), T, D));
}

// Channel launch plan, cached by (T, group_size, seq_offsets). Returns true if it changed.
// Throws std::invalid_argument for bad seq_offsets (channel_groups, the CPU's function).
bool plan_channel(gpu::Workspace& ws, int64_t T, int64_t group, std::span<const int64_t> seq, cudaStream_t stream) {
  if (ws.plan_valid && ws.plan_T == T && ws.plan_group == group &&
      std::equal(seq.begin(), seq.end(), ws.plan_seq.begin(), ws.plan_seq.end()))
    return false;
  ws.plan_valid = false;
  ws.bounds = channel_groups(seq, T, group);
  ws.fused = gpu::max_group_len(ws.bounds) <= gpu::kChannelFusedTokens;
  const std::vector<gpu::ChunkDesc> enc = gpu::split_groups(ws.bounds, gpu::kChannelFusedTokens);
  ws.enc_chunks.upload(enc.data(), enc.size(), stream, "channel encode chunks");
  if (!ws.fused) {
    std::vector<int64_t> begin;
    const std::vector<gpu::ChunkDesc> st = gpu::split_groups(ws.bounds, gpu::kChannelStatTokens, &begin);
    ws.stat_chunks.upload(st.data(), st.size(), stream, "channel statistics chunks");
    ws.stat_begin.upload(begin.data(), begin.size(), stream, "channel statistics chunk offsets");
  }
  ws.plan_T = T;
  ws.plan_group = group;
  ws.plan_seq.assign(seq.begin(), seq.end());
  ws.plan_valid = true;
  return true;
}

gd::RowsArgs rows_args(const float* x, int64_t T, int64_t D, int64_t rb, int64_t g, int64_t nt, bool tensor, bool asym,
                       ScaleDtype sd, DeviceQuantized& out, gpu::DeviceStatus* st) {
  constexpr int64_t kSmemTarget = 24 * 1024;  // ~8 blocks of 256 threads per SM
  gd::RowsArgs a{};
  a.x = x;
  a.T = T;
  a.D = static_cast<int>(D);
  a.rb = static_cast<int>(rb);
  a.g = static_cast<int>(g);
  a.nt = static_cast<int>(nt);
  const int64_t per_row = static_cast<int64_t>(gd::rows_smem_bytes(1, a.D, a.nt, asym));
  a.R = static_cast<int>(std::clamp<int64_t>(kSmemTarget / per_row, 1, 64));
  a.nq = static_cast<int>((D + 3) / 4);
  a.div_nq = gpu::FastDiv(a.nq);
  a.div_g = gpu::FastDiv(a.g);
  a.div_nt = gpu::FastDiv(a.nt);
  a.tensor = tensor;
  a.vec = (reinterpret_cast<uintptr_t>(x) & 15) == 0 && D % 4 == 0;
  a.sd = sd;
  a.codes = out.codes.data();
  a.scales = out.scales.data();
  a.offsets = out.offsets.data();
  a.st = st;
  return a;
}

// The float32 (unrounded) scale or offset of integer group gi, recomputed on the host from the
// group's elements with the CPU reference's fold; only for the overflow message.
float raw_group_param(const DeviceQuantized& out, const float* d_x, int64_t gi, bool offset, cudaStream_t stream) {
  const QuantSpec& st = out.spec;
  const int64_t D = out.cols;
  std::vector<float> x;
  switch (st.granularity) {
    case Granularity::Tensor: {
      gpu::TensorStats s{};
      LQ_CUDA_CHECK(cudaMemcpyAsync(&s, out.ws.tensor_stats.data(), sizeof s, cudaMemcpyDeviceToHost, stream));
      LQ_CUDA_CHECK(cudaStreamSynchronize(stream));
      x = {s.mn, s.mx};
      break;
    }
    case Granularity::Token: {
      const QuantizedTensor h = out.header();
      const int64_t nt = h.scales_per_row(), g = h.row_group();
      const int64_t t = gi / nt, d0 = (gi % nt) * g, d1 = std::min(D, d0 + g);
      x.resize(static_cast<size_t>(d1 - d0));
      LQ_CUDA_CHECK(cudaMemcpy(x.data(), d_x + t * D + d0, x.size() * sizeof(float), cudaMemcpyDeviceToHost));
      break;
    }
    case Granularity::Channel: {
      const int64_t g = gi / D, d = gi % D;
      const int64_t t0 = out.group_bounds[static_cast<size_t>(g)], t1 = out.group_bounds[static_cast<size_t>(g) + 1];
      x.resize(static_cast<size_t>(t1 - t0));  // column d of rows [t0, t1)
      LQ_CUDA_CHECK(cudaMemcpy2D(x.data(), sizeof(float), d_x + t0 * D + d, static_cast<size_t>(D) * sizeof(float),
                                 sizeof(float), x.size(), cudaMemcpyDeviceToHost));
      break;
    }
  }
  float mn = x[0], mx = x[0];
  for (const float v : x) {
    mn = qmath::min_num(mn, v);
    mx = qmath::max_num(mx, v);
  }
  const qmath::ScaleOffset p =
      st.scheme == Scheme::Sym
          ? qmath::sym_params(qmath::max_num(qmath::abs_f(mn), qmath::abs_f(mx)), st.bits, ScaleDtype::F32)
          : qmath::asym_params(mn, mx, st.bits, ScaleDtype::F32);
  return offset ? p.offset : p.scale;
}

// max|x| over the finite elements of d_x [n] (block formats with a per-tensor scale), into the
// status word amax_bits (zeroed by the caller); synchronizes the stream.
float block_amax(gpu::DeviceStatus* status, const float* d_x, int64_t n, cudaStream_t stream) {
  LQ_CUDA_CHECK(gd::launch_block_amax(d_x, n, &status->amax_bits, stream));
  unsigned long long bits = 0;
  LQ_CUDA_CHECK(cudaMemcpyAsync(&bits, &status->amax_bits, sizeof bits, cudaMemcpyDeviceToHost, stream));
  LQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  return qmath::f32_from_bits(static_cast<uint32_t>(bits));
}

// Reads the device status (synchronizing the stream) and throws as the CPU reference would;
// returns the status (block formats: max|x| in amax_bits).
gpu::DeviceStatus finish(const DeviceQuantized& out, const float* d_x, cudaStream_t stream) {
  gpu::DeviceStatus h{};
  LQ_CUDA_CHECK(cudaMemcpyAsync(&h, out.ws.status.data(), sizeof h, cudaMemcpyDeviceToHost, stream));
  LQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (h.nonfinite)
    throw std::invalid_argument(nonfinite_message(static_cast<int64_t>(h.nonfinite), out.rows, out.cols));
  if (h.overflow_key == gpu::kNoOverflow) return h;
  const int64_t gi = static_cast<int64_t>(h.overflow_key >> 1);
  const bool offset = (h.overflow_key & 1) != 0;
  const QuantizedTensor hdr = out.header();
  if (out.spec.format == Format::BF16) {  // an element whose bf16 rounding overflowed: key 2·(flat index)
    float raw = 0.0f;
    LQ_CUDA_CHECK(cudaMemcpy(&raw, d_x + gi, sizeof raw, cudaMemcpyDeviceToHost));
    throw std::invalid_argument(
        overflow_message(out.spec, "value", raw,
                         "token " + std::to_string(gi / out.cols) + ", dimension " + std::to_string(gi % out.cols)));
  }
  const Layout L = hdr.layout();
  float raw;
  if (L.block_format) {  // the block quantizer, rerun on the host on the block's elements, gives the raw value
    const int64_t t = gi / L.blocks_per_row, d0 = (gi % L.blocks_per_row) * L.block;
    const int n = static_cast<int>(std::min(out.cols, d0 + L.block) - d0);
    std::vector<float> x(static_cast<size_t>(n));
    LQ_CUDA_CHECK(cudaMemcpy(x.data(), d_x + t * out.cols + d0, x.size() * sizeof(float), cudaMemcpyDeviceToHost));
    std::vector<uint8_t> codes(static_cast<size_t>(L.row_code_bytes)), sc(4), of(4);
    raw = qmath::quantize_block(L.desc, x.data(), n, hdr.global_scale(), codes.data(), sc.data(), of.data()).raw;
  } else {
    raw = raw_group_param(out, d_x, gi, offset, stream);
  }
  throw std::invalid_argument(overflow_message(out.spec, offset ? "offset" : "scale", raw, group_name(hdr, gi)));
}

// TurboQuant (turboquant.h): NaN/Inf first (the CPU reference's first error), the fp16 row norms and unit rows,
// the Hadamard in place, the code bytes; an fp16 norm that overflowed is found in the norms read back and
// reported with its float32 value, as the CPU reference does.
void quantize_tq(DeviceQuantized& out, const float* d_x, int64_t T, int64_t D, int64_t rb, cudaStream_t stream) {
  gpu::Workspace& ws = out.ws;
  throw_if_nonfinite(ws, d_x, T, D, stream);
  const qmath::TqCodebook& cb = tq_codebook(D, out.spec.bits);
  ws.tq_rotated.resize(static_cast<size_t>(T * D), "TurboQuant rotated rows");
  LQ_CUDA_CHECK(gd::launch_tq_normalize(d_x, T, static_cast<int>(D), ws.tq_rotated.data(), out.scales.data(), stream));
  hadamard_rows_device(ws.tq_rotated.data(), T, D, hadamard_block(D, 0), nullptr, false, stream);
  LQ_CUDA_CHECK(gd::launch_tq_encode(ws.tq_rotated.data(), T, static_cast<int>(D), static_cast<int>(rb), cb,
                                     out.codes.data(), stream));
  std::vector<uint8_t> norms(static_cast<size_t>(2 * T));
  LQ_CUDA_CHECK(cudaMemcpyAsync(norms.data(), out.scales.data(), norms.size(), cudaMemcpyDeviceToHost, stream));
  LQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (int64_t t = 0; t < T; ++t)
    if (!qmath::is_finite(qmath::load_dtype(norms.data() + 2 * t, ScaleDtype::F16))) {
      std::vector<float> x(static_cast<size_t>(D));
      LQ_CUDA_CHECK(cudaMemcpy(x.data(), d_x + t * D, x.size() * sizeof(float), cudaMemcpyDeviceToHost));
      throw std::invalid_argument(overflow_message(out.spec, "scale", qmath::tq_row_norm(x.data(), static_cast<int>(D)),
                                                   "token " + std::to_string(t)) +
                                  " (the row norm)");
    }
}

// The fitted formats' host copy of d_x [T, D] (row-major float32, device), after throw_if_nonfinite: their
// per-matrix tables are fitted on the host by the CPU quantizer's own fit, so the device encode uses the same.
std::vector<float> finite_host_copy(gpu::Workspace& ws, const float* d_x, int64_t T, int64_t D, cudaStream_t stream) {
  throw_if_nonfinite(ws, d_x, T, D, stream);
  std::vector<float> x(static_cast<size_t>(T * D));
  LQ_CUDA_CHECK(cudaMemcpyAsync(x.data(), d_x, x.size() * sizeof(float), cudaMemcpyDeviceToHost, stream));
  LQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  return x;
}

// Lloyd-Max (lloyd_max.h): NaN/Inf first, then the codebooks fitted on the host from a copy of the matrix
// (fit_lloyd_max, as the CPU quantizer) and the encode on the device with their midpoints.
void quantize_lm(DeviceQuantized& out, const Layout& L, const float* d_x, int64_t T, int64_t D, int64_t rb,
                 std::span<const int64_t> seq_offsets, cudaStream_t stream) {
  gpu::Workspace& ws = out.ws;
  const std::vector<float> x = finite_host_copy(ws, d_x, T, D, stream);
  out.global = fit_lloyd_max(x.data(), T, D, seq_offsets, out.spec.bits, L.codebook_width);
  const LloydMaxTables tab = lloyd_max_tables(out.global, out.spec.bits, L.codebook_width, D);
  ws.lm_table.upload(tab.midpoint.data(), tab.midpoint.size(), stream, "Lloyd-Max midpoints");
  LQ_CUDA_CHECK(gd::launch_lm_encode(d_x, T, static_cast<int>(D), static_cast<int>(rb), out.spec.bits,
                                     ws.lm_table.data(), L.codebook_width, out.codes.data(), stream));
  LQ_CUDA_CHECK(cudaStreamSynchronize(stream));
}

// Transform coding (transform_coding.h): the device view of a record's tables, uploaded into the workspace.
qmath::TcTables upload_tc_tables(gpu::Workspace& ws, const TcHostTables& tab, cudaStream_t stream) {
  std::vector<float> f(tab.scale);
  f.insert(f.end(), tab.offset.begin(), tab.offset.end());
  f.insert(f.end(), tab.centroid.begin(), tab.centroid.end());
  f.insert(f.end(), tab.midpoint.begin(), tab.midpoint.end());
  ws.tc_offsets.upload(tab.bit_offset.data(), tab.bit_offset.size(), stream, "transform coding bit offsets");
  ws.tc_floats.upload(f.data(), f.size(), stream, "transform coding tables");
  const size_t D = tab.scale.size();
  qmath::TcTables t;
  t.D = static_cast<int>(D);
  t.bit_offset = ws.tc_offsets.data();
  t.scale = ws.tc_floats.data();
  t.offset = ws.tc_floats.data() + D;
  if (!tab.centroid.empty()) {
    t.centroid = ws.tc_floats.data() + 2 * D;
    t.midpoint = t.centroid + tab.centroid.size();
  }
  return t;
}

// Transform coding: NaN/Inf first, then the record fitted on the host from a copy of the matrix
// (fit_transform_coding, as the CPU quantizer) and the encode on the device with its tables.
void quantize_tc(DeviceQuantized& out, const float* d_x, int64_t T, int64_t D, int64_t rb,
                 std::span<const int64_t> seq_offsets, cudaStream_t stream) {
  gpu::Workspace& ws = out.ws;
  const std::vector<float> x = finite_host_copy(ws, d_x, T, D, stream);
  out.global = fit_transform_coding(out.spec, x.data(), T, D, seq_offsets);
  const qmath::TcTables tab = upload_tc_tables(ws, tc_tables(out.spec, out.global, D), stream);
  LQ_CUDA_CHECK(gd::launch_tc_encode(d_x, T, static_cast<int>(rb), tab, out.codes.data(), stream));
  LQ_CUDA_CHECK(cudaStreamSynchronize(stream));  // the host tables and the workspace's are reused next call
}

// The formats whose tables are fitted or fixed per matrix (TurboQuant, Lloyd-Max, transform coding): quantizes
// `out` and returns true, or returns false for every other format.
bool quantize_codebook_format(DeviceQuantized& out, const Layout& L, const float* d_x, int64_t T, int64_t D, int64_t rb,
                              std::span<const int64_t> seq_offsets, cudaStream_t stream) {
  switch (out.spec.format) {
    case Format::TurboQuant:
      quantize_tq(out, d_x, T, D, rb, stream);
      return true;
    case Format::LloydMax:
      quantize_lm(out, L, d_x, T, D, rb, seq_offsets, stream);
      return true;
    case Format::TransformCoding:
      quantize_tc(out, d_x, T, D, rb, seq_offsets, stream);
      return true;
    default:
      return false;
  }
}

__global__ void probe_kernel(int* p /*[1]*/) { *p = 42; }

}  // namespace

bool cuda_device_available(std::string* why) {
  struct Probe {
    bool ok;
    std::string why;
  };
  static const Probe probe = []() -> Probe {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return {false, std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e)};
    }
    if (n == 0) return {false, "cudaGetDeviceCount returned 0 devices"};
    int dev = 0;
    cudaDeviceProp prop{};
    if ((e = cudaGetDevice(&dev)) != cudaSuccess || (e = cudaGetDeviceProperties(&prop, dev)) != cudaSuccess) {
      (void)cudaGetLastError();
      return {false,
              std::string("cannot query the CUDA device: ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e)};
    }
    const std::string name = std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
                             std::to_string(prop.minor) + ", " + std::to_string(prop.multiProcessorCount) + " SMs)";
    int* d = nullptr;
    int h = 0;
    if ((e = cudaMalloc(&d, sizeof(int))) == cudaSuccess) {
      LQ_LAUNCH(probe_kernel, 1u, 1, 0, nullptr, d);
      if ((e = cudaGetLastError()) == cudaSuccess && (e = cudaDeviceSynchronize()) == cudaSuccess)
        e = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
      (void)cudaFree(d);
    }
    if (e != cudaSuccess || h != 42) {
      (void)cudaGetLastError();
      return {false, "a test kernel failed on " + name + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e)};
    }
    return {true, name};
  }();
  if (why) *why = probe.why;
  return probe.ok;
}

QuantizedTensor DeviceQuantized::header() const {
  QuantizedTensor h;
  h.spec = spec;
  h.rows = rows;
  h.cols = cols;
  h.group_bounds = group_bounds;
  h.global = global;
  return h;
}

void quantize_device(const QuantSpec& spec, Target target, const float* d_x, int64_t T, int64_t D,
                     std::span<const int64_t> seq_offsets, DeviceQuantized& out, cudaStream_t stream) {
  check_shape(T, D);
  if (d_x == nullptr) throw std::invalid_argument("quantize_device: the input pointer is null");
  gpu::Workspace& ws = out.ws;
  try {
    validate_spec_fields(spec);
  } catch (const std::invalid_argument&) {
    // the CPU reference reports NaN/Inf before it looks at the spec fields
    throw_if_nonfinite(ws, d_x, T, D, stream);
    throw;
  }
  try {
    validate_seq_offsets(seq_offsets, T);  // every spec, as the CPU reference
  } catch (const std::invalid_argument&) {
    throw_if_nonfinite(ws, d_x, T, D, stream);
    throw;
  }
  const QuantSpec st = spec.stored_for(target);
  const Layout L = layout(st, D);  // throws for rows the format cannot store, as the CPU reference
  out.spec = st;
  out.rows = T;
  out.cols = D;
  out.group_bounds.clear();
  out.global.clear();
  const bool channel = st.format == Format::Int && st.granularity == Granularity::Channel;
  if (channel) {
    bool changed;
    try {
      changed = plan_channel(ws, T, st.group_size, seq_offsets, stream);
    } catch (const std::invalid_argument&) {
      // the CPU reference reports NaN/Inf before it looks at seq_offsets
      throw_if_nonfinite(ws, d_x, T, D, stream);
      throw;
    }
    out.group_bounds = ws.bounds;
    if (changed || out.d_group_bounds.size() != ws.bounds.size())
      out.d_group_bounds.upload(ws.bounds.data(), ws.bounds.size(), stream, "channel group bounds");
  }

  const QuantizedTensor h = out.header();
  const int64_t rb = h.row_bytes();
  const bool asym = is_asym(st);
  out.codes.resize(static_cast<size_t>(T * rb), "codes");
  out.scales.resize(static_cast<size_t>(scales_len(h)), "scales");
  out.offsets.resize(asym ? static_cast<size_t>(scales_len(h)) : 0, "offsets");
  ws.status.resize(1, "quantizer status");
  gpu::DeviceStatus* status = ws.status.data();
  LQ_CUDA_CHECK(cudaMemsetAsync(&status->nonfinite, 0, sizeof(unsigned long long), stream));
  LQ_CUDA_CHECK(cudaMemsetAsync(&status->overflow_key, 0xff, sizeof(unsigned long long), stream));
  LQ_CUDA_CHECK(cudaMemsetAsync(&status->amax_bits, 0, sizeof(unsigned long long), stream));

  if (quantize_codebook_format(out, L, d_x, T, D, rb, seq_offsets, stream)) return;
  if (L.block_format) {
    // max|x| of the finite elements: the per-tensor scale (a pass before the block kernel, which
    // needs it) and whether the decode must be checked for float32 overflow, as on the CPU. Without
    // a per-tensor scale the block kernel folds it (no extra pass over x).
    float amax = 0.0f, global = 0.0f;
    if (L.tensor_bytes > 0) {
      amax = block_amax(status, d_x, T * D, stream);
      global = qmath::global_scale(L.desc.kind, amax, st.rule == ScaleRule::Unit);
      out.global.assign(4, 0);
      qmath::store_dtype(out.global.data(), global, ScaleDtype::F32);
    }
    // every code byte is written by the kernel (no memset)
    gd::BlocksArgs ba{d_x,
                      nullptr,
                      T,
                      D,
                      rb,
                      L.blocks_per_row > 0 ? L.blocks_per_row : 1,
                      L.desc,
                      L.scale_bytes,
                      global,
                      out.codes.data(),
                      out.scales.data(),
                      out.offsets.data(),
                      status};
    LQ_CUDA_CHECK(gd::launch_quantize_blocks(ba, stream));
    const gpu::DeviceStatus hs = finish(out, d_x, stream);
    if (L.tensor_bytes == 0) amax = qmath::f32_from_bits(static_cast<uint32_t>(hs.amax_bits));
    if (amax >= kDecodeCheckAmax) {  // rare: the CPU reference's decode check on the host
      const QuantizedTensor h = to_host(out, stream);
      std::vector<float> x(static_cast<size_t>(T * D));
      LQ_CUDA_CHECK(cudaMemcpy(x.data(), d_x, x.size() * sizeof(float), cudaMemcpyDeviceToHost));
      check_decodable(h, x.data());
    }
    return;
  }
  switch (st.format) {
    case Format::BF16:
      LQ_CUDA_CHECK(gd::launch_bf16_encode(d_x, T * D, out.codes.data(), status, stream));
      break;
    case Format::Int: {
      const bool sym = st.scheme == Scheme::Sym;
      const gd::Mode mode = sym ? gd::Mode::Sym : gd::Mode::Asym;
      switch (st.granularity) {
        case Granularity::Tensor: {
          size_t temp = 0;
          ws.tensor_stats.resize(1, "per-tensor statistics");
          LQ_CUDA_CHECK(gd::tensor_stats(nullptr, temp, d_x, T * D, ws.tensor_stats.data(), stream));
          ws.cub_temp.resize(std::max<size_t>(temp, 1), "CUB temporary storage");
          LQ_CUDA_CHECK(gd::tensor_stats(ws.cub_temp.data(), temp, d_x, T * D, ws.tensor_stats.data(), stream));
          LQ_CUDA_CHECK(gd::launch_tensor_finalize(ws.tensor_stats.data(), st.bits, sym, st.scale_dtype,
                                                   out.scales.data(), out.offsets.data(), status, stream));
          LQ_CUDA_CHECK(gd::launch_quantize_rows(
              rows_args(d_x, T, D, rb, D, 1, true, asym, st.scale_dtype, out, status), st.bits, mode, stream));
          break;
        }
        case Granularity::Token:
          LQ_CUDA_CHECK(gd::launch_quantize_rows(
              rows_args(d_x, T, D, rb, h.row_group(), h.scales_per_row(), false, asym, st.scale_dtype, out, status),
              st.bits, mode, stream));
          break;
        case Granularity::Channel: {
          const int64_t G = static_cast<int64_t>(ws.bounds.size()) - 1;
          const int64_t nslices = (D + 31) / 32;
          if (!ws.fused) {
            const int64_t nstat = static_cast<int64_t>(ws.stat_chunks.size());
            ws.partial.resize(static_cast<size_t>(nstat * D * 2), "channel partial statistics");
            gd::ChannelStatsArgs sa{d_x, D, ws.stat_chunks.data(), nstat, nslices, ws.partial.data(), status};
            LQ_CUDA_CHECK(gd::launch_channel_stats(sa, sym, stream));
            gd::ChannelFinalizeArgs fa{ws.partial.data(), ws.stat_begin.data(), G,     D, st.bits, st.scale_dtype,
                                       out.scales.data(), out.offsets.data(),   status};
            LQ_CUDA_CHECK(gd::launch_channel_finalize(fa, sym, stream));
          }
          gd::ChannelArgs ca{d_x,
                             D,
                             rb,
                             ws.enc_chunks.data(),
                             static_cast<int64_t>(ws.enc_chunks.size()),
                             nslices,
                             ws.fused,
                             st.scale_dtype,
                             out.codes.data(),
                             out.scales.data(),
                             out.offsets.data(),
                             status};
          LQ_CUDA_CHECK(gd::launch_channel_encode(ca, st.bits, sym, stream));
          break;
        }
      }
      break;
    }
    default:
      throw std::logic_error("quantize_device: unhandled format '" + st.to_string() + "'");
  }
  finish(out, d_x, stream);
}

namespace gpu {
void check_device_layout(const DeviceQuantized& q, const char* who) {
  const int64_t T = q.rows, D = q.cols;
  if (T <= 0 || D <= 0) throw std::invalid_argument(std::string(who) + ": cannot read an empty matrix " + shape(T, D));
  check_shape(T, D);
  const QuantizedTensor h = q.header();
  const QuantSpec& st = q.spec;
  const bool channel = st.format == Format::Int && st.granularity == Granularity::Channel;
  if (channel && (q.group_bounds.size() < 2 || q.group_bounds.front() != 0 || q.group_bounds.back() != T ||
                  q.d_group_bounds.size() != q.group_bounds.size()))
    throw std::invalid_argument(std::string(who) + ": channel group bounds must run from 0 to T = " +
                                std::to_string(T) + " and be on the device");
  const int64_t rb = h.row_bytes();
  const int64_t sl = scales_len(h);
  if (static_cast<int64_t>(q.codes.size()) != T * rb || static_cast<int64_t>(q.scales.size()) != sl ||
      static_cast<int64_t>(q.offsets.size()) != (is_asym(st) ? sl : 0))
    throw std::invalid_argument(std::string(who) + ": buffers of '" + st.to_string() + "' " + shape(T, D) +
                                " do not match the layout (codes " + std::to_string(q.codes.size()) +
                                " bytes, expected " + std::to_string(T * rb) + "; scales " +
                                std::to_string(q.scales.size()) + ", expected " + std::to_string(sl) + ")");
}

const int32_t* token_group_map(const DeviceQuantized& q, cudaStream_t stream) {
  Workspace& ws = q.ws;
  const int64_t T = q.rows;
  if (ws.map_bounds != q.group_bounds || ws.token_group.size() != static_cast<size_t>(T)) {
    ws.token_group.resize(static_cast<size_t>(T), "token group map");
    LQ_CUDA_CHECK(gd::launch_token_group_map(q.d_group_bounds.data(), static_cast<int64_t>(q.group_bounds.size()) - 1,
                                             T, ws.token_group.data(), stream));
    ws.map_bounds = q.group_bounds;
  }
  return ws.token_group.data();
}
}  // namespace gpu

void dequantize_device(const DeviceQuantized& q, float* d_out, cudaStream_t stream) {
  const int64_t T = q.rows, D = q.cols;
  if (T <= 0 || D <= 0) throw std::invalid_argument("cannot dequantize an empty matrix " + shape(T, D));
  if (d_out == nullptr) throw std::invalid_argument("dequantize_device: the output pointer is null");
  gpu::check_device_layout(q, "dequantize_device");
  const QuantizedTensor h = q.header();
  const QuantSpec& st = q.spec;
  const bool channel = st.format == Format::Int && st.granularity == Granularity::Channel;
  const int64_t rb = h.row_bytes();
  const Layout L = h.layout();
  if (st.format == Format::LloydMax) {
    const LloydMaxTables tab = lloyd_max_tables(q.global, st.bits, L.codebook_width, D);
    gpu::Workspace& ws = q.ws;
    ws.lm_table.upload(tab.centroid.data(), tab.centroid.size(), stream, "Lloyd-Max centroids");
    LQ_CUDA_CHECK(gd::launch_lm_decode(q.codes.data(), T, static_cast<int>(D), static_cast<int>(rb), st.bits,
                                       ws.lm_table.data(), L.codebook_width, d_out, stream));
    LQ_CUDA_CHECK(cudaStreamSynchronize(stream));  // the table buffer is reused by the next call
    return;
  }
  if (st.format == Format::TransformCoding) {
    const qmath::TcTables tab = upload_tc_tables(q.ws, tc_tables(st, q.global, D), stream);
    LQ_CUDA_CHECK(gd::launch_tc_decode(q.codes.data(), T, static_cast<int>(rb), tab, d_out, stream));
    LQ_CUDA_CHECK(cudaStreamSynchronize(stream));  // the table buffers are reused by the next call
    return;
  }
  if (st.format == Format::TurboQuant) {
    const qmath::TqCodebook& cb = tq_codebook(D, st.bits);
    LQ_CUDA_CHECK(gd::launch_tq_decode(q.codes.data(), q.scales.data(), T, static_cast<int>(D), static_cast<int>(rb),
                                       cb, st.rule == ScaleRule::NormCorrected, d_out, stream));
    hadamard_rows_device(d_out, T, D, hadamard_block(D, 0), nullptr, false, stream);
    return;
  }
  if (L.block_format) {
    gd::BlocksArgs ba{nullptr,
                      d_out,
                      T,
                      D,
                      rb,
                      L.blocks_per_row > 0 ? L.blocks_per_row : 1,
                      L.desc,
                      L.scale_bytes,
                      h.global_scale(),
                      const_cast<uint8_t*>(q.codes.data()),
                      const_cast<uint8_t*>(q.scales.data()),
                      const_cast<uint8_t*>(q.offsets.data()),
                      nullptr};
    LQ_CUDA_CHECK(gd::launch_dequantize_blocks(ba, stream));
    return;
  }
  gd::DequantArgs a{};
  a.codes = q.codes.data();
  a.scales = q.scales.data();
  a.offsets = q.offsets.data();
  a.T = T;
  a.D = static_cast<int>(D);
  a.rb = static_cast<int>(rb);
  a.g = 1;
  a.nt = 1;
  a.nq = static_cast<int>((D + 3) / 4);
  a.R = static_cast<int>(std::clamp<int64_t>(1024 / a.nq, 1, 64));
  a.div_nq = gpu::FastDiv(a.nq);
  a.gran = st.granularity;
  a.sd = st.scale_dtype;
  a.vec = D % 4 == 0 && (reinterpret_cast<uintptr_t>(d_out) & 15) == 0 &&
          (reinterpret_cast<uintptr_t>(q.codes.data()) & 7) == 0;
  a.out = d_out;
  gd::Mode mode;
  if (st.format == Format::BF16)
    mode = gd::Mode::Bf16;
  else
    mode = st.scheme == Scheme::Sym ? gd::Mode::Sym : gd::Mode::Asym;
  if (st.format == Format::Int && st.granularity == Granularity::Token) {
    a.g = static_cast<int>(h.row_group());
    a.nt = static_cast<int>(h.scales_per_row());
  }
  a.div_g = gpu::FastDiv(a.g);
  if (channel) a.token_group = gpu::token_group_map(q, stream);
  LQ_CUDA_CHECK(gd::launch_dequantize(a, st.bits, mode, stream));
}

int64_t count_nonfinite_device(const float* d_x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return 0;
  gpu::Workspace ws;
  return static_cast<int64_t>(count_nonfinite_ws(ws, d_x, n, stream));
}

DeviceQuantized to_device(const QuantizedTensor& q, cudaStream_t stream) {
  const int64_t rb = q.row_bytes();
  const int64_t sl = scales_len(q);
  if (q.rows <= 0 || q.cols <= 0 || static_cast<int64_t>(q.codes.size()) != q.rows * rb ||
      static_cast<int64_t>(q.scales.size()) != sl ||
      static_cast<int64_t>(q.offsets.size()) != (is_asym(q.spec) ? sl : 0))
    throw std::invalid_argument("QuantizedTensor '" + q.spec.to_string() + "' " + shape(q.rows, q.cols) +
                                " does not match its layout (codes " + std::to_string(q.codes.size()) +
                                " bytes, scales " + std::to_string(q.scales.size()) + ", offsets " +
                                std::to_string(q.offsets.size()) + ")");
  DeviceQuantized d;
  d.spec = q.spec;
  d.rows = q.rows;
  d.cols = q.cols;
  d.group_bounds = q.group_bounds;
  d.global = q.global;
  d.codes.upload(q.codes.data(), q.codes.size(), stream, "codes");
  d.scales.upload(q.scales.data(), q.scales.size(), stream, "scales");
  d.offsets.upload(q.offsets.data(), q.offsets.size(), stream, "offsets");
  d.d_group_bounds.upload(q.group_bounds.data(), q.group_bounds.size(), stream, "channel group bounds");
  LQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  return d;
}

QuantizedTensor to_host(const DeviceQuantized& q, cudaStream_t stream) {
  QuantizedTensor h = q.header();
  h.codes.resize(q.codes.size());
  h.scales.resize(q.scales.size());
  h.offsets.resize(q.offsets.size());
  q.codes.download(h.codes.data(), stream);
  q.scales.download(h.scales.data(), stream);
  q.offsets.download(h.offsets.data(), stream);
  return h;
}

QuantizedTensor quantize_gpu(const QuantSpec& spec, Target target, const float* X, int64_t T, int64_t D,
                             std::span<const int64_t> seq_offsets) {
  check_shape(T, D);
  gpu::DeviceBuffer<float> dx;
  dx.upload(X, static_cast<size_t>(T * D), nullptr, "input");
  DeviceQuantized dq;
  quantize_device(spec, target, dx.data(), T, D, seq_offsets, dq, nullptr);
  return to_host(dq, nullptr);
}

void dequantize_gpu(const QuantizedTensor& q, float* out) {
  DeviceQuantized dq = to_device(q, nullptr);
  gpu::DeviceBuffer<float> dout(static_cast<size_t>(q.rows * q.cols), "output");
  dequantize_device(dq, dout.data(), nullptr);
  dout.download(out, nullptr);
}

void quantize_dequantize_gpu(const QuantSpec& spec, Target target, const float* X, int64_t T, int64_t D,
                             std::span<const int64_t> seq_offsets, float* out, QuantizedTensor* storage_out) {
  check_shape(T, D);
  gpu::DeviceBuffer<float> dx;
  dx.upload(X, static_cast<size_t>(T * D), nullptr, "input");
  DeviceQuantized dq;
  quantize_device(spec, target, dx.data(), T, D, seq_offsets, dq, nullptr);
  dequantize_device(dq, dx.data(), nullptr);  // decode over the input buffer: it is no longer read
  dx.download(out, nullptr);
  if (storage_out) *storage_out = to_host(dq, nullptr);
}

}  // namespace latentq
