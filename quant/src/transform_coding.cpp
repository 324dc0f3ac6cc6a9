// Transform coding (latentq/transform_coding.h): the greedy width allocation, the Gaussian uniform steps and
// Lloyd-Max codebooks, the per-matrix record, and the CPU quantizer (cpu/dispatch.h quantize_tc /
// dequantize_tc), whose element math is transform_coding.h's.
#include "latentq/transform_coding.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <queue>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cpu/dispatch.h"
#include "latentq/spec.h"
#include "latentq/split.h"

namespace latentq {
namespace q = qmath;

namespace {

void check_width(int w, const char* who) {
  if (w < 1 || w > q::kTcMaxWidth)
    throw std::invalid_argument(std::string(who) + ": the width must be 1..8 bits, got " + std::to_string(w));
}

// N(0, 1): density φ and upper tail Q(x) = P(X > x) = ½·erfc(x/√2), accurate in the tail.
double phi(double x) { return std::isinf(x) ? 0.0 : std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI); }
double upper_tail(double x) { return 0.5 * std::erfc(x / std::sqrt(2.0)); }

// ∫_a^b (x − y)² φ(x) dx for 0 ≤ a < b ≤ ∞: A·(1 + y²) − 2y·B + (a·φ(a) − b·φ(b)), with A = Q(a) − Q(b) and
// B = φ(a) − φ(b) (∫x²φ = A + aφ(a) − bφ(b), ∫xφ = B).
double cell_mse(double a, double b, double y) {
  const double A = upper_tail(a) - upper_tail(b), B = phi(a) - phi(b);
  const double bphi = std::isinf(b) ? 0.0 : b * phi(b);
  return A * (1 + y * y) - 2 * y * B + (a * phi(a) - bphi);
}

std::vector<double> solve_unit_codebook(int w) {
  const int half = (1 << w) / 2;  // the positive half; the codebook is symmetric about 0
  std::vector<double> c(static_cast<size_t>(half)), t(static_cast<size_t>(half) + 1);
  const double step = tc_uniform_step(w);
  for (int m = 0; m < half; ++m) c[m] = (m + 0.5) * step;
  t[0] = 0.0;
  t[half] = INFINITY;
  for (int it = 0; it < 20000; ++it) {
    for (int m = 1; m < half; ++m) t[m] = 0.5 * (c[m - 1] + c[m]);
    double moved = 0;
    for (int m = 0; m < half; ++m) {
      const double A = upper_tail(t[m]) - upper_tail(t[m + 1]);
      const double next = A > 0 ? (phi(t[m]) - phi(t[m + 1])) / A : c[m];
      moved = std::max(moved, std::abs(next - c[m]));
      c[m] = next;
    }
    if (moved <= 1e-13) break;
  }
  std::vector<double> out(static_cast<size_t>(2 * half));
  for (int m = 0; m < half; ++m) {
    out[half + m] = c[m];
    out[half - 1 - m] = -c[m];
  }
  return out;
}

// The fp16 bits of the unit codebooks of widths 1..8, concatenated (the -lm part of the record).
const std::vector<uint8_t>& unit_codebook_bytes() {
  static const std::vector<uint8_t> bytes = [] {
    std::vector<uint8_t> b(static_cast<size_t>(2 * q::kTcCentroids));
    for (int w = 1; w <= q::kTcMaxWidth; ++w) {
      const std::vector<double>& c = tc_unit_codebook(w);
      for (size_t j = 0; j < c.size(); ++j)
        q::store_dtype(b.data() + 2 * (q::tc_centroid_base(w) + j), static_cast<float>(c[j]), ScaleDtype::F16);
    }
    return b;
  }();
  return bytes;
}

float to_f32_checked(double v, const char* what, int64_t i) {
  const float f = static_cast<float>(v);
  if (!q::is_finite(f))
    throw std::invalid_argument("transform coding: the " + std::string(what) + " " + std::to_string(v) +
                                " of component " + std::to_string(i) +
                                " overflows its fp32 storage (the input range exceeds what the format can store)");
  return f;
}

}  // namespace

std::vector<int> tc_allocate_widths(std::span<const double> v, int64_t budget_bits) {
  if (budget_bits < 0)
    throw std::invalid_argument("tc_allocate_widths: the budget must be >= 0 bits, got " + std::to_string(budget_bits));
  std::vector<int> w(v.size(), 0);
  // (v·4^(−w), −i): the largest drop first, the lower index on a tie; v·2^(−2w) is exact in float64.
  std::priority_queue<std::pair<double, int64_t>> heap;
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] > 0) heap.emplace(v[i], -static_cast<int64_t>(i));
  for (int64_t spent = 0; spent < budget_bits && !heap.empty(); ++spent) {
    const auto [p, ni] = heap.top();
    heap.pop();
    const size_t i = static_cast<size_t>(-ni);
    if (++w[i] < q::kTcMaxWidth) heap.emplace(std::ldexp(v[i], -2 * w[i]), ni);
  }
  return w;
}

