// FusedDecode.*: the fused decode-attention kernel (latentq/fused_decode_cuda.h) against the CPU. For every
// format: the keys the kernel decoded from the stored bytes (its decoded-keys output, written from the values
// it attends with) equal latentq::dequantize of the same QuantizedTensor bit for bit, and its outputs and
// log-sum-exps equal a float64 absorbed attention over those dequantized keys to float32 rounding. Shapes: one
// and 16 heads (and 20: a partial second head tile), sequences of 1 key, of no key, and of lengths that are
// not multiples of the key tile (16) or the split, one split and several, the DeepSeek widths (512 + 64).
// In test_gpu (skips without a device) and test_gpu_emu (the host emulator, always).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "latentq/fused_decode_cuda.h"
#include "latentq/quantize.h"
#include "latentq/quantize_cuda.h"
#include "require_gpu.h"

namespace {

using namespace latentq;

struct Shape {
  std::vector<int64_t> lengths;  // keys of each sequence
  int64_t H;
  int Dc, Dr;
  int splits;    // 0: automatic
  float q_gain;  // multiplies q_lat and q_pe: a wide range of scores (the online max across tiles and splits)
  uint64_t seed;
};

std::string describe(const std::string& spec, const Shape& s) {
  std::ostringstream o;
  o << "spec " << spec << ", lengths {";
  for (size_t i = 0; i < s.lengths.size(); ++i) o << (i ? ", " : "") << s.lengths[i];
  o << "}, H " << s.H << ", Dc " << s.Dc << ", Dr " << s.Dr << ", splits " << s.splits << ", q_gain " << s.q_gain
    << ", seed " << s.seed;
  return o.str();
}

struct Inputs {
  std::vector<int64_t> seq;
  int64_t T = 0, B = 0;
  std::vector<float> c_kv, k_pe, q_lat, q_pe;
};

// Latent-like c_kv (per-channel scale and offset, a few outliers), normal k_pe and queries.
Inputs make_inputs(const Shape& s) {
  Inputs in;
  std::mt19937_64 rng(s.seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  in.seq = {0};
  for (int64_t n : s.lengths) in.seq.push_back(in.seq.back() + n);
  in.T = in.seq.back();
  in.B = static_cast<int64_t>(s.lengths.size());
  std::vector<float> cs(static_cast<size_t>(s.Dc)), co(cs.size());
  for (size_t d = 0; d < cs.size(); ++d) {
    cs[d] = std::exp(0.7f * nd(rng));
    co[d] = 0.3f * nd(rng);
  }
  in.c_kv.resize(static_cast<size_t>(in.T * s.Dc));
  for (int64_t t = 0; t < in.T; ++t)
    for (int d = 0; d < s.Dc; ++d) in.c_kv[t * s.Dc + d] = nd(rng) * cs[d] + co[d];
  for (int64_t k = 0; k < in.T * s.Dc / 300 + 1 && in.T > 0; ++k) in.c_kv[rng() % in.c_kv.size()] *= 12.0f;
  in.k_pe.resize(static_cast<size_t>(in.T * s.Dr));
  for (float& x : in.k_pe) x = nd(rng);
  in.q_lat.resize(static_cast<size_t>(in.B * s.H * s.Dc));
  for (float& x : in.q_lat) x = s.q_gain * nd(rng);
  in.q_pe.resize(static_cast<size_t>(in.B * s.H * s.Dr));
  for (float& x : in.q_pe) x = s.q_gain * nd(rng);
  return in;
}

// First index where a and b differ bit for bit, or -1.
int64_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  return -1;
}

// One format on one shape: decoded keys bit for bit, outputs and lse against float64 on the decoded keys.
void check_decode(const std::string& spec_s, const Shape& s) {
  SCOPED_TRACE(describe(spec_s, s));
  const QuantSpec spec = QuantSpec::parse(spec_s);
  const Inputs in = make_inputs(s);
  const QuantizedTensor qc = quantize(spec, Target::CKV, in.c_kv.data(), in.T, s.Dc, in.seq);
  const QuantizedTensor qk = quantize(spec, Target::KPE, in.k_pe.data(), in.T, s.Dr, in.seq);
  std::vector<float> c_hat(in.c_kv.size()), k_hat(in.k_pe.size());
  dequantize(qc, c_hat.data());
  dequantize(qk, k_hat.data());

  const float scale = 1.0f / std::sqrt(192.0f);  // DeepSeek: 1/sqrt(qk_nope_head_dim + qk_rope_head_dim)
  std::vector<float> out(static_cast<size_t>(in.B * s.H * s.Dc)), lse(static_cast<size_t>(in.B * s.H));
  std::vector<float> dec_c(c_hat.size()), dec_k(k_hat.size());
  const gpu::FusedDecodePlan plan = fused_decode_gpu(qc, qk, in.seq, in.q_lat.data(), in.q_pe.data(), s.H, scale,
                                                     s.splits, out.data(), lse.data(), dec_c.data(), dec_k.data());
  SCOPED_TRACE("plan: " + std::to_string(plan.splits) + " splits of " + std::to_string(plan.chunk) + " keys");
  if (s.splits > 0) {
    int64_t max_len = 0;
    for (int64_t n : s.lengths) max_len = std::max(max_len, n);
    const int64_t tiles = std::max<int64_t>(1, (max_len + 15) / 16);
    EXPECT_LE(plan.splits, std::min<int64_t>(s.splits, tiles));                // never more than asked, nor than tiles
    EXPECT_GE(plan.chunk * plan.splits, max_len);                              // every key in a split ...
    EXPECT_LT((plan.splits - 1) * plan.chunk, std::max<int64_t>(max_len, 1));  // ... and no split empty for all
  }
  const int64_t dc = first_difference(dec_c, c_hat), dk = first_difference(dec_k, k_hat);
  EXPECT_EQ(dc, -1) << "c_kv decoded by the kernel differs from latentq::dequantize at element " << dc << " (token "
                    << dc / s.Dc << ", dim " << dc % s.Dc << "): " << (dc >= 0 ? dec_c[dc] : 0.0f) << " vs "
                    << (dc >= 0 ? c_hat[dc] : 0.0f);
  EXPECT_EQ(dk, -1) << "k_pe decoded by the kernel differs from latentq::dequantize at element " << dk << " (token "
                    << dk / s.Dr << ", dim " << dk % s.Dr << "): " << (dk >= 0 ? dec_k[dk] : 0.0f) << " vs "
                    << (dk >= 0 ? k_hat[dk] : 0.0f);

  // float64 reference on the dequantized keys. Tolerance: float32 rounding of the scores (relative to
  // A = max_j softmax_scale·Σ|q·k| of the pair, the conditioning of the softmax) and of the weighted sums.
  constexpr double eps = 0x1p-24;
  int bad = 0;
  for (int64_t b = 0; b < in.B; ++b) {
    const int64_t s0 = in.seq[b], L = in.seq[b + 1] - s0;
    double cmax = 1.0;
    for (int64_t j = 0; j < L; ++j)
      for (int d = 0; d < s.Dc; ++d) cmax = std::max(cmax, std::fabs(static_cast<double>(c_hat[(s0 + j) * s.Dc + d])));
    for (int64_t h = 0; h < s.H && bad < 8; ++h) {
      const float* ql = in.q_lat.data() + (b * s.H + h) * s.Dc;
      const float* qp = in.q_pe.data() + (b * s.H + h) * s.Dr;
      const float* o = out.data() + (b * s.H + h) * s.Dc;
      const float got_lse = lse[b * s.H + h];
      if (L == 0) {
        for (int d = 0; d < s.Dc; ++d) EXPECT_EQ(o[d], 0.0f) << "empty sequence " << b << ", head " << h;
        EXPECT_EQ(got_lse, -std::numeric_limits<float>::infinity()) << "empty sequence " << b << ", head " << h;
        continue;
      }
      std::vector<double> sc(static_cast<size_t>(L));
      double A = 0, M = -INFINITY;
      for (int64_t j = 0; j < L; ++j) {
        double dot = 0, mag = 0;
        for (int d = 0; d < s.Dc; ++d) {
          const double p = static_cast<double>(ql[d]) * c_hat[(s0 + j) * s.Dc + d];
          dot += p;
          mag += std::fabs(p);
        }
        for (int d = 0; d < s.Dr; ++d) {
          const double p = static_cast<double>(qp[d]) * k_hat[(s0 + j) * s.Dr + d];
          dot += p;
          mag += std::fabs(p);
        }
        sc[j] = static_cast<double>(scale) * dot;
        A = std::max(A, static_cast<double>(scale) * mag);
        M = std::max(M, sc[j]);
      }
      double Z = 0;
      for (double& x : sc) Z += (x = std::exp(x - M));
      const double want_lse = M + std::log(Z);
      const double tol_lse = 32 * eps * (1 + A + std::fabs(want_lse)), tol_o = 8 * eps * (1 + A) * cmax;
      if (!(std::fabs(got_lse - want_lse) <= tol_lse)) {
        ADD_FAILURE() << "lse of sequence " << b << ", head " << h << ": " << got_lse << ", float64 " << want_lse
                      << " (tolerance " << tol_lse << ")";
        ++bad;
      }
      for (int d = 0; d < s.Dc; ++d) {
        double want = 0;
        for (int64_t j = 0; j < L; ++j) want += sc[j] * c_hat[(s0 + j) * s.Dc + d];
        want /= Z;
        if (!(std::fabs(o[d] - want) <= tol_o)) {
          ADD_FAILURE() << "out[" << b << ", " << h << ", " << d << "] = " << o[d] << ", float64 " << want
                        << " (tolerance " << tol_o << ")";
          if (++bad >= 8) break;
        }
      }
    }
  }
}

// The shapes every format runs on (Dc, Dr multiples of 32 for ggml's blocks).
const std::vector<Shape>& shapes() {
  static const std::vector<Shape> s = {
      {{37, 1}, 16, 64, 32, 1, 1.0f, 11},     // one split; a 1-key sequence; 37 = 2 tiles + 5
      {{70, 0, 33}, 1, 64, 32, 3, 1.0f, 12},  // one head; an empty sequence; 3 splits of 32 keys, the last short
      {{50}, 20, 96, 32, 2, 4.0f, 13},        // a second, partial head tile; wide scores
      {{40}, 16, 512, 64, 2, 1.0f, 14},       // DeepSeek widths: every register of a lane in use
      {{9, 120}, 3, 32, 64, 4, 8.0f, 15},     // the max moves across tiles and splits; Dr > Dc
  };
  return s;
}

void check_all_shapes(const std::string& spec) {
  for (const Shape& s : shapes()) check_decode(spec, s);
}

#define LQ_FUSED_FORMAT(name, spec) \
  TEST(FusedDecode, name) {         \
    LQ_REQUIRE_GPU();               \
    check_all_shapes(spec);         \
  }

LQ_FUSED_FORMAT(bf16, "bf16")
LQ_FUSED_FORMAT(int8_sym_channel_g32, "int8-sym-channel-g32")
LQ_FUSED_FORMAT(int4_asym_channel_g32, "int4-asym-channel-g32")
LQ_FUSED_FORMAT(int4_sym_channel_g5_fp32, "int4-sym-channel-g5-fp32")
LQ_FUSED_FORMAT(int2_asym_channel_g0, "int2-asym-channel")
LQ_FUSED_FORMAT(int8_asym_token_g0, "int8-asym-token")
LQ_FUSED_FORMAT(int4_sym_token_g32, "int4-sym-token-g32")
LQ_FUSED_FORMAT(int4_asym_token_g3, "int4-asym-token-g3")
LQ_FUSED_FORMAT(int2_sym_token_g16_fp32, "int2-sym-token-g16-fp32")
LQ_FUSED_FORMAT(int4_asym_tensor, "int4-asym-tensor")
LQ_FUSED_FORMAT(int8_sym_tensor, "int8-sym-tensor")
LQ_FUSED_FORMAT(q8_0, "q8_0")
LQ_FUSED_FORMAT(q4_0, "q4_0")
LQ_FUSED_FORMAT(q4_1, "q4_1")
LQ_FUSED_FORMAT(fp8_e4m3_tile128_pow2, "fp8-e4m3-tile128-pow2")
LQ_FUSED_FORMAT(fp8_e4m3_tile64_fp32, "fp8-e4m3-tile64-fp32")
LQ_FUSED_FORMAT(fp8_e4m3_tile6_pow2_ue8m0, "fp8-e4m3-tile6-pow2-ue8m0")
LQ_FUSED_FORMAT(fp8_e4m3_tensor, "fp8-e4m3-tensor")
LQ_FUSED_FORMAT(mxfp8, "mxfp8")
LQ_FUSED_FORMAT(mxfp4, "mxfp4")
LQ_FUSED_FORMAT(nvfp4, "nvfp4")
LQ_FUSED_FORMAT(fp4_e2m1_tile16_e4m3, "fp4-e2m1-tile16-e4m3")

// The engine presets: each target in its own stored format (e.g. fp8 tiles for c_kv, bf16 for k_pe).
TEST(FusedDecode, EnginePresets) {
  LQ_REQUIRE_GPU();
  for (const PresetTraits& p : kPresets)  // TurboQuant rows decode through a Hadamard: no fused kernel yet
    if (QuantSpec::parse(p.ckv).format != Format::TurboQuant) check_decode(p.name, shapes()[0]);
}

// The automatic split: hand-computed plans (two CTAs per SM, at least 256 keys per chunk, chunks whole tiles).
TEST(FusedDecode, PlanSplitsTheKeys) {
  // B = 1, 16 heads, 4096 keys, 132 SMs: 1 CTA per split, 264 wanted, capped at 4096 / 256 = 16 chunks of 256
  gpu::FusedDecodePlan p = gpu::plan_fused_decode(1, 16, 512, 4096, 0, 132);
  EXPECT_EQ(p.splits, 16);
  EXPECT_EQ(p.chunk, 256);
  EXPECT_EQ(p.head_tiles, 1);
  EXPECT_EQ(p.workspace_bytes, size_t{16} * 16 * 513 * 4);
  // B = 64, 128 heads: 512 CTAs already fill 132 SMs twice: one split, no workspace
  p = gpu::plan_fused_decode(64, 128, 512, 131072, 0, 132);
  EXPECT_EQ(p.splits, 1);
  EXPECT_EQ(p.chunk, 131072);
  EXPECT_EQ(p.head_tiles, 8);
  EXPECT_EQ(p.workspace_bytes, 0u);
  // explicit: 70 keys = 5 tiles in 3 splits -> 2 tiles (32 keys) each, the last one 6 keys
  p = gpu::plan_fused_decode(2, 1, 64, 70, 3, 1);
  EXPECT_EQ(p.splits, 3);
  EXPECT_EQ(p.chunk, 32);
  // more splits than tiles: one tile each; no keys at all: one split
  p = gpu::plan_fused_decode(1, 17, 64, 20, 100, 1);
  EXPECT_EQ(p.splits, 2);
  EXPECT_EQ(p.chunk, 16);
  EXPECT_EQ(p.head_tiles, 2);
  p = gpu::plan_fused_decode(1, 1, 64, 0, 0, 132);
  EXPECT_EQ(p.splits, 1);
  EXPECT_EQ(p.chunk, 16);
  EXPECT_THROW(gpu::plan_fused_decode(0, 1, 64, 10, 0, 1), std::invalid_argument);
  EXPECT_THROW(gpu::plan_fused_decode(1, 1, 64, 10, -1, 1), std::invalid_argument);
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no std::invalid_argument)";
}

