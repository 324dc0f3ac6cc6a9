// Fit once, encode fast (latentq/fitted.h): quantize() of the fitted families in two steps, on the rows of
// cpu/dispatch.h (lm_encode_rows, tc_encode_rows and their decoders), which quantize() runs after its own fit.
#include "latentq/fitted.h"

#include <stdexcept>
#include <string>

#include "cpu/dispatch.h"

namespace latentq {

QuantFit fit_quantizer(const QuantSpec& spec, Target target, const float* X, int64_t T, int64_t D,
                       std::span<const int64_t> seq_offsets) {
  QuantFit f;
  f.requested = spec;
  f.target = target;
  f.D = D;
  f.spec = spec.stored_for(target);
  if (!f.fitted()) return f;
  if (T <= 0 || D <= 0)
    throw std::invalid_argument("cannot quantize an empty matrix [" + std::to_string(T) + ", " + std::to_string(D) +
                                "]");
  (void)cpu::check_finite(X, T, D, active_cpu_kernel());
  validate_spec_fields(spec);
  validate_seq_offsets(seq_offsets, T);
  const Layout L = layout(f.spec, D);
  if (f.spec.format == Format::LloydMax) {
    f.global = fit_lloyd_max(X, T, D, seq_offsets, f.spec.bits, L.codebook_width);
    f.lm = lloyd_max_tables(f.global, f.spec.bits, L.codebook_width, D);
  } else {
    f.global = fit_transform_coding(f.spec, X, T, D, seq_offsets);
    f.tc = tc_tables(f.spec, f.global, D);
  }
  return f;
}

QuantFit fit_of(const QuantizedTensor& qt) {
  QuantFit f;
  f.requested = f.spec = qt.spec;
  f.D = qt.cols;
  if (!f.fitted()) return f;
  f.global = qt.global;
  if (f.spec.format == Format::LloydMax)
    f.lm = lloyd_max_tables(f.global, f.spec.bits, qt.layout().codebook_width, f.D);
  else
    f.tc = tc_tables(f.spec, f.global, f.D);
  return f;
}

void encode_into(QuantizedTensor& qt, const QuantFit& fit, const float* X, int64_t T,
                 std::span<const int64_t> seq_offsets) {
  if (!fit.fitted()) {
    qt = quantize(fit.requested, fit.target, X, T, fit.D, seq_offsets);
    return;
  }
  const int64_t D = fit.D;
  try {
    if (T <= 0)
      throw std::invalid_argument("cannot quantize an empty matrix [" + std::to_string(T) + ", " + std::to_string(D) +
                                  "]");
    const CpuKernel kernel = active_cpu_kernel();
    // the row encoders check NaN/Inf in their pass over X; a bad seq_offsets still reports a NaN/Inf first
    try {
      validate_seq_offsets(seq_offsets, T);
    } catch (const std::invalid_argument&) {
      (void)cpu::check_finite(X, T, D, kernel);
      throw;
    }
    const int64_t rb = layout(fit.spec, D).row_code_bytes;
    // the row encoders write every code byte: a buffer of the right size is reused as it is
    if (qt.codes.size() != static_cast<size_t>(T * rb)) {
      qt.codes = {};
      cpu::assign_zeroed(qt.codes, static_cast<size_t>(T * rb));
    }
    qt.spec = fit.spec;
    qt.rows = T;
    qt.cols = D;
    qt.group_bounds.clear();
    qt.scales.clear();
    qt.offsets.clear();
    qt.global = fit.global;
    if (fit.spec.format == Format::LloydMax)
      cpu::lm_encode_rows(fit.lm, X, T, D, qt.codes.data(), kernel);
    else
      cpu::tc_encode_rows(fit.tc, X, T, D, rb, qt.codes.data(), kernel);
  } catch (...) {
    qt = QuantizedTensor{};
    throw;
  }
}

QuantizedTensor encode(const QuantFit& fit, const float* X, int64_t T, std::span<const int64_t> seq_offsets) {
  QuantizedTensor qt;
  encode_into(qt, fit, X, T, seq_offsets);
  return qt;
}

void decode(const QuantFit& fit, const QuantizedTensor& qt, float* out) {
  if (!fit.fitted()) {
    dequantize(qt, out);
    return;
  }
  if (qt.spec != fit.spec || qt.cols != fit.D || qt.global != fit.global)
    throw std::invalid_argument("decode: the tensor ('" + qt.spec.to_string() + "', D = " + std::to_string(qt.cols) +
                                ") was not coded with this fit ('" + fit.spec.to_string() +
                                "', D = " + std::to_string(fit.D) + ")");
  const CpuKernel kernel = active_cpu_kernel();
  if (fit.spec.format == Format::LloydMax)
    cpu::lm_decode_rows(fit.lm, qt.codes.data(), qt.rows, qt.cols, out, kernel);
  else
    cpu::tc_decode_rows(fit.tc, qt.codes.data(), qt.rows, qt.cols, qt.row_bytes(), out, kernel);
}

}  // namespace latentq