double tc_uniform_mse(int w, double step) {
  check_width(w, "tc_uniform_mse");
  const int half = (1 << w) / 2;
  double e = 0;
  for (int m = 0; m < half; ++m) e += cell_mse(m * step, m + 1 == half ? INFINITY : (m + 1) * step, (m + 0.5) * step);
  return 2 * e;
}

double tc_uniform_step(int w) {
  check_width(w, "tc_uniform_step");
  static std::once_flag once;
  static double steps[q::kTcMaxWidth + 1];
  std::call_once(once, [] {
    const double r = (std::sqrt(5.0) - 1) / 2;
    for (int b = 1; b <= q::kTcMaxWidth; ++b) {
      double lo = 0.001, hi = 3.0;
      double x1 = hi - r * (hi - lo), x2 = lo + r * (hi - lo);
      double f1 = tc_uniform_mse(b, x1), f2 = tc_uniform_mse(b, x2);
      for (int it = 0; it < 200; ++it) {
        if (f1 <= f2) {
          hi = x2, x2 = x1, f2 = f1;
          x1 = hi - r * (hi - lo), f1 = tc_uniform_mse(b, x1);
        } else {
          lo = x1, x1 = x2, f1 = f2;
          x2 = lo + r * (hi - lo), f2 = tc_uniform_mse(b, x2);
        }
      }
      steps[b] = 0.5 * (lo + hi);
    }
  });
  return steps[w];
}

const std::vector<double>& tc_unit_codebook(int w) {
  check_width(w, "tc_unit_codebook");
  static std::once_flag once;
  static std::vector<double> books[q::kTcMaxWidth + 1];
  std::call_once(once, [] {
    for (int b = 1; b <= q::kTcMaxWidth; ++b) books[b] = solve_unit_codebook(b);
  });
  return books[w];
}

namespace {

// The float32 unit codebooks the -lm encoder and decoder read: the stored fp16 centroids of widths 1..8 and
// the float32 midpoints of each width's adjacent centroids.
struct UnitTables {
  std::vector<float> centroid, midpoint;
};
UnitTables tables_of(const uint8_t* fp16) {  // fp16 [kTcCentroids], little-endian
  UnitTables u;
  u.centroid.resize(q::kTcCentroids);
  u.midpoint.resize(q::kTcMidpoints);
  for (int i = 0; i < q::kTcCentroids; ++i) u.centroid[i] = q::load_dtype(fp16 + 2 * i, ScaleDtype::F16);
  for (int w = 1; w <= q::kTcMaxWidth; ++w)
    for (int j = 0; j + 1 < (1 << w); ++j) {
      const float* c = u.centroid.data() + q::tc_centroid_base(w);
      u.midpoint[q::tc_midpoint_base(w) + j] = q::div_rn(q::add_rn(c[j], c[j + 1]), 2.0f);
    }
  return u;
}
const UnitTables& unit_tables() {
  static const UnitTables t = tables_of(unit_codebook_bytes().data());
  return t;
}

// The stored (scale, offset) of a component of width w ≥ 1, mean mu and std sigma at the multiplier m of the
// Gaussian rule: scale = fp32(m·σ·g(w)), offset = fp32(μ − scale·(2^w − 1)/2) (uniform); fp32(m·σ), fp32(μ) (-lm).
std::pair<float, float> component_params(double mu, double sigma, int w, bool lm, double m, int64_t i) {
  const float s = to_f32_checked(lm ? m * sigma : m * sigma * tc_uniform_step(w), "scale", i);
  const double o = lm ? mu : mu - static_cast<double>(s) * (((1 << w) - 1) / 2.0);
  return {s, to_f32_checked(o, "offset", i)};
}

// Σ (x̂ − x)² over the values v of one component coded at width w with (scale, offset): the stored element math.
double component_sse(const std::vector<float>& v, int w, bool lm, float scale, float offset) {
  const int32_t bits[2] = {0, w};
  q::TcTables t;
  t.D = 1;
  t.bit_offset = bits;
  t.scale = &scale;
  t.offset = &offset;
  if (lm) {
    t.centroid = unit_tables().centroid.data();
    t.midpoint = unit_tables().midpoint.data();
  }
  double e = 0;
  for (float x : v) {
    const double d = static_cast<double>(q::tc_decode_code(t, 0, w, q::tc_code(t, 0, w, x))) - x;
    e += d * d;
  }
  return e;
}

}  // namespace