// Input errors throw with what is wrong; the launcher returns cudaErrorInvalidValue for inconsistent views.
TEST(FusedDecode, RefusesBadInput) {
  LQ_REQUIRE_GPU();
  const Shape s{{5, 3}, 2, 64, 32, 1, 1.0f, 21};
  const Inputs in = make_inputs(s);
  const QuantSpec spec = QuantSpec::parse("int4-asym-token-g32");
  const QuantizedTensor qc = quantize(spec, Target::CKV, in.c_kv.data(), in.T, s.Dc, in.seq);
  const QuantizedTensor qk = quantize(spec, Target::KPE, in.k_pe.data(), in.T, s.Dr, in.seq);
  std::vector<float> out(static_cast<size_t>(in.B * s.H * s.Dc));
  auto run = [&](const QuantizedTensor& c, const QuantizedTensor& k, std::vector<int64_t> seq, int64_t H) {
    return message_of([&] {
      fused_decode_gpu(c, k, seq, in.q_lat.data(), in.q_pe.data(), H, 0.1f, 0, out.data(), nullptr, nullptr, nullptr);
    });
  };
  EXPECT_NE(run(qc, qk, {0, 5, 7}, 2).find("seq_offsets must run from 0 to T = 8"), std::string::npos)
      << run(qc, qk, {0, 5, 7}, 2);
  EXPECT_NE(run(qc, qk, in.seq, 0).find("heads must be >= 1, got 0"), std::string::npos);
  const std::vector<int64_t> seq7 = {0, 7};
  const QuantizedTensor qk7 = quantize(spec, Target::KPE, in.k_pe.data(), 7, s.Dr, seq7);
  EXPECT_NE(run(qc, qk7, in.seq, 2).find("c_kv has 8 rows but k_pe has 7"), std::string::npos);
  std::vector<float> wide(static_cast<size_t>(in.T * 520), 0.5f);
  const QuantizedTensor qw = quantize(QuantSpec::parse("bf16"), Target::CKV, wide.data(), in.T, 520, in.seq);
  EXPECT_NE(run(qw, qk, in.seq, 2).find("'bf16' [8, 520]: rows of 520 elements exceed the kernel's limit of 512"),
            std::string::npos)
      << run(qw, qk, in.seq, 2);

  // the codebook formats have no fused kernel: refused by name, family included
  for (const char* cb : {"tq3", "lm3-channel", "tc3", "tc2-lm"}) {
    const QuantizedTensor qcb = quantize(QuantSpec::parse(cb), Target::CKV, in.c_kv.data(), in.T, s.Dc, in.seq);
    const std::string m = run(qcb, qk, in.seq, 2);
    EXPECT_NE(m.find(std::string("'") + cb + "' (" + family_of(qcb.spec) + ") has no fused decode kernel"),
              std::string::npos)
        << m;
  }

  // the launcher: a k_pe view given as c_kv (D = 32, not Dc = 64), and a missing workspace
  const DeviceQuantized dc = to_device(qc), dk = to_device(qk);
  const gpu::FusedCacheView vc = gpu::fused_cache_view(dc, gpu::kFusedMaxCkv),
                            vk = gpu::fused_cache_view(dk, gpu::kFusedMaxKpe);
  gpu::DeviceBuffer<float> ql, qp, o(out.size(), "out");
  gpu::DeviceBuffer<int64_t> seq;
  ql.upload(in.q_lat.data(), in.q_lat.size(), nullptr);
  qp.upload(in.q_pe.data(), in.q_pe.size(), nullptr);
  seq.upload(in.seq.data(), in.seq.size(), nullptr);
  gpu::FusedDecodeParams p;
  p.B = in.B;
  p.H = s.H;
  p.Dc = s.Dc;
  p.Dr = s.Dr;
  p.q_lat = ql.data();
  p.q_pe = qp.data();
  p.seq_offsets = seq.data();
  p.out = o.data();
  const gpu::FusedDecodePlan plan1 = gpu::plan_fused_decode(in.B, s.H, s.Dc, 5, 1, 1);
  EXPECT_EQ(gpu::launch_fused_decode(vc, vk, p, plan1, nullptr), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  EXPECT_EQ(gpu::launch_fused_decode(vk, vk, p, plan1, nullptr), cudaErrorInvalidValue);
  const gpu::FusedDecodePlan plan2 = gpu::plan_fused_decode(in.B, s.H, s.Dc, 5 * 16, 2, 1);
  ASSERT_EQ(plan2.splits, 2);
  EXPECT_EQ(gpu::launch_fused_decode(vc, vk, p, plan2, nullptr), cudaErrorInvalidValue);
  p.H = 17;  // the plan is for 2 heads (1 head tile), not 17 (2)
  EXPECT_EQ(gpu::launch_fused_decode(vc, vk, p, plan1, nullptr), cudaErrorInvalidValue);
}

}  // namespace
