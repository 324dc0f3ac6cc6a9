// Shared helpers of test_quant. Everything here is written independently of the code under test
// (quant/): reference roundings use double arithmetic and std::nearbyint, stored values are read
// byte by byte (little-endian) and decoded with ldexp, packed codes are unpacked from the order
// documented in qmath.h. Only `latentq::quantize`/`dequantize` themselves come from the library.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "latentq/qmath.h"
#include "latentq/quantize.h"
#include "latentq/spec.h"

namespace lqtest {

using latentq::Format;
using latentq::Granularity;
using latentq::QuantizedTensor;
using latentq::QuantSpec;
using latentq::ScaleDtype;
using latentq::Scheme;
using latentq::Target;

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- independent decoders of the storage dtypes ------------------------------------------------
/// IEEE binary16 value of bits h (NaN for NaN patterns).
inline double f16_value(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 31)
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (e == 0)
    v = std::ldexp(static_cast<double>(m), -24);
  else
    v = std::ldexp(static_cast<double>(1024 + m), e - 25);
  return s ? -v : v;
}
/// OCP e4m3fn value of code c (bias 7, no inf, 0x7f/0xff NaN).
inline double e4m3_value(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  double v;
  if (e == 15 && m == 7)
    v = std::numeric_limits<double>::quiet_NaN();
  else if (e == 0)
    v = std::ldexp(static_cast<double>(m), -9);
  else
    v = std::ldexp(static_cast<double>(8 + m), e - 10);
  return s ? -v : v;
}

// ---- independent round-to-nearest-even references (double arithmetic, std::nearbyint) ---------
// For a finite x: the grid spacing at x is 2^(max(ilogb|x|, emin) − mant_bits); x / spacing is exact
// in double for a float x, and nearbyint under the default rounding mode rounds half to even.
inline double ref_round(float x, int mant_bits, int emin) {
  const double d = x;
  if (d == 0.0) return d;
  const int e = std::max(std::ilogb(d), emin);
  const double r = std::nearbyint(std::ldexp(d, mant_bits - e));
  return std::ldexp(r, e - mant_bits);
}
/// Nearest fp16 value (RNE), ±inf beyond 65520 (the tie 65520 itself goes to the even 65536 = inf).
inline double ref_f16(float x) {
  const double r = ref_round(x, 10, -14);
  return std::fabs(r) >= 65536.0 ? std::copysign(std::numeric_limits<double>::infinity(), r) : r;
}
/// Nearest bf16 value (RNE), ±inf when the rounding reaches 2^128.
inline double ref_bf16(float x) {
  const double r = ref_round(x, 7, -126);
  return std::fabs(r) >= std::ldexp(1.0, 128) ? std::copysign(std::numeric_limits<double>::infinity(), r) : r;
}
/// Nearest e4m3 value (RNE), saturated to ±448.
inline double ref_e4m3(float x) {
  const double r = ref_round(x, 3, -6);
  return std::fabs(r) > 448.0 ? std::copysign(448.0, r) : r;
}

// ---- reading a QuantizedTensor byte by byte ----------------------------------------------------
/// Little-endian uint16 values of a byte buffer.
inline std::vector<uint16_t> le16(const std::vector<uint8_t>& b) {
  std::vector<uint16_t> v(b.size() / 2);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint16_t>(b[2 * i] | (b[2 * i + 1] << 8));
  return v;
}
/// Little-endian float32 values of a byte buffer.
inline std::vector<float> le32f(const std::vector<uint8_t>& b) {
  std::vector<float> v(b.size() / 4);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = float_of(static_cast<uint32_t>(b[4 * i]) | (static_cast<uint32_t>(b[4 * i + 1]) << 8) |
                    (static_cast<uint32_t>(b[4 * i + 2]) << 16) | (static_cast<uint32_t>(b[4 * i + 3]) << 24));
  return v;
}
/// Stored scales/offsets as values, decoded from the raw bytes by the spec's scale dtype.
inline std::vector<double> stored_values(const std::vector<uint8_t>& b, ScaleDtype d) {
  std::vector<double> v;
  if (d == ScaleDtype::F16)
    for (uint16_t h : le16(b)) v.push_back(f16_value(h));
  else
    for (float f : le32f(b)) v.push_back(f);
  return v;
}
/// Unpacks the codes of a [rows, cols] integer-format tensor per the documented order: INT8 one byte
/// each; INT4 element 2k in bits 0-3 of byte k; INT2 element 4k+j in bits 2j..2j+1 of byte k.
inline std::vector<uint32_t> unpack_codes(const QuantizedTensor& q) {
  const int b = q.spec.bits;
  const int64_t rb = (q.cols * b + 7) / 8;
  std::vector<uint32_t> u(static_cast<size_t>(q.rows * q.cols));
  for (int64_t t = 0; t < q.rows; ++t)
    for (int64_t d = 0; d < q.cols; ++d) {
      const int64_t bit = d * b;
      u[t * q.cols + d] = (q.codes[t * rb + bit / 8] >> (bit % 8)) & ((1u << b) - 1);
    }
  return u;
}

// ---- running the quantizer ---------------------------------------------------------------------
inline std::vector<int64_t> one_seq(int64_t T) { return {0, T}; }

inline QuantizedTensor quant(const std::string& spec, const std::vector<float>& X, int64_t T, int64_t D,
                             std::vector<int64_t> seq = {}, Target target = Target::CKV) {
  if (seq.empty()) seq = one_seq(T);
  EXPECT_EQ(static_cast<int64_t>(X.size()), T * D) << "test bug: X size";
  return latentq::quantize(QuantSpec::parse(spec), target, X.data(), T, D, seq);
}
inline std::vector<float> decode(const QuantizedTensor& q) {
  std::vector<float> out(static_cast<size_t>(q.rows * q.cols), std::numeric_limits<float>::quiet_NaN());
  latentq::dequantize(q, out.data());
  return out;
}

/// Bitwise equality of float vectors (distinguishes -0 and +0), with the first mismatch reported.
inline ::testing::AssertionResult same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (bits_of(a[i]) != bits_of(b[i]))
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i];
  return ::testing::AssertionSuccess();
}

}  // namespace lqtest
