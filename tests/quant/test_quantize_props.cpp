// Properties of the integer formats on random data with fixed seeds, checked against statistics
// recomputed here: group structure, stored scales/offsets, codes and layout, the error bound, the
// byte-buffer round trip and determinism.
//
// The error bound, derived exactly. For an element x of a group with stored (fp16 or fp32) scale s
// and offset o, the stored range is [lo, hi] = [o, o + s·(2^b − 1)] (asym) or [−s·qmax, s·qmax] (sym).
// The encoder clamps the code to the range, so
//   x inside [lo, hi]  ->  |x̂ − x| ≤ s/2                     (nearest code, ties to even)
//   x outside          ->  |x̂ − x| = dist(x, [lo, hi])       (the code is the nearest end)
// and dist ≤ |min − o| below the range, ≤ |max − hi| above it (asym), ≤ absmax − s·qmax (sym).
// With fp16 these deficits come from rounding the scale and offset and can exceed s/2 (see
// FormatsFp16Rounding.OffsetRoundedAboveMinClampsToCodeZero); with -fp32 the offset is the min
// exactly and s·Q misses the max by float rounding only, so |x̂ − x| ≤ s/2 holds for every element.
// Both statements hold up to float32 arithmetic: x − o, the division by s, s·q and o + s·q are each
// rounded once (relative error ≤ 2^-24), which adds at most 2^-23·(|x| + |o|) + 2^-24·(|lo| + |hi|)
// + 2^-24·|x̂| ≤ 2^-21·M with M = max(|x|, |lo|, |hi|): a few float32 ulps of the group's magnitude.
#include <random>

#include "test_helpers.h"

namespace {
using namespace lqtest;

enum class Kind { Normal, Shifted, Tiny, Mixed };
const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Normal:
      return "normal";
    case Kind::Shifted:
      return "shifted";
    case Kind::Tiny:
      return "tiny";
    case Kind::Mixed:
      return "mixed";
  }
  return "?";
}

// Random [T, D] data of a given kind:
//   normal : N(0,1) times a per-channel gain (every 16th channel an outlier ×40) and a per-token gain;
//   shifted: 300 + N(0, 0.05): fp16 spacing at 300 is 0.25, so offset rounding dominates small scales;
//   tiny   : N(0, 1e-6): fp16 scales are subnormal or round to 0;
//   mixed  : channel means 4·sin(d), some all-constant channels, exact zeros and repeated values.
std::vector<float> gen(uint32_t seed, int64_t T, int64_t D, Kind kind) {
  std::mt19937 rng(seed * 7919u + static_cast<uint32_t>(T * 131 + D));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.5f, 2.0f);
  std::vector<float> gain(D), tg(T);
  for (int64_t d = 0; d < D; ++d) gain[d] = (d % 16 == 5 ? 40.0f : 1.0f) * ud(rng);
  for (int64_t t = 0; t < T; ++t) tg[t] = ud(rng);
  std::vector<float> X(T * D);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < D; ++d) {
      float& v = X[t * D + d];
      switch (kind) {
        case Kind::Normal:
          v = nd(rng) * gain[d] * tg[t];
          break;
        case Kind::Shifted:
          v = 300.0f + 0.05f * nd(rng);
          break;
        case Kind::Tiny:
          v = 1e-6f * nd(rng);
          break;
        case Kind::Mixed: {
          const float r = nd(rng);
          if (d % 11 == 3)
            v = -2.75f;  // constant channel
          else if (d % 7 == 0 && r > 0.5f)
            v = 0.0f;  // exact zeros
          else if (r < -1.0f)
            v = std::round(r * 4.0f) / 4.0f;  // repeated quarter values
          else
            v = 4.0f * std::sin(static_cast<float>(d)) + r;
          break;
        }
      }
    }
  return X;
}

std::vector<int64_t> seqs_for(int64_t T) {
  if (T == 129) return {0, 50, 51, 129};  // three sequences of uneven length, one of length 1
  if (T == 7) return {0, 3, 7};
  return {0, T};
}

std::vector<std::string> int_specs() {
  std::vector<std::string> v;
  for (int bits : {8, 4, 2})
    for (const char* sch : {"sym", "asym"})
      for (const char* gr : {"tensor", "channel", "channel-g32", "channel-g128", "token", "token-g32", "token-g128"})
        for (const char* dt : {"", "-fp32"}) v.push_back("int" + std::to_string(bits) + "-" + sch + "-" + gr + dt);
  return v;
}

struct Stats {
  int64_t elements = 0, outside = 0, over_half_scale = 0;
};

