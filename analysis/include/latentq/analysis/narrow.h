// latentq/analysis/narrow.h — a float64 value used in a narrower working precision, checked after the
// conversion. A value that is fine as a double can overflow to inf (1e300 → inf in float32) or lose
// all its precision (1e-50 → 0, 1e-40 → a subnormal) as a float: both give wrong numbers silently
// (a NaN attention, a uniform softmax), so every double that a probe or the dump loader uses as a
// float goes through narrowing_problem() first.
#pragma once

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <type_traits>

namespace latentq::probes {

/// Name of a working precision in messages: "float32" or "float64".
template <typename Scalar>
constexpr const char* precision_name() {
  static_assert(std::is_same_v<Scalar, float> || std::is_same_v<Scalar, double>, "float or double");
  return std::is_same_v<Scalar, float> ? "float32" : "float64";
}

/// `x` printed with 8 significant digits ("1e+300", "inf", "0").
inline std::string format_g8(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.8g", x);
  return buf;
}

/// Why the float64 `value` does not survive the conversion to Scalar (float or double), in words to
/// append after the value, e.g. "is inf in float32 (largest finite 3.4028235e+38)"; "" when it does.
/// A problem: value is NaN/Inf; the converted value is not finite (overflow); value ≠ 0 but the
/// converted value is 0 or subnormal (|x| < std::numeric_limits<Scalar>::min(): underflow, the
/// precision is lost). 0 itself converts exactly and is no problem here (callers check their range).
/// Never throws.
template <typename Scalar>
std::string narrowing_problem(double value) {
  using L = std::numeric_limits<Scalar>;
  if (!std::isfinite(value)) return "is not finite";
  const Scalar x = static_cast<Scalar>(value);
  if (!std::isfinite(x))
    return "is " + format_g8(static_cast<double>(x)) + " in " + precision_name<Scalar>() + " (largest finite " +
           format_g8(static_cast<double>(L::max())) + ")";
  if (value != 0 && std::fabs(x) < L::min())
    return "becomes " + format_g8(static_cast<double>(x)) + " in " + precision_name<Scalar>() + " (smallest normal " +
           format_g8(static_cast<double>(L::min())) + ": the precision is lost)";
  return "";
}

}  // namespace latentq::probes