std::vector<uint8_t> fit_transform_coding(const QuantSpec& spec, const float* X, int64_t T, int64_t D,
                                          std::span<const int64_t> seq_offsets) {
  const Layout L = layout(spec, D);
  const bool lm = spec.rule == ScaleRule::GaussianCodebook;
  const auto ranges = probes::quantizer_fit_ranges(seq_offsets, T);
  std::vector<double> mean(static_cast<size_t>(D), 0.0), var(static_cast<size_t>(D), 0.0);
  int64_t n = 0;
  for (const auto& [t0, t1] : ranges)
    for (int64_t t = t0; t < t1; ++t, ++n)
      for (int64_t d = 0; d < D; ++d) mean[d] += X[t * D + d];
  for (double& m : mean) m /= static_cast<double>(n);
  for (const auto& [t0, t1] : ranges)
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t d = 0; d < D; ++d) {
        const double e = X[t * D + d] - mean[d];
        var[d] += e * e;
      }
  for (double& v : var) v /= static_cast<double>(n);
  const std::vector<int> w = tc_allocate_widths(var, L.code_budget_bits);
  std::vector<uint8_t> rec(static_cast<size_t>(L.tensor_bytes), 0);
  uint8_t* scale = rec.data() + D;
  uint8_t* offset = rec.data() + 5 * D;
  std::vector<float> col(static_cast<size_t>(n));
  for (int64_t i = 0; i < D; ++i) {
    rec[i] = static_cast<uint8_t>(w[i]);
    std::pair<float, float> best{0.0f, to_f32_checked(mean[i], "offset", i)};
    if (w[i] > 0) {
      int64_t k = 0;
      for (const auto& [t0, t1] : ranges)
        for (int64_t t = t0; t < t1; ++t) col[k++] = X[t * D + i];
      const double sigma = std::sqrt(var[i]);
      double best_sse = INFINITY;
      for (int j = kTcScaleSearchFirst; j <= kTcScaleSearchLast; ++j) {  // m = 2^(j/8)
        const auto p = component_params(mean[i], sigma, w[i], lm, std::exp2(j / 8.0), i);
        const double e = component_sse(col, w[i], lm, p.first, p.second);
        if (e < best_sse) best_sse = e, best = p;
      }
    }
    q::store_dtype(scale + 4 * i, best.first, ScaleDtype::F32);
    q::store_dtype(offset + 4 * i, best.second, ScaleDtype::F32);
  }
  if (lm) {
    const std::vector<uint8_t>& cb = unit_codebook_bytes();
    std::copy(cb.begin(), cb.end(), rec.begin() + 9 * D);
  }
  return rec;
}

q::TcTables TcHostTables::view() const {
  q::TcTables t;
  t.D = static_cast<int>(scale.size());
  t.bit_offset = bit_offset.data();
  t.scale = scale.data();
  t.offset = offset.data();
  t.centroid = centroid.empty() ? nullptr : centroid.data();
  t.midpoint = midpoint.empty() ? nullptr : midpoint.data();
  return t;
}