// Checks one quantization of X against independently recomputed statistics. Returns the first
// failure with its coordinates.
::testing::AssertionResult check_int(const QuantSpec& spec, const std::vector<float>& X, int64_t T, int64_t D,
                                     const std::vector<int64_t>& seq, const QuantizedTensor& q, Stats& st) {
  using ::testing::AssertionFailure;
  const int b = spec.bits;
  const bool sym = spec.scheme == Scheme::Sym, f16 = spec.scale_dtype == ScaleDtype::F16;
  const int64_t rb = (D * b + 7) / 8;
  if (q.spec != spec || q.rows != T || q.cols != D) return AssertionFailure() << "header";
  if (static_cast<int64_t>(q.codes.size()) != T * rb) return AssertionFailure() << "codes size " << q.codes.size();

  // Scale index of every element, from the spec's definition.
  std::vector<int64_t> idx(T * D);
  int64_t ngroups = 0;
  std::vector<int64_t> want_bounds;
  switch (spec.granularity) {
    case Granularity::Tensor:
      ngroups = 1;
      std::fill(idx.begin(), idx.end(), 0);
      break;
    case Granularity::Channel: {
      std::vector<int64_t> gid(T);
      int64_t next = 0;
      for (size_t s = 0; s + 1 < seq.size(); ++s) {
        const int64_t s0 = seq[s], len = seq[s + 1] - seq[s];
        if (len == 0) continue;
        const int64_t g = spec.group_size > 0 ? spec.group_size : len;
        for (int64_t t = s0; t < s0 + len; ++t) gid[t] = next + (t - s0) / g;
        next += (len + g - 1) / g;
      }
      ngroups = next * D;
      want_bounds.push_back(0);
      for (int64_t t = 1; t < T; ++t)
        if (gid[t] != gid[t - 1]) want_bounds.push_back(t);
      want_bounds.push_back(T);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < D; ++d) idx[t * D + d] = gid[t] * D + d;
      break;
    }
    case Granularity::Token: {
      const int64_t gw = spec.group_size > 0 ? std::min(spec.group_size, D) : D, nt = (D + gw - 1) / gw;
      ngroups = T * nt;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < D; ++d) idx[t * D + d] = t * nt + d / gw;
      break;
    }
  }
  if (q.group_bounds != want_bounds) return AssertionFailure() << "group_bounds";
  const size_t sbytes = f16 ? 2 : 4;
  if (q.scales.size() != ngroups * sbytes) return AssertionFailure() << "scales size " << q.scales.size();
  if (q.offsets.size() != (sym ? 0 : ngroups * sbytes))
    return AssertionFailure() << "offsets size " << q.offsets.size();

  // Group statistics and the expected stored parameters (computed in float32, then rounded to the dtype).
  std::vector<float> mn(ngroups, std::numeric_limits<float>::infinity()),
      mx(ngroups, -std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < T * D; ++i) {
    mn[idx[i]] = std::min(mn[idx[i]], X[i]);
    mx[idx[i]] = std::max(mx[idx[i]], X[i]);
  }
  const std::vector<double> S = stored_values(q.scales, spec.scale_dtype);
  const std::vector<double> O = sym ? std::vector<double>(ngroups, 0.0) : stored_values(q.offsets, spec.scale_dtype);
  const double qmax = sym ? (1 << (b - 1)) - 1 : (1 << b) - 1;
  for (int64_t g = 0; g < ngroups; ++g) {
    const float s32 = sym ? std::max(std::fabs(mn[g]), std::fabs(mx[g])) / static_cast<float>(qmax)
                          : (mx[g] - mn[g]) / static_cast<float>(qmax);
    const double want_s = f16 ? ref_f16(s32) : s32;
    const double want_o = sym ? 0.0 : (f16 ? ref_f16(mn[g]) : mn[g]);
    if (S[g] != want_s || O[g] != want_o)
      return AssertionFailure() << "group " << g << " [" << mn[g] << ", " << mx[g] << "]: stored scale " << S[g]
                                << " offset " << O[g] << ", want " << want_s << ", " << want_o;
  }

  // Codes: range, zero padding bits, and the documented decode formula reproduces dequantize().
  const std::vector<uint32_t> u = unpack_codes(q);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t used = D * b % 8;
    if (used != 0 && (q.codes[t * rb + rb - 1] >> used) != 0) return AssertionFailure() << "padding bits, row " << t;
  }
  std::vector<float> xh(T * D);
  latentq::dequantize(q, xh.data());
  const uint32_t half = 1u << (b - 1);
  for (int64_t i = 0; i < T * D; ++i) {
    const int64_t t = i / D, d = i % D, g = idx[i];
    if (sym && u[i] == 0) return AssertionFailure() << "sym code 0 at (" << t << ", " << d << ")";
    const float s = static_cast<float>(S[g]), o = static_cast<float>(O[g]);
    const float want = sym ? s * static_cast<float>(static_cast<int>(u[i]) - static_cast<int>(half))
                           : o + s * static_cast<float>(u[i]);
    if (bits_of(xh[i]) != bits_of(want))
      return AssertionFailure() << "decode of (" << t << ", " << d << ") = " << xh[i] << ", formula gives " << want;

    // The error bound (see the file comment).
    const double x = X[i], e = std::fabs(static_cast<double>(xh[i]) - x);
    const double lo = sym ? -S[g] * qmax : O[g], hi = sym ? S[g] * qmax : O[g] + S[g] * qmax;
    const double M = std::max({std::fabs(x), std::fabs(lo), std::fabs(hi)});
    const double slack = std::ldexp(M, -21);
    ++st.elements;
    if (e > S[g] / 2 + slack) ++st.over_half_scale;
    if (x >= lo && x <= hi) {
      if (e > S[g] / 2 + slack)
        return AssertionFailure() << "in-range element (" << t << ", " << d << ") x = " << x << ": error " << e
                                  << " > scale/2 = " << S[g] / 2 << " (+ " << slack << ")";
    } else {
      ++st.outside;
      const double dist = x < lo ? lo - x : x - hi;
      if (std::fabs(e - dist) > slack)
        return AssertionFailure() << "out-of-range element (" << t << ", " << d << ") x = " << x << " range [" << lo
                                  << ", " << hi << "]: error " << e << " != distance " << dist;
      const double deficit =
          sym ? std::max(std::fabs(mn[g]), std::fabs(mx[g])) - hi : (x < lo ? O[g] - mn[g] : mx[g] - hi);
      if (dist > deficit + slack) return AssertionFailure() << "distance " << dist << " > deficit " << deficit;
    }
    // -fp32: the simple bound for every element.
    if (!f16 && e > S[g] / 2 + slack)
      return AssertionFailure() << "-fp32 element (" << t << ", " << d << ") x = " << x << ": error " << e
                                << " > scale/2 = " << S[g] / 2 << " (+ " << slack << ")";
  }
  return ::testing::AssertionSuccess();
}

