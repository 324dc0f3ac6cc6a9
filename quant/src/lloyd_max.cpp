// Lloyd-Max codebooks fitted on the fit split (latentq/lloyd_max.h) and their CPU quantizer (cpu/dispatch.h
// quantize_lm / dequantize_lm).
#include "latentq/lloyd_max.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/dispatch.h"
#include "latentq/split.h"

namespace latentq {
namespace q = qmath;

namespace {

// Lloyd iterations on sorted values v (float64) with prefix sums: cells are contiguous ranges of v.
std::vector<double> lloyd(const std::vector<double>& v, int levels) {
  const size_t n = v.size();
  std::vector<double> prefix(n + 1, 0.0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + v[i];
  std::vector<double> c(static_cast<size_t>(levels));
  for (int i = 0; i < levels; ++i) {
    const size_t at = std::min(n - 1, static_cast<size_t>((i + 0.5) / levels * static_cast<double>(n)));
    c[i] = v[at];
  }
  std::vector<size_t> cut(static_cast<size_t>(levels + 1));
  for (int it = 0; it < kLloydMaxIterations; ++it) {
    cut[0] = 0;
    cut[levels] = n;
    for (int i = 1; i < levels; ++i)  // values >= the midpoint go to the upper cell (codebook_index)
      cut[i] = static_cast<size_t>(std::lower_bound(v.begin(), v.end(), (c[i - 1] + c[i]) / 2.0) - v.begin());
    double moved = 0, top = 0;
    for (int i = 0; i < levels; ++i) {
      const size_t a = cut[i], b = std::max(cut[i], cut[i + 1]);
      const double next = b > a ? (prefix[b] - prefix[a]) / static_cast<double>(b - a) : c[i];
      moved = std::max(moved, std::abs(next - c[i]));
      top = std::max(top, std::abs(next));
      c[i] = next;
    }
    std::sort(c.begin(), c.end());
    if (moved <= 1e-12 * (1.0 + top)) break;
  }
  return c;
}

}  // namespace

std::vector<uint8_t> fit_lloyd_max(const float* X, int64_t T, int64_t D, std::span<const int64_t> seq_offsets, int bits,
                                   int64_t width) {
  const int levels = 1 << bits;
  const int64_t groups = (D + width - 1) / width;
  const auto ranges = probes::quantizer_fit_ranges(seq_offsets, T);
  std::vector<uint8_t> out(static_cast<size_t>(groups * levels * 2));
  std::vector<double> v;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t d0 = g * width, d1 = std::min(D, d0 + width);
    v.clear();
    for (const auto& [t0, t1] : ranges)
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t d = d0; d < d1; ++d) v.push_back(static_cast<double>(X[t * D + d]));
    std::sort(v.begin(), v.end());
    const std::vector<double> c = lloyd(v, levels);
    for (int i = 0; i < levels; ++i) {
      const float f = static_cast<float>(c[i]);
      if (!q::is_finite(q::round_to_dtype(f, ScaleDtype::F16)))
        throw std::invalid_argument("Lloyd-Max codebook of channels [" + std::to_string(d0) + ", " +
                                    std::to_string(d1) + "): centroid " + std::to_string(f) +
                                    " overflows its fp16 storage (the input range exceeds what the format can store)");
      q::store_dtype(out.data() + (g * levels + i) * 2, f, ScaleDtype::F16);
    }
  }
  return out;
}