std::vector<int> TcHostTables::widths() const {
  std::vector<int> w(scale.size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = bit_offset[i + 1] - bit_offset[i];
  return w;
}

TcHostTables tc_tables(const QuantSpec& spec, std::span<const uint8_t> rec, int64_t D) {
  const Layout L = layout(spec, D);
  if (static_cast<int64_t>(rec.size()) != L.tensor_bytes)
    throw std::invalid_argument("transform coding tables of '" + spec.to_string() + "': " + std::to_string(rec.size()) +
                                " record bytes, expected " + std::to_string(L.tensor_bytes) +
                                " for D = " + std::to_string(D));
  TcHostTables t;
  t.bit_offset.assign(static_cast<size_t>(D) + 1, 0);
  t.scale.resize(static_cast<size_t>(D));
  t.offset.resize(static_cast<size_t>(D));
  for (int64_t i = 0; i < D; ++i) {
    if (rec[i] > q::kTcMaxWidth)
      throw std::invalid_argument("transform coding tables: component " + std::to_string(i) + " has width " +
                                  std::to_string(rec[i]) + " > 8");
    t.bit_offset[i + 1] = t.bit_offset[i] + rec[i];
    t.scale[i] = q::load_dtype(rec.data() + D + 4 * i, ScaleDtype::F32);
    t.offset[i] = q::load_dtype(rec.data() + 5 * D + 4 * i, ScaleDtype::F32);
    t.width.push_back(rec[i]);
    t.qmax.push_back(static_cast<float>((1 << rec[i]) - 1));
    t.coded.push_back(rec[i] > 0 ? -1 : 0);
  }
  if (t.bit_offset[D] > L.code_budget_bits)
    throw std::invalid_argument("transform coding tables: the widths sum to " + std::to_string(t.bit_offset[D]) +
                                " bits, over the budget of " + std::to_string(L.code_budget_bits));
  if (spec.rule == ScaleRule::GaussianCodebook) {  // the decoder reads the stored codebooks
    UnitTables u = tables_of(rec.data() + 9 * D);
    t.centroid = std::move(u.centroid);
    t.midpoint = std::move(u.midpoint);
  }
  return t;
}

namespace cpu {

#if LQ_HAVE_AVX2_KERNEL  // TcUnpack and the -lm thresholds serve the AVX2 encode only (cpu/dispatch.h)
namespace {

// The least float d with div_rn(d, s) ≥ m (s > 0 finite, m finite): from m·s, a few ulps up or down; a binary
// search over the ordered floats where that takes long (d subnormal). +Inf always qualifies (Inf / s = Inf).
float least_quotient_at_least(float m, float s) {
  auto holds = [&](float d) { return q::div_rn(d, s) >= m; };
  float d = q::mul_rn(m, s);
  for (int step = 0; step < 16; ++step) {
    if (holds(d)) {
      const float below = std::nextafter(d, -INFINITY);
      if (below == d || !holds(below)) return d;
      d = below;
    } else {
      d = std::nextafter(d, INFINITY);
    }
  }
  // the floats as ordered integers: negative ones −(bits & 0x7fffffff) − 1, others their bits
  auto key = [](float f) {
    int32_t b;
    std::memcpy(&b, &f, 4);
    return b < 0 ? -static_cast<int64_t>(b & 0x7fffffff) - 1 : static_cast<int64_t>(b);
  };
  auto value = [](int64_t k) {
    const int32_t b = k < 0 ? static_cast<int32_t>((-(k + 1)) | 0x80000000u) : static_cast<int32_t>(k);
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  };
  int64_t lo = key(-INFINITY), hi = key(INFINITY);  // holds(value(hi)); find the least such key
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (holds(value(mid)))
      hi = mid;
    else
      lo = mid + 1;
  }
  return value(hi);
}

}  // namespace

void tc_lm_thresholds(const q::TcTables& v, const int32_t* width, int64_t D, TcUnpack& u) {
  u.tau.clear();
  u.tau_at.assign(static_cast<size_t>(D), -1);
  for (int64_t i = 0; i < D; ++i) {
    const int w = width[i];
    const float s = v.scale[i];
    if (w < 1 || w > 4 || !(s > 0.0f) || !std::isfinite(s)) continue;
    u.tau_at[i] = static_cast<int32_t>(u.tau.size());
    const float* m = v.midpoint + q::tc_midpoint_base(w);
    for (int j = 0; j + 1 < (1 << w); ++j) u.tau.push_back(least_quotient_at_least(m[j], s));
  }
}
#endif  // LQ_HAVE_AVX2_KERNEL

void tc_encode_rows(const TcHostTables& tab, const float* X, int64_t T, int64_t D, int64_t rb, uint8_t* codes,
                    [[maybe_unused]] CpuKernel kernel) {
  const q::TcTables v = tab.view();
#if LQ_HAVE_AVX2_KERNEL
  if (kernel == CpuKernel::Avx2) {
    const TcRowTables r{tab.scale.data(), tab.offset.data(), tab.qmax.data(), tab.width.data(), tab.coded.data()};
    std::vector<uint8_t> code(static_cast<size_t>(D));
    TcUnpack u;
    tc_unpack_tables(tab.bit_offset.data(), D, u);
    bool bad = false;  // a NaN/Inf, seen in the same pass
    int64_t t = 0;
    if (v.centroid != nullptr) {  // -lm: eight rows at a time in the lanes, then each row packed
      code.resize(static_cast<size_t>(8 * D));
      std::vector<float> col(static_cast<size_t>(8 * D));
      if (T >= 8) tc_lm_thresholds(v, tab.width.data(), D, u);
      for (; t + 8 <= T; t += 8) {
        const float* next = t + 16 <= T ? X + (t + 8) * D : nullptr;
        bad |= tc_lm_codes_rows8_avx2(X + t * D, D, v, tab.width.data(), u, next, col.data(), code.data());
        for (int64_t k = 0; k < 8; ++k)
          tc_pack_avx2(code.data() + k * D, u, tab.bit_offset.data(), D, rb, codes + (t + k) * rb);
      }
    }
    for (; t < T; ++t) {
      const float* x = X + t * D;
      if (v.centroid == nullptr) {
        bad |= tc_uniform_codes_avx2(x, D, r, code.data());
      } else {
        for (int64_t i = 0; i < D; ++i) {
          bad |= !q::is_finite(x[i]);
          code[i] = tab.width[i] ? static_cast<uint8_t>(q::tc_code(v, static_cast<int>(i), tab.width[i], x[i])) : 0;
        }
      }
      tc_pack_avx2(code.data(), u, tab.bit_offset.data(), D, rb, codes + t * rb);
    }
    if (bad) throw std::invalid_argument(nonfinite_message(count_nonfinite(X, T * D), T, D));
    return;
  }
#endif
  if (const int64_t bad = count_nonfinite(X, T * D)) throw std::invalid_argument(nonfinite_message(bad, T, D));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < rb; ++k) codes[t * rb + k] = q::tc_encode_byte(v, X + t * D, static_cast<int>(k));
}