TEST(IntProperties, RandomDataAllSpecsShapesSeeds) {
  Stats total, fp16_shifted_asym, fp32_all;
  int runs = 0;
  const std::vector<std::string> specs = int_specs();
  for (int64_t T : {1, 7, 129})
    for (int64_t D : {576, 128, 64, 33})
      for (uint32_t seed : {1u, 2u})
        for (Kind kind : {Kind::Normal, Kind::Shifted, Kind::Tiny, Kind::Mixed}) {
          const std::vector<float> X = gen(seed, T, D, kind);
          const std::vector<int64_t> seq = seqs_for(T);
          for (const std::string& s : specs) {
            SCOPED_TRACE(s + " seed " + std::to_string(seed) + " " + kind_name(kind) + " [" + std::to_string(T) + ", " +
                         std::to_string(D) + "]");
            const QuantSpec spec = QuantSpec::parse(s);
            const QuantizedTensor q = latentq::quantize(spec, Target::CKV, X.data(), T, D, seq);
            Stats st;
            ASSERT_TRUE(check_int(spec, X, T, D, seq, q, st));
            total.elements += st.elements;
            total.outside += st.outside;
            if (spec.scale_dtype == ScaleDtype::F16 && spec.scheme == Scheme::Asym && kind == Kind::Shifted)
              fp16_shifted_asym.over_half_scale += st.over_half_scale;
            if (spec.scale_dtype == ScaleDtype::F32) fp32_all.over_half_scale += st.over_half_scale;
            ++runs;
          }
        }
  EXPECT_EQ(runs, 84 * 3 * 4 * 2 * 4);
  // The honest bound is not vacuous: fp16 offset rounding on the shifted data does push elements
  // beyond scale/2, and some elements do fall outside the stored range; -fp32 never exceeds scale/2.
  EXPECT_GT(fp16_shifted_asym.over_half_scale, 0);
  EXPECT_GT(total.outside, 0);
  EXPECT_EQ(fp32_all.over_half_scale, 0);
}

// ---- storage: decode reads only the stored bytes; determinism ----------------------------------

