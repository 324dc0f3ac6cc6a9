// TurboQuant's codebook (latentq/turboquant.h tq_codebook) and its CPU quantizer (cpu/dispatch.h
// quantize_tq / dequantize_tq): every step is turboquant.h's element math; the rotation is transform.h's
// fwht_rows, which the kernels reproduce byte for byte (hadamard_rows_device).
#include "latentq/turboquant.h"

#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cpu/dispatch.h"
#include "latentq/transform.h"

namespace latentq {
namespace q = qmath;

namespace {

// The Gaussian density of N(0, sigma2) at x, as vLLM writes it: (1/sqrt(2π·σ²))·exp(−x²/(2σ²)), float64.
double gaussian_pdf(double x, double sigma2) {
  return (1.0 / std::sqrt(2 * M_PI * sigma2)) * std::exp(-x * x / (2 * sigma2));
}

// ∫_a^b f by the trapezoid rule on `panels` equal panels: h·(½(f(a) + f(b)) + Σ_{i=1}^{panels−1} f(a + i·h)),
// summed in that order.
template <class F>
double trapezoid(F f, double a, double b, int panels = 200) {
  const double h = (b - a) / panels;
  double r = 0.5 * (f(a) + f(b));
  for (int i = 1; i < panels; ++i) r += f(a + i * h);
  return r * h;
}

// vLLM's solve_lloyd_max(d, bits) in float64 (turboquant.h gives the algorithm), returning the float64
// centroids of the last accepted iterate.
std::vector<double> solve_lloyd_max(int64_t d, int bits) {
  const int n = 1 << bits;
  const double sigma2 = 1.0 / static_cast<double>(d), sigma = std::sqrt(sigma2);
  auto pdf = [&](double x) { return gaussian_pdf(x, sigma2); };
  const double lo = -3.5 * sigma, hi = 3.5 * sigma;
  std::vector<double> c(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) c[i] = lo + (hi - lo) * (i + 0.5) / n;
  for (int it = 0; it < 200; ++it) {
    std::vector<double> edges{lo * 3};
    for (int i = 0; i + 1 < n; ++i) edges.push_back((c[i] + c[i + 1]) / 2.0);
    edges.push_back(hi * 3);
    std::vector<double> next(static_cast<size_t>(n));
    double moved = 0;
    for (int i = 0; i < n; ++i) {
      const double a = edges[i], b = edges[i + 1];
      const double num = trapezoid([&](double x) { return x * pdf(x); }, a, b);
      const double den = trapezoid(pdf, a, b);
      next[i] = den > 1e-15 ? num / den : c[i];
      moved = std::max(moved, std::abs(next[i] - c[i]));
    }
    if (moved < 1e-10) break;  // converged: vLLM keeps the iterate before this update
    c = std::move(next);
  }
  return c;
}

q::TqCodebook make_codebook(int64_t D, int bits) {
  const std::vector<double> c = solve_lloyd_max(D, bits);
  q::TqCodebook cb;
  cb.bits = bits;
  cb.levels = 1 << bits;
  for (int i = 0; i < cb.levels; ++i) {
    cb.centroid[i] = static_cast<float>(c[i]);  // round to nearest, as torch.tensor(..., float32)
    cb.centroid_bf16[i] = q::bf16_bits_to_f32(q::f32_to_bf16_bits(cb.centroid[i]));
  }
  for (int i = 0; i + 1 < cb.levels; ++i)
    cb.midpoint[i] = q::div_rn(q::add_rn(cb.centroid[i], cb.centroid[i + 1]), 2.0f);
  return cb;
}

}  // namespace

const q::TqCodebook& tq_codebook(int64_t D, int bits) {
  if (D <= 0 || bits < 1 || bits > q::kTqMaxBits)
    throw std::invalid_argument("TurboQuant codebook: needs D > 0 and 1..4 bits, got D = " + std::to_string(D) +
                                ", bits = " + std::to_string(bits));
  static std::mutex m;
  static std::map<std::pair<int64_t, int>, q::TqCodebook> cache;  // node-based: references stay valid
  const std::lock_guard<std::mutex> lock(m);
  auto it = cache.find({D, bits});
  if (it == cache.end()) it = cache.emplace(std::make_pair(D, bits), make_codebook(D, bits)).first;
  return it->second;
}

namespace cpu {
namespace {

void store_row_norm(QuantizedTensor& qt, int64_t t, float n) {
  if (!q::is_finite(q::round_to_dtype(n, ScaleDtype::F16)))
    throw std::invalid_argument(overflow_message(qt.spec, "scale", n, "token " + std::to_string(t)) +
                                " (the row norm)");
  q::store_dtype(qt.scales.data() + 2 * t, n, ScaleDtype::F16);
}

#if LQ_HAVE_AVX2_KERNEL
// Avx2: sixteen rows at a time: the norms (one sequential chain per row, sixteen rows in two interleaved chains of
// eight lanes), then per row x / (n + 1e-8), the butterflies and the codes one Hadamard block's registers at a time;
// the bytes of the scalar loops below. A row norm beyond fp16 is reported for the first such row, as they do.
void quantize_tq_rows16(QuantizedTensor& qt, const q::TqCodebook& cb, const float* X, int64_t T, int64_t D,
                        int64_t block, int64_t rb, float* scratch) {
  for (int64_t t0 = 0; t0 < T; t0 += 16) {
    const int64_t r = std::min<int64_t>(16, T - t0);
    float n[16], denom[16];
    const int64_t summed = r == 16 ? 16 : r / 8 * 8;  // rows whose Σx² the vector passes give
    const float* next = r == 16 && t0 + 32 <= T ? X + (t0 + 16) * D : nullptr;
    if (r == 16)  // the code pass prefetches the next rows for 64-element blocks (block8), the norm pass otherwise
      sum_squares_rows16_avx2(X + t0 * D, D, n, block == 64 ? nullptr : next);
    else if (r >= 8)
      sum_squares_rows8_avx2(X + t0 * D, D, n);
    for (int64_t k = 0; k < summed; ++k) n[k] = q::sqrt_rn(n[k]);
    for (int64_t k = summed; k < r; ++k) n[k] = q::tq_row_norm(X + (t0 + k) * D, static_cast<int>(D));
    for (int64_t k = 0; k < r; ++k) {
      store_row_norm(qt, t0 + k, n[k]);
      denom[k] = q::add_rn(n[k], q::kTqNormEps);
    }
    tq_encode_rows_avx2(X + t0 * D, r, D, block, denom, cb.midpoint, cb.bits, qt.codes.data() + t0 * rb, scratch,
                        next);
  }
}

// quantize() leaves X's NaN/Inf check to these rows (their norms): see the catch.
void quantize_tq_avx2(QuantizedTensor& qt, const q::TqCodebook& cb, const float* X, int64_t T, int64_t D, int64_t block,
                      int64_t rb) {
  std::vector<float> scratch(static_cast<size_t>(D));
  try {
    quantize_tq_rows16(qt, cb, X, T, D, block, rb, scratch.data());
  } catch (const std::invalid_argument&) {
    // quantize() left X's NaN/Inf check to this pass: a NaN/Inf makes its row norm non-finite, whose overflow error
    // lands here; a NaN/Inf anywhere in X is the error, as check_finite before the pass gave it
    (void)check_finite(X, T, D, CpuKernel::Avx2);
    throw;
  }
}

// Eight rows at a time: the centroids, the eight norm corrections (sequential chains), then per row
// ((ĉ · inv) · n or ĉ · n) and the butterflies one block's registers at a time. An output past stream_min_bytes is
// assembled eight rows at a time in a buffer and streamed out (non-temporal stores): written in place, each line of
// out was first read from memory (a store miss), which held tq2-nc's decode at 0.29–0.31 of memcpy.
void dequantize_tq_avx2(const QuantizedTensor& qt, const q::TqCodebook& cb, float* out, int64_t block, bool nc) {
  const int64_t T = qt.rows, D = qt.cols, rb = qt.row_bytes();
  std::vector<float> scratch(static_cast<size_t>(D));
  const bool stream = T * D * 4 >= stream_min_bytes();
  std::vector<float> rows(stream ? static_cast<size_t>(8 * D) : 0);
  for (int64_t t0 = 0; t0 < T; t0 += 8) {
    const int64_t r = std::min<int64_t>(8, T - t0);
    float* o = stream ? rows.data() : out + t0 * D;
    codebook_decode_rows_avx2(qt.codes.data() + t0 * rb, r, D, cb.bits, cb.centroid_bf16, false, o);
    float inv[8];
    if (nc && r == 8) {
      sum_squares_rows8_avx2(o, D, inv);
      for (float& v : inv) v = q::div_rn(1.0f, q::sqrt_rn(q::add_rn(v, q::kTqNormEps)));
    } else if (nc) {
      for (int64_t k = 0; k < r; ++k)
        inv[k] = q::tq_nc_inverse(cb, qt.codes.data() + (t0 + k) * rb, static_cast<int>(D));
    }
    for (int64_t k = 0; k < r; ++k) {
      const float n = q::load_dtype(qt.scales.data() + 2 * (t0 + k), ScaleDtype::F16);
      tq_rotate_back_row_avx2(o + k * D, D, block, nc ? inv[k] : n, n, nc, scratch.data());
    }
    if (stream) stream_copy_avx2(o, r * D, out + t0 * D);
  }
  if (stream) _mm_sfence();
}
#endif

}  // namespace

void quantize_tq(QuantizedTensor& qt, const Layout& L, const QuantizeInput& in) {
  const int64_t T = in.T, D = in.D, rb = L.row_code_bytes;
  const q::TqCodebook& cb = tq_codebook(D, qt.spec.bits);
  const int64_t block = hadamard_block(D, 0);
  qt.scales.assign(static_cast<size_t>(T * 2), 0);
#if LQ_HAVE_AVX2_KERNEL
  if (in.kernel == CpuKernel::Avx2 && block % 8 == 0) return quantize_tq_avx2(qt, cb, in.X, T, D, block, rb);
  if (in.kernel == CpuKernel::Avx2) (void)check_finite(in.X, T, D, in.kernel);  // quantize() left it to the Avx2 rows
#endif
  std::vector<float> y(static_cast<size_t>(T * D));
  for (int64_t t = 0; t < T; ++t) {
    const float* x = in.X + t * D;
    const float n = q::tq_row_norm(x, static_cast<int>(D));
    store_row_norm(qt, t, n);
    for (int64_t i = 0; i < D; ++i) y[t * D + i] = q::tq_unit(x[i], n);
  }
  fwht_rows(y.data(), T, D, block);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < rb; ++k)
      qt.codes[t * rb + k] = q::tq_encode_byte(cb, y.data() + t * D, static_cast<int>(D), static_cast<int>(k));
}

void dequantize_tq(const QuantizedTensor& qt, float* out, [[maybe_unused]] CpuKernel kernel) {
  const int64_t T = qt.rows, D = qt.cols, rb = qt.row_bytes();
  const q::TqCodebook& cb = tq_codebook(D, qt.spec.bits);
  const bool nc = qt.spec.rule == ScaleRule::NormCorrected;
  const int64_t block = hadamard_block(D, 0);
#if LQ_HAVE_AVX2_KERNEL
  if (kernel == CpuKernel::Avx2 && block % 8 == 0) return dequantize_tq_avx2(qt, cb, out, block, nc);
#endif
  for (int64_t t = 0; t < T; ++t) {
    const uint8_t* row = qt.codes.data() + t * rb;
    const float n = q::load_dtype(qt.scales.data() + 2 * t, ScaleDtype::F16);
    const float inv = nc ? q::tq_nc_inverse(cb, row, static_cast<int>(D)) : 1.0f;
    for (int64_t i = 0; i < D; ++i) out[t * D + i] = q::tq_decode_element(cb, row, static_cast<int>(i), n, nc, inv);
  }
  fwht_rows(out, T, D, block);  // H is symmetric and orthonormal: its own inverse
}

}  // namespace cpu
}  // namespace latentq
