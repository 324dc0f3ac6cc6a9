// bench/bench_common.h — shared pieces of latentq_bench: the benchmarked specs and sizes, inputs,
// byte accounting and the memcpy-ratio convention.
//
// Byte accounting: quantize reads T·D·4 bytes and writes storage_bytes() (codes + scales + offsets);
// dequantize reads storage_bytes() and writes T·D·4. The "bytes_per_second" column counts read +
// written bytes. vs_memcpy = that bandwidth / the bandwidth of a copy moving the same traffic
// (a copy of M = (read + written) / 2 bytes reads M and writes M), measured in the same binary:
// single-threaded std::memcpy for CPU benchmarks (measured again beside a row when the last copy of
// that size is more than 5 s old), cudaMemcpyAsync device-to-device for GPU ones.
// Targets (documented, not asserted): GPU ≥ 0.85 at ≥ 64M elements; CPU quantize ≥ 0.60 and
// dequantize ≥ 0.80 for every integer format at T = 65,536, D = 576.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace latentq::bench {

/// One thread for OpenMP-parallel code (Eigen) while in scope, as `latentq run` runs one cell.
struct OneThread {
#ifdef _OPENMP
  int old = omp_get_max_threads();
  OneThread() { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(old); }
#endif
};

/// kv_lora_rank + qk_rope_head_dim of DeepSeek-V2/V3 (512 + 64): the benchmarked D.
inline constexpr int64_t kD = 576;
/// Tokens of one benchmark sequence (channel -g0 groups span one sequence).
inline constexpr int64_t kSeqTokens = 4096;

struct Options {
  int64_t cpu_max_tokens = 65536;               ///< CPU benchmarks up to this T (--lq_cpu_max_tokens)
  bool verify = false;                          ///< GPU: compare with the CPU reference after timing (--lq_verify)
  int64_t verify_max_elems = int64_t{1} << 28;  ///< ... for T·D up to this (--lq_verify_max_elems)
};

/// INT8/4/2 × {asym, sym} × {tensor, channel-g32, channel-g0, token-g32, token-g0}, then the block formats
/// (engine FP8 tiles, per-tensor FP8, MX, NVFP4, FlashMLA FP4, ggml), TurboQuant / Lloyd-Max / transform
/// coding, and bf16.
inline std::vector<std::string> bench_specs() {
  std::vector<std::string> out;
  for (const char* g : {"tensor", "channel-g32", "channel-g0", "token-g32", "token-g0"})
    for (const char* scheme : {"asym", "sym"})
      for (const int bits : {8, 4, 2}) out.push_back("int" + std::to_string(bits) + "-" + scheme + "-" + g);
  for (const char* b : {"fp8-e4m3-tile128-pow2", "fp8-e4m3-tile128-fp32", "fp8-e4m3-tile32-pow2-ue8m0",
                        "fp8-e4m3-tensor", "mxfp8", "mxfp4", "nvfp4", "fp4-e2m1-tile16-e4m3", "q8_0", "q4_0", "q4_1"})
    out.push_back(b);
  // the non-uniform and transform-coding families (quant/README.md): TurboQuant's MSE stage, Lloyd-Max
  // codebooks and transform coding, each quantize including its fit on the fit split (latentq/split.h)
  for (const char* b : {"tq2-nc", "tq3-nc", "tq4-nc", "lm3-tensor", "lm3-channel", "tc3", "tc2-lm"}) out.push_back(b);
  out.push_back("bf16");
  return out;
}

/// Benchmarked T (tokens): 4096·576 = 2.4M up to 1,048,576·576 = 604M elements.
inline std::vector<int64_t> bench_tokens() { return {4096, 16384, 65536, 262144, 1048576}; }

/// Sequences of kSeqTokens tokens (the last one shorter if T is not a multiple).
inline std::vector<int64_t> bench_seq_offsets(int64_t T) {
  std::vector<int64_t> s{0};
  for (int64_t t = kSeqTokens; t < T; t += kSeqTokens) s.push_back(t);
  s.push_back(T);
  return s;
}

/// Benchmark name: "<device>/<op>/<spec>/T:<T>/D:<D>".
inline std::string bench_name(const char* device, const char* op, const std::string& spec, int64_t T) {
  return std::string(device) + "/" + op + "/" + spec + "/T:" + std::to_string(T) + "/D:" + std::to_string(kD);
}

void register_cpu_benchmarks(const Options& opt);
/// The absorbed-attention probe at DeepSeek-V2-Lite shapes (bench_attention.cpp).
void register_attention_benchmarks(const Options& opt);
/// The default study's stages at DeepSeek-V2-Lite shape (bench_study.cpp).
void register_study_benchmarks(const Options& opt);
/// cpu/plan/...: the planner's solver at DeepSeek-V3 size (bench_plan.cpp).
void register_plan_benchmarks(const Options& opt);
#if defined(LATENTQ_BENCH_GPU)
void register_gpu_benchmarks(const Options& opt);
#endif

}  // namespace latentq::bench