void put_u64(std::vector<uint8_t>& buf, uint64_t v) {
  for (int i = 0; i < 8; ++i) buf.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
uint64_t get_u64(const std::vector<uint8_t>& buf, size_t& p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(buf[p++]) << (8 * i);
  return v;
}
void put_bytes(std::vector<uint8_t>& buf, const std::vector<uint8_t>& b) {
  put_u64(buf, b.size());
  buf.insert(buf.end(), b.begin(), b.end());
}
std::vector<uint8_t> get_bytes(const std::vector<uint8_t>& buf, size_t& p) {
  const size_t n = get_u64(buf, p);
  std::vector<uint8_t> b(buf.begin() + static_cast<std::ptrdiff_t>(p),
                         buf.begin() + static_cast<std::ptrdiff_t>(p + n));
  p += n;
  return b;
}
// A flat byte image: spec string, rows, cols, group bounds, codes, scales, offsets.
std::vector<uint8_t> serialize(const QuantizedTensor& q) {
  std::vector<uint8_t> buf;
  const std::string s = q.spec.to_string();
  put_bytes(buf, std::vector<uint8_t>(s.begin(), s.end()));
  put_u64(buf, static_cast<uint64_t>(q.rows));
  put_u64(buf, static_cast<uint64_t>(q.cols));
  put_u64(buf, q.group_bounds.size());
  for (int64_t v : q.group_bounds) put_u64(buf, static_cast<uint64_t>(v));
  put_bytes(buf, q.codes);
  put_bytes(buf, q.scales);
  put_bytes(buf, q.offsets);
  put_bytes(buf, q.global);
  return buf;
}
QuantizedTensor deserialize(const std::vector<uint8_t>& buf) {
  size_t p = 0;
  QuantizedTensor q;
  const std::vector<uint8_t> s = get_bytes(buf, p);
  q.spec = QuantSpec::parse(std::string(s.begin(), s.end()));
  q.rows = static_cast<int64_t>(get_u64(buf, p));
  q.cols = static_cast<int64_t>(get_u64(buf, p));
  const size_t nb = get_u64(buf, p);
  for (size_t i = 0; i < nb; ++i) q.group_bounds.push_back(static_cast<int64_t>(get_u64(buf, p)));
  q.codes = get_bytes(buf, p);
  q.scales = get_bytes(buf, p);
  q.offsets = get_bytes(buf, p);
  q.global = get_bytes(buf, p);
  EXPECT_EQ(p, buf.size());
  return q;
}

TEST(Storage, ByteBufferRoundTripAndDeterminism) {
  std::vector<std::string> specs = int_specs();
  specs.push_back("bf16");
  for (const char* b : {"fp8-e4m3-tile128-pow2", "fp8-e4m3-tile64-pow2-ue8m0", "fp8-e4m3-tile128-fp32",
                        "fp8-e4m3-tensor", "fp8-e4m3-tensor-s1", "mxfp8", "mxfp4", "nvfp4", "q8_0", "q4_0", "q4_1"})
    specs.push_back(b);
  for (const std::string& s : specs)
    for (int64_t D : {576, 33}) {
      if (s.starts_with("q") && D % 32 != 0)
        continue;  // ggml blocks need D % 32 == 0 (refused: Spec.LayoutFromTheDescriptor)
      const int64_t T = 7;
      SCOPED_TRACE(s + " seed 3 [" + std::to_string(T) + ", " + std::to_string(D) + "]");
      const std::vector<float> X = gen(3, T, D, Kind::Mixed);
      const std::vector<int64_t> seq = seqs_for(T);
      const QuantizedTensor a = quant(s, X, T, D, seq);
      const std::vector<float> xa = decode(a);
      for (float v : xa) ASSERT_TRUE(std::isfinite(v));

      // Decoding a copy rebuilt from bytes only gives the same values bit for bit.
      const std::vector<uint8_t> img = serialize(a);
      const QuantizedTensor c = deserialize(img);
      ASSERT_TRUE(same_bits(decode(c), xa));

      // Quantizing twice (from a separately allocated copy of X) gives identical bytes.
      const std::vector<float> X2(X);
      const QuantizedTensor b = quant(s, X2, T, D, seq);
      EXPECT_EQ(serialize(b), img);
    }
}

TEST(Storage, DecodeFollowsTheStoredBytes) {
  // Editing stored bytes changes exactly the elements they encode: int4-sym-tensor on 2x4, scale 1:
  // X = [7, -7, 1, 2 | 3, 0, -1, 4]. Raising byte 0's high nibble from u(-7) = 1 to 15 (q = 7) moves
  // only element 1 to 7; doubling the stored scale (fp16 0x3c00 -> 0x4000) doubles every element.
  const std::vector<float> X = {7, -7, 1, 2, 3, 0, -1, 4};
  QuantizedTensor q = quant("int4-sym-tensor", X, 2, 4);
  ASSERT_EQ(q.codes[0], 0x1f);  // u0 = 15, u1 = 1
  q.codes[0] = 0xff;
  EXPECT_EQ(decode(q), (std::vector<float>{7, 7, 1, 2, 3, 0, -1, 4}));
  ASSERT_EQ(q.scales, (std::vector<uint8_t>{0x00, 0x3c}));
  q.scales = {0x00, 0x40};
  EXPECT_EQ(decode(q), (std::vector<float>{14, 14, 2, 4, 6, 0, -2, 8}));
}

}  // namespace