void tc_decode_rows(const TcHostTables& tab, const uint8_t* codes, int64_t T, int64_t D, int64_t rb, float* out,
                    [[maybe_unused]] CpuKernel kernel) {
  const q::TcTables v = tab.view();
#if LQ_HAVE_AVX2_KERNEL
  if (kernel == CpuKernel::Avx2) {
    const TcRowTables r{tab.scale.data(), tab.offset.data(), tab.qmax.data(), tab.width.data(), tab.coded.data()};
    std::vector<uint8_t> code(static_cast<size_t>(8 * D)), padded(static_cast<size_t>(rb + 16), 0);
    TcUnpack u;
    tc_unpack_tables(tab.bit_offset.data(), D, u);
    int64_t t = 0;
    std::vector<float> col(v.centroid != nullptr ? static_cast<size_t>(16 * D) : 0);  // -lm: col [8, D], rows [8, D]
    const bool stream = T * D * 4 >= stream_min_bytes();  // the output past the caches: non-temporal stores
    if (v.centroid != nullptr)  // -lm: eight rows unpacked, then decoded in the lanes
      for (; t + 8 <= T; t += 8) {
        for (int64_t k = 0; k < 8; ++k) {
          std::memcpy(padded.data(), codes + (t + k) * rb, static_cast<size_t>(rb));
          tc_unpack_avx2(padded.data(), u, tab.bit_offset.data(), D, code.data() + k * D);
        }
        tc_lm_decode_rows8_avx2(code.data(), D, v, tab.width.data(), u, col.data(), col.data() + 8 * D, stream,
                                out + t * D);
      }
    if (stream) _mm_sfence();
    for (; t < T; ++t) {
      float* o = out + t * D;
      std::memcpy(padded.data(), codes + t * rb, static_cast<size_t>(rb));
      tc_unpack_avx2(padded.data(), u, tab.bit_offset.data(), D, code.data());
      if (v.centroid == nullptr) {
        tc_uniform_decode_avx2(code.data(), D, r, o);
      } else {
        for (int64_t i = 0; i < D; ++i)
          o[i] = tab.width[i] ? q::tc_decode_code(v, static_cast<int>(i), tab.width[i], code[i]) : tab.offset[i];
      }
    }
    return;
  }
#endif
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < D; ++i) out[t * D + i] = q::tc_decode_element(v, codes + t * rb, static_cast<int>(i));
}

void quantize_tc(QuantizedTensor& qt, const Layout& L, const QuantizeInput& in) {
  qt.global = fit_transform_coding(qt.spec, in.X, in.T, in.D, in.seq_offsets);
  const TcHostTables tab = tc_tables(qt.spec, qt.global, in.D);
  tc_encode_rows(tab, in.X, in.T, in.D, L.row_code_bytes, qt.codes.data(), in.kernel);
}

void dequantize_tc(const QuantizedTensor& qt, float* out, CpuKernel kernel) {
  const TcHostTables tab = tc_tables(qt.spec, qt.global, qt.cols);
  tc_decode_rows(tab, qt.codes.data(), qt.rows, qt.cols, qt.row_bytes(), out, kernel);
}

}  // namespace cpu
}  // namespace latentq