LloydMaxTables lloyd_max_tables(std::span<const uint8_t> stored, int bits, int64_t width, int64_t D) {
  LloydMaxTables t;
  t.bits = bits;
  t.levels = 1 << bits;
  t.width = width;
  t.codebooks = (D + width - 1) / width;
  if (static_cast<int64_t>(stored.size()) != t.codebooks * t.levels * 2)
    throw std::invalid_argument("Lloyd-Max tables: " + std::to_string(stored.size()) + " stored bytes, expected " +
                                std::to_string(t.codebooks * t.levels * 2));
  t.centroid.resize(static_cast<size_t>(t.codebooks * t.levels));
  t.midpoint.resize(static_cast<size_t>(t.codebooks * (t.levels - 1)));
  for (int64_t g = 0; g < t.codebooks; ++g) {
    for (int i = 0; i < t.levels; ++i)
      t.centroid[g * t.levels + i] = q::load_dtype(stored.data() + (g * t.levels + i) * 2, ScaleDtype::F16);
    for (int i = 0; i + 1 < t.levels; ++i)
      t.midpoint[g * (t.levels - 1) + i] =
          q::div_rn(q::add_rn(t.centroid[g * t.levels + i], t.centroid[g * t.levels + i + 1]), 2.0f);
  }
  t.midpoint_by_channel.resize(static_cast<size_t>(D * (t.levels - 1)));
  t.centroid_by_channel.resize(static_cast<size_t>(D * t.levels));
  for (int64_t d = 0; d < D; ++d) {
    const int64_t g = d / width;
    for (int i = 0; i + 1 < t.levels; ++i) t.midpoint_by_channel[i * D + d] = t.midpoint[g * (t.levels - 1) + i];
    for (int i = 0; i < t.levels; ++i) t.centroid_by_channel[i * D + d] = t.centroid[g * t.levels + i];
  }
  return t;
}

namespace cpu {

void lm_encode_rows(const LloydMaxTables& tab, const float* X, int64_t T, int64_t D, uint8_t* codes,
                    [[maybe_unused]] CpuKernel kernel) {
#if LQ_HAVE_AVX2_KERNEL
  if (kernel == CpuKernel::Avx2) {
    const bool one = tab.codebooks == 1;
    if (codebook_encode_rows_avx2(X, T, D, one ? tab.midpoint.data() : tab.midpoint_by_channel.data(), one ? 0 : D,
                                  tab.bits, codes))
      throw std::invalid_argument(nonfinite_message(count_nonfinite(X, T * D), T, D));
    return;
  }
#endif
  if (const int64_t bad = count_nonfinite(X, T * D)) throw std::invalid_argument(nonfinite_message(bad, T, D));
  const int64_t rb = q::packed_row_bytes(D, tab.bits);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < rb; ++k)
      codes[t * rb + k] = q::lm_encode_byte(X + t * D, static_cast<int>(D), tab.bits, tab.midpoint.data(), tab.width,
                                            static_cast<int>(k));
}

void lm_decode_rows(const LloydMaxTables& tab, const uint8_t* codes, int64_t T, int64_t D, float* out,
                    [[maybe_unused]] CpuKernel kernel) {
#if LQ_HAVE_AVX2_KERNEL
  if (kernel == CpuKernel::Avx2) {
    const bool one = tab.codebooks == 1;
    codebook_decode_rows_avx2(codes, T, D, tab.bits, one ? tab.centroid.data() : tab.centroid_by_channel.data(), !one,
                              out);
    return;
  }
#endif
  const int64_t rb = q::packed_row_bytes(D, tab.bits);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < D; ++i)
      out[t * D + i] =
          q::lm_decode_element(codes + t * rb, static_cast<int>(i), tab.bits, tab.centroid.data(), tab.width);
}

void quantize_lm(QuantizedTensor& qt, const Layout& L, const QuantizeInput& in) {
  qt.global = fit_lloyd_max(in.X, in.T, in.D, in.seq_offsets, qt.spec.bits, L.codebook_width);
  const LloydMaxTables tab = lloyd_max_tables(qt.global, qt.spec.bits, L.codebook_width, in.D);
  lm_encode_rows(tab, in.X, in.T, in.D, qt.codes.data(), in.kernel);
}

void dequantize_lm(const QuantizedTensor& qt, float* out, CpuKernel kernel) {
  const LloydMaxTables tab = lloyd_max_tables(qt.global, qt.spec.bits, qt.layout().codebook_width, qt.cols);
  lm_decode_rows(tab, qt.codes.data(), qt.rows, qt.cols, out, kernel);
}

}  // namespace cpu
}  // namespace latentq
