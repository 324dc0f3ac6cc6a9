// kernels/quant/dequantize.cu — decode of every format: one block per R rows, one thread per quad of
// 4 elements (bits/2 code bytes in, a float4 out when aligned); a quad loads each distinct
// (scale, offset) once (token/tensor: usually one). Scale index per element:
//   tensor 0 · channel token_group[t]·D + d · token / fp8 tile t·nt + d / g.
// Values from qmath::decode_* with the stored (scale, offset), exactly as latentq::dequantize.
#include <algorithm>

#include "kernels.cuh"

namespace latentq::gpu::detail {
namespace {

template <int BITS, Mode M>
__global__ void __launch_bounds__(kDequantThreads) dequantize_kernel(const DequantArgs a) {
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * a.R;
  const int rows = static_cast<int>(min(static_cast<int64_t>(a.R), a.T - r0));
  const int nquads = rows * a.nq;
  for (int i = static_cast<int>(threadIdx.x); i < nquads; i += kDequantThreads) {
    const int r = static_cast<int>(a.div_nq.div(static_cast<uint32_t>(i)));
    const int c = i - r * a.nq;
    const int d0 = 4 * c;
    const int64_t t = r0 + r;
    const uint8_t* row = a.codes + t * a.rb;
    float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if constexpr (M == Mode::Bf16) {
      if (a.vec && d0 + 4 <= a.D) {  // rb = 2·D with D % 4 == 0: 8-byte aligned
        const uint2 w = *reinterpret_cast<const uint2*>(row + 2 * d0);
        o[0] = q::bf16_bits_to_f32(static_cast<uint16_t>(w.x));
        o[1] = q::bf16_bits_to_f32(static_cast<uint16_t>(w.x >> 16));
        o[2] = q::bf16_bits_to_f32(static_cast<uint16_t>(w.y));
        o[3] = q::bf16_bits_to_f32(static_cast<uint16_t>(w.y >> 16));
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (d0 + e < a.D) o[e] = q::bf16_bits_to_f32(reinterpret_cast<const uint16_t*>(row)[d0 + e]);
      }
    } else {
      constexpr int QB = BITS / 2;  // code bytes of a quad
      const uint32_t w = load_bytes<QB>(row + c * QB, min(QB, a.rb - c * QB));
      int64_t base;  // scale index of element d0
      int j = 0, next = 0;
      if (a.gran == Granularity::Tensor) {
        base = 0;
      } else if (a.gran == Granularity::Channel) {
        base = static_cast<int64_t>(a.token_group[t]) * a.D + d0;
      } else {
        j = static_cast<int>(a.div_g.div(static_cast<uint32_t>(d0)));
        next = (j + 1) * a.g;
        base = t * a.nt;
      }
      int64_t cur = -1;  // index of the (scale, offset) held in sv, ov: loaded once per group of the quad
      float sv = 0.0f, ov = 0.0f;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int d = d0 + e;
        if (d < a.D) {
          int64_t si;
          if (a.gran == Granularity::Tensor) {
            si = 0;
          } else if (a.gran == Granularity::Channel) {
            si = base + e;
          } else {
            if (d >= next) {
              ++j;
              next += a.g;
            }
            si = base + j;
          }
          if (si != cur) {
            sv = load_scale(a.scales, si, a.sd);
            if constexpr (M == Mode::Asym) ov = load_scale(a.offsets, si, a.sd);
            cur = si;
          }
          const uint32_t u = (w >> (BITS * e)) & ((1u << BITS) - 1u);
          if constexpr (M == Mode::Sym)
            o[e] = q::decode_sym(u, sv, BITS);
          else
            o[e] = q::decode_asym(u, sv, ov);
        }
      }
    }
    float* dst = a.out + t * a.D + d0;
    if (a.vec && d0 + 4 <= a.D) {
      *reinterpret_cast<float4*>(dst) = make_float4(o[0], o[1], o[2], o[3]);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (d0 + e < a.D) dst[e] = o[e];
    }
  }
}

template <int BITS, Mode M>
cudaError_t launch(const DequantArgs& a, cudaStream_t stream) {
  const int64_t blocks = (a.T + a.R - 1) / a.R;
  auto* kernel = &dequantize_kernel<BITS, M>;
  LQ_LAUNCH(kernel, static_cast<unsigned>(blocks), kDequantThreads, 0, stream, a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_dequantize(const DequantArgs& a, int bits, Mode mode, cudaStream_t stream) {
  if (a.T <= 0) return cudaSuccess;
  if (mode == Mode::Bf16) return launch<16, Mode::Bf16>(a, stream);
  if (mode != Mode::Sym && mode != Mode::Asym) return cudaErrorInvalidValue;
  LQ_DISPATCH_INT(bits, mode == Mode::Sym, return launch<BITS, MODE>(a, stream);)
  return cudaErrorInvalidValue;
}

}  // namespace latentq::gpu::detail
