// bench/bench_attention.cpp — the absorbed-attention probe (latentq/attention/attention.h) at DeepSeek-V2-Lite
// shapes (16 heads, kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim = v_head_dim = 128; 4 sequences
// of 2048 tokens, 64 query rows each at positions 31, 63, ..., 2047, as a latentq-dump/1 dump's q_rows),
// single-threaded, as `latentq run` runs one cell:
//   cpu/attention_sgemm/v2lite   the probe's GEMMs alone, through probes::gemm (OpenBLAS sgemm, row-major, as
//                                the probe): per chunk of 8 query rows × 16 heads of one sequence, scores
//                                [128, 512]·[512, nk] + [128, 64]·[64, nk] and output [128, nk]·[nk, 512];
//                                counter GFLOPs = their flops / time (the sgemm rate at those shapes)
//   cpu/attention_sgemm_eigen/v2lite  the same GEMMs through Eigen's own product (what the probe used before
//                                gemm.h; SSE2 only in a portable build); counter vs_blas = its rate / the row above
//   cpu/attention_cell/v2lite    one /attention_error cell of c_kv+k_pe: quantize both targets
//                                (int4-asym-channel-g32), AbsorbedAttention::run with probabilities,
//                                attention_error against the shared reference; counters GFLOPs (the same
//                                GEMM flops / cell time) and gemm_fraction = cell GFLOPs / sgemm GFLOPs
//                                (1 = the cell costs only its GEMMs at the sgemm rate)
//   cpu/attention_group/v2lite   the three /attention_error cells of one quantizer (c_kv, k_pe, c_kv+k_pe) as
//                                `latentq run` computes them together: one quantization per target, the
//                                layer's bf16 stores and bf16(c_kv)'s partial scores shared (computed once
//                                per layer, outside the timing), AbsorbedAttention::run_variants;
//                                counters GFLOPs and gemm_fraction per the three cells' GEMM flops (3× a cell)
//   cpu/attention_position/v2lite  one /attention_position cell's work per decode order (decode-r32-s4-p0,
//                                int4-asym-channel-g32, c_kv+k_pe): two score and two output GEMMs per chunk
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include <Eigen/Dense>

#include "bench_common.h"
#include "latentq/decode_order.h"
#include "latentq/attention/attention.h"
#include "latentq/analysis/gemm.h"
#include "latentq/quantize.h"

namespace latentq::bench {
namespace {

using Clock = std::chrono::steady_clock;
using RowMatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

constexpr int64_t kSeqs = 4, kLen = 2048, kRowsPerSeq = 64, kChunk = 8;
const probes::MlaDims kV2Lite{16, 512, 128, 64, 128};

struct Layer {
  int64_t T = kSeqs * kLen;
  std::vector<int64_t> seq_offsets;
  std::vector<int32_t> q_rows, positions;
  std::vector<float> q_nope, q_pe, w_uk, w_uv, c_kv, k_pe;
  probes::AttentionQueries queries() const {
    return {kV2Lite, T, seq_offsets, q_rows, q_nope, q_pe, w_uk, w_uv, 0.1147214};
  }
};

const Layer& layer() {
  static const Layer l = [] {
    Layer x;
    std::mt19937_64 rng(7);
    std::normal_distribution<float> nd;
    const auto fill = [&](std::vector<float>& v, int64_t n, float sd) {
      v.resize(static_cast<size_t>(n));
      for (float& f : v) f = sd * nd(rng);
    };
    for (int64_t s = 0; s <= kSeqs; ++s) x.seq_offsets.push_back(s * kLen);
    for (int64_t s = 0; s < kSeqs; ++s)
      for (int64_t j = 0; j < kRowsPerSeq; ++j)
        x.q_rows.push_back(static_cast<int32_t>(s * kLen + (j + 1) * kLen / kRowsPerSeq - 1));
    for (int64_t t = 0; t < x.T; ++t) x.positions.push_back(static_cast<int32_t>(t % kLen));
    const int64_t Tq = static_cast<int64_t>(x.q_rows.size()), H = kV2Lite.num_heads, r = kV2Lite.kv_lora_rank;
    fill(x.q_nope, Tq * H * kV2Lite.qk_nope_head_dim, 2.0f);
    fill(x.q_pe, Tq * H * kV2Lite.qk_rope_head_dim, 2.0f);
    fill(x.w_uk, H * kV2Lite.qk_nope_head_dim * r, 1.0f / std::sqrt(float(r)));
    fill(x.w_uv, H * kV2Lite.v_head_dim * r, 1.0f / std::sqrt(float(r)));
    fill(x.c_kv, x.T * r, 1.0f);
    fill(x.k_pe, x.T * kV2Lite.qk_rope_head_dim, 3.0f);
    return x;
  }();
  return l;
}

// The GEMM flops of one absorbed run: per chunk of kChunk rows × H heads over nk keys (the chunk's last row's).
double gemm_flops() {
  const int64_t H = kV2Lite.num_heads, r = kV2Lite.kv_lora_rank, rope = kV2Lite.qk_rope_head_dim;
  double f = 0;
  for (int64_t s = 0; s < kSeqs; ++s)
    for (int64_t j = 0; j < kRowsPerSeq; j += kChunk) {
      const double nk = static_cast<double>((j + kChunk) * kLen / kRowsPerSeq);
      f += 2.0 * kChunk * H * nk * (r + rope + r);
    }
  return f;
}

double& sgemm_gflops() {
  static double g = 0;
  return g;
}

// The probe's GEMMs alone at its shapes: through probes::gemm (OpenBLAS, what the cells use) or, for
// comparison, through Eigen's own product (SSE2 only in a portable build).
void bm_sgemm(benchmark::State& st, bool eigen) {
  const Layer& l = layer();
  const int64_t H = kV2Lite.num_heads, r = kV2Lite.kv_lora_rank, rope = kV2Lite.qk_rope_head_dim;
  std::mt19937_64 rng(8);
  std::normal_distribution<float> nd;
  RowMatF Q(kChunk * H, r), Qp(kChunk * H, rope), O(kChunk * H, r);
  for (int64_t i = 0; i < Q.size(); ++i) Q.data()[i] = nd(rng);
  for (int64_t i = 0; i < Qp.size(); ++i) Qp.data()[i] = nd(rng);
  double total = 0;
  for (auto _ : st) {
    const auto t0 = Clock::now();
    for (int64_t s = 0; s < kSeqs; ++s)
      for (int64_t j = 0; j < kRowsPerSeq; j += kChunk) {
        const int64_t nk = (j + kChunk) * kLen / kRowsPerSeq;
        const Eigen::Map<const RowMatF> C(l.c_kv.data() + l.seq_offsets[s] * r, nk, r);
        const Eigen::Map<const RowMatF> K(l.k_pe.data() + l.seq_offsets[s] * rope, nk, rope);
        RowMatF S(kChunk * H, nk);
        if (eigen) {
          S.noalias() = Q * C.transpose();
          S.noalias() += Qp * K.transpose();
          O.noalias() = S * C;
        } else {
          using probes::Op;
          probes::gemm<float>(Op::N, Op::T, 1, Q, C, 0, S);
          probes::gemm<float>(Op::N, Op::T, 1, Qp, K, 1, S);
          probes::gemm<float>(Op::N, Op::N, 1, S, C, 0, O);
        }
        benchmark::DoNotOptimize(O.data());
      }
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    st.SetIterationTime(sec);
    total += sec;
  }
  const double g = gemm_flops() * static_cast<double>(st.iterations()) / total / 1e9;
  if (!eigen) sgemm_gflops() = g;
  st.counters["GFLOPs"] = g;
  if (eigen && sgemm_gflops() > 0) st.counters["vs_blas"] = g / sgemm_gflops();
}

void bm_group(benchmark::State& st) {
  const OneThread one;
  const Layer& l = layer();
  const probes::AbsorbedAttention<float> att(l.queries());
  const probes::AttentionResult<float> ref = att.run(l.c_kv, l.k_pe, true);
  const probes::AttentionReference<float> prepared(ref);  // once per layer, as in a run
  const QuantSpec spec = QuantSpec::parse("int4-asym-channel-g32"), bf16 = QuantSpec::parse("bf16");
  const Rotation id;
  std::vector<float> ckv(l.c_kv.size()), kpe(l.k_pe.size()), ckv_b(l.c_kv.size()), kpe_b(l.k_pe.size());
  quantize_dequantize_rotated(bf16, id, Target::CKV, l.c_kv.data(), l.T, kV2Lite.kv_lora_rank, l.seq_offsets,
                              ckv_b.data());
  quantize_dequantize_rotated(bf16, id, Target::KPE, l.k_pe.data(), l.T, kV2Lite.qk_rope_head_dim, l.seq_offsets,
                              kpe_b.data());
  const auto scores = att.ckv_scores(ckv_b);
  double total = 0;
  for (auto _ : st) {
    const auto t0 = Clock::now();
    quantize_dequantize_rotated(spec, id, Target::CKV, l.c_kv.data(), l.T, kV2Lite.kv_lora_rank, l.seq_offsets,
                                ckv.data());
    quantize_dequantize_rotated(spec, id, Target::KPE, l.k_pe.data(), l.T, kV2Lite.qk_rope_head_dim, l.seq_offsets,
                                kpe.data());
    using V = probes::AbsorbedAttention<float>::Variant;
    const std::vector<V> vs = {{ckv, kpe_b, nullptr}, {ckv_b, kpe, &scores}, {ckv, kpe, nullptr}};
    for (const auto& r : att.run_variants(vs, true))
      benchmark::DoNotOptimize(probes::attention_error(prepared, r).kl_mean);
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    st.SetIterationTime(sec);
    total += sec;
  }
  const double g = 3.0 * gemm_flops() * static_cast<double>(st.iterations()) / total / 1e9;
  st.counters["GFLOPs"] = g;
  if (sgemm_gflops() > 0) st.counters["gemm_fraction"] = g / sgemm_gflops();
}

void bm_cell(benchmark::State& st, bool decode) {
  const OneThread one;
  const Layer& l = layer();
  const probes::AbsorbedAttention<float> att(l.queries());
  const probes::AttentionResult<float> ref = att.run(l.c_kv, l.k_pe, true);
  const probes::AttentionReference<float> prepared(ref);  // once per layer, as in a run
  const QuantSpec spec = QuantSpec::parse("int4-asym-channel-g32");
  const Rotation id;
  std::vector<float> ckv(l.c_kv.size()), kpe(l.k_pe.size());
  const DecodeOrder order{CacheMode::Decode, 32, 4, 0};
  double total = 0;
  for (auto _ : st) {
    const auto t0 = Clock::now();
    if (decode) {
      const probes::DecodeOrderInput in{l.c_kv, l.k_pe, l.seq_offsets, l.q_rows, l.positions};
      const auto e =
          probes::decode_order_attention(att, prepared, in, probes::DecodeOrderQuantizer{spec}, {&order, 1}, 64);
      benchmark::DoNotOptimize(e.data());
    } else {
      quantize_dequantize_rotated(spec, id, Target::CKV, l.c_kv.data(), l.T, kV2Lite.kv_lora_rank, l.seq_offsets,
                                  ckv.data());
      quantize_dequantize_rotated(spec, id, Target::KPE, l.k_pe.data(), l.T, kV2Lite.qk_rope_head_dim, l.seq_offsets,
                                  kpe.data());
      const probes::AttentionError e = probes::attention_error(prepared, att.run(ckv, kpe, true));
      benchmark::DoNotOptimize(e.kl_mean);
    }
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    st.SetIterationTime(sec);
    total += sec;
  }
  const double g = gemm_flops() * static_cast<double>(st.iterations()) / total / 1e9;
  st.counters["GFLOPs"] = g;
  if (sgemm_gflops() > 0) st.counters["gemm_fraction"] = g / sgemm_gflops();
}

}  // namespace

void register_attention_benchmarks(const Options&) {
  // sgemm first: the cell rows report their rate as a fraction of it.
  benchmark::RegisterBenchmark("cpu/attention_sgemm/v2lite", bm_sgemm, false)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("cpu/attention_sgemm_eigen/v2lite", bm_sgemm, true)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("cpu/attention_cell/v2lite", bm_cell, false)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("cpu/attention_group/v2lite", bm_group)->UseManualTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("cpu/attention_position/v2lite", bm_cell, true)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
}

}  // namespace latentq::bench
