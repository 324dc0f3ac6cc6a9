// bench/bench_cpu.cpp — CPU reference quantize / dequantize benchmarks and the single-threaded
// std::memcpy baseline (see bench_common.h for the byte accounting and vs_memcpy).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "bench_common.h"
#include "latentq/fitted.h"
#include "latentq/quantize.h"
#include "latentq/transform.h"

namespace latentq::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Latent-like [T, D] input: per-channel scale and offset, 0.1% outliers ×20. Cached per T.
const std::vector<float>& cpu_input(int64_t T) {
  static std::map<int64_t, std::vector<float>> cache;
  auto it = cache.find(T);
  if (it != cache.end()) return it->second;
  std::mt19937_64 rng(static_cast<uint64_t>(T));
  std::normal_distribution<float> nd;
  std::vector<float> scale(kD), offset(kD);
  for (int64_t d = 0; d < kD; ++d) {
    scale[d] = std::exp(0.7f * nd(rng));
    offset[d] = 0.2f * nd(rng);
  }
  std::vector<float> X(static_cast<size_t>(T * kD));
  for (int64_t i = 0; i < T * kD; ++i) X[i] = nd(rng) * scale[i % kD] + offset[i % kD];
  for (int64_t k = 0; k < T * kD / 1000; ++k) X[rng() % (T * kD)] *= 20.0f;
  return cache.emplace(T, std::move(X)).first->second;
}

/// Seconds per single-threaded std::memcpy of `bytes` (median of ≥ 5 copies and ≥ 0.2 s), measured again
/// when the last measurement of that size is more than 5 s old: each ratio's memcpy is taken beside its
/// row (a VM's bandwidth drifts by ±20% over the minutes of a run; one figure at the start skewed the
/// rows after it).
double memcpy_seconds(int64_t bytes) {
  static std::map<int64_t, std::pair<double, Clock::time_point>> cache;
  if (auto it = cache.find(bytes);
      it != cache.end() && std::chrono::duration<double>(Clock::now() - it->second.second).count() < 5.0)
    return it->second.first;
  std::unique_ptr<char[]> src(new char[static_cast<size_t>(bytes)]), dst(new char[static_cast<size_t>(bytes)]);
  std::memset(src.get(), 1, static_cast<size_t>(bytes));
  std::memset(dst.get(), 2, static_cast<size_t>(bytes));
  std::vector<double> t;
  const auto start = Clock::now();
  while (t.size() < 5 || std::chrono::duration<double>(Clock::now() - start).count() < 0.2) {
    const auto t0 = Clock::now();
    std::memcpy(dst.get(), src.get(), static_cast<size_t>(bytes));
    benchmark::ClobberMemory();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
  cache[bytes] = {t[t.size() / 2], Clock::now()};
  return t[t.size() / 2];
}

void set_counters(benchmark::State& st, int64_t bytes, double seconds_total) {
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * bytes);
  const double per_iter = seconds_total / static_cast<double>(std::max<int64_t>(st.iterations(), 1));
  const double ref = memcpy_seconds((bytes + 1) / 2);  // a copy moving the same read + written bytes
  st.counters["vs_memcpy"] = per_iter > 0 ? ref / per_iter : 0.0;
  st.counters["memcpy_GBps"] =
      ref > 0 ? static_cast<double>(2 * ((bytes + 1) / 2)) / ref / 1e9 : 0.0;  // read + written
  st.counters["MB"] = static_cast<double>(bytes) / 1e6;
}

// The integer kernel and thread count of one benchmark, restored to the defaults (Auto, 1) when it ends.
struct KernelScope {
  KernelScope(CpuKernel k, int threads) {
    set_cpu_kernel(k);
    set_cpu_threads(threads);
  }
  ~KernelScope() {
    set_cpu_kernel(CpuKernel::Auto);
    set_cpu_threads(1);
  }
};

void bm_quantize(benchmark::State& st, const std::string& spec_s, int64_t T, CpuKernel kernel, int threads) {
  const KernelScope ks(kernel, threads);
  const QuantSpec spec = QuantSpec::parse(spec_s);
  const std::vector<float>& X = cpu_input(T);
  const std::vector<int64_t> seqs = bench_seq_offsets(T);
  const int64_t bytes = T * kD * 4 + quantize(spec, Target::CKV, X.data(), T, kD, seqs).storage_bytes();
  double total = 0;
  for (auto _ : st) {
    const auto t0 = Clock::now();
    QuantizedTensor q = quantize(spec, Target::CKV, X.data(), T, kD, seqs);
    benchmark::DoNotOptimize(q.codes.data());
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    st.SetIterationTime(s);
    total += s;
  }  // q is freed outside the timed region
  set_counters(st, bytes, total);
}

// quantize_into() a tensor kept across iterations (a loop over matrices of one spec and shape): the
// buffers are reused, no allocation or page faults in the timed region.
void bm_quantize_into(benchmark::State& st, const std::string& spec_s, int64_t T, CpuKernel kernel, int threads) {
  const KernelScope ks(kernel, threads);
  const QuantSpec spec = QuantSpec::parse(spec_s);
  const std::vector<float>& X = cpu_input(T);
  const std::vector<int64_t> seqs = bench_seq_offsets(T);
  QuantizedTensor q;
  quantize_into(q, spec, Target::CKV, X.data(), T, kD, seqs);  // first call: allocates
  const int64_t bytes = T * kD * 4 + q.storage_bytes();
  double total = 0;
  for (auto _ : st) {
    const auto t0 = Clock::now();
    quantize_into(q, spec, Target::CKV, X.data(), T, kD, seqs);
    benchmark::DoNotOptimize(q.codes.data());
    benchmark::ClobberMemory();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    st.SetIterationTime(s);
    total += s;
  }
  set_counters(st, bytes, total);
}

void bm_dequantize(benchmark::State& st, const std::string& spec_s, int64_t T, CpuKernel kernel, int threads) {
  const KernelScope ks(kernel, threads);
  const QuantSpec spec = QuantSpec::parse(spec_s);
  const QuantizedTensor q = quantize(spec, Target::CKV, cpu_input(T).data(), T, kD, bench_seq_offsets(T));
  std::vector<float> out(static_cast<size_t>(T * kD), 0.0f);
  const int64_t bytes = q.storage_bytes() + T * kD * 4;
  double total = 0;
  for (auto _ : st) {
    const auto t0 = Clock::now();
    dequantize(q, out.data());
    benchmark::ClobberMemory();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    st.SetIterationTime(s);
    total += s;
  }
  set_counters(st, bytes, total);
}

// Fit once, encode fast (latentq/fitted.h) for the codebook families: `fit` times fit_quantizer() alone (it
// reads the fit split of X; its bytes are counted as quantize's, T·D·4 + storage, so that its vs_memcpy compares
// with quantize's), `encode` encode_into() a tensor kept across iterations (as cpu-into/quantize: no allocation
// in the timed region) with a fit made before it, `decode` decode() with that fit.
enum class FitOp { Fit, Encode, Decode };
void bm_fitted(benchmark::State& st, const std::string& spec_s, int64_t T, FitOp op) {
  const KernelScope ks(CpuKernel::Auto, 1);
  const QuantSpec spec = QuantSpec::parse(spec_s);
  const std::vector<float>& X = cpu_input(T);
  const std::vector<int64_t> seqs = bench_seq_offsets(T);
  const QuantFit fit = fit_quantizer(spec, Target::CKV, X.data(), T, kD, seqs);
  QuantizedTensor q = encode(fit, X.data(), T, seqs);
  const int64_t bytes = T * kD * 4 + q.storage_bytes();
  std::vector<float> out(static_cast<size_t>(T * kD), 0.0f);
  double total = 0;
  for (auto _ : st) {
    const auto t0 = Clock::now();
    if (op == FitOp::Fit) {
      const QuantFit f = fit_quantizer(spec, Target::CKV, X.data(), T, kD, seqs);
      benchmark::DoNotOptimize(f.global.data());
    } else if (op == FitOp::Encode) {
      encode_into(q, fit, X.data(), T, seqs);
      benchmark::DoNotOptimize(q.codes.data());
    } else {
      decode(fit, q, out.data());
    }
    benchmark::ClobberMemory();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    st.SetIterationTime(s);
    total += s;
  }
  set_counters(st, bytes, total);
}

// The randomized Hadamard (latentq/transform.h, `had`: block 64 at D = 576) forward on [T, 576]: reads and
// writes T·576·4 bytes; the input is restored outside the timed region.
void bm_hadamard(benchmark::State& st, int64_t T) {
  const Rotation r = Rotation::make(Transform::parse("had"), kD);
  const std::vector<float>& X = cpu_input(T);
  std::vector<float> buf(X);
  const int64_t bytes = 2 * T * kD * 4;
  double total = 0;
  for (auto _ : st) {
    std::copy(X.begin(), X.end(), buf.begin());
    const auto t0 = Clock::now();
    r.forward(buf.data(), T, kD);
    benchmark::ClobberMemory();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    st.SetIterationTime(s);
    total += s;
  }
  set_counters(st, bytes, total);
}

void bm_memcpy(benchmark::State& st, int64_t bytes) {
  std::unique_ptr<char[]> src(new char[static_cast<size_t>(bytes)]), dst(new char[static_cast<size_t>(bytes)]);
  std::memset(src.get(), 1, static_cast<size_t>(bytes));
  std::memset(dst.get(), 2, static_cast<size_t>(bytes));
  for (auto _ : st) {
    std::memcpy(dst.get(), src.get(), static_cast<size_t>(bytes));
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * 2 * bytes);  // read + written
  st.counters["MB"] = 2.0 * static_cast<double>(bytes) / 1e6;
}

}  // namespace

void register_cpu_benchmarks(const Options& opt) {
  for (const int64_t T : bench_tokens()) {
    if (T > opt.cpu_max_tokens) continue;
    // baseline: copy of the float32 [T, 576] matrix (reads and writes T·576·4 bytes)
    benchmark::RegisterBenchmark(("cpu/memcpy/T:" + std::to_string(T) + "/D:" + std::to_string(kD)).c_str(), bm_memcpy,
                                 T * kD * 4)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(bench_name("cpu", "hadamard", "had", T).c_str(), bm_hadamard, T)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    for (const std::string& spec : bench_specs()) {
      // cpu: the default kernel (CpuKernel::Auto), one thread; at T = 65,536 the integer specs also run
      // on the reference loops (cpu-ref) and on two threads (cpu-2t), and quantize_into() a reused tensor
      // (cpu-into, one thread)
      struct Variant {
        const char* device;
        CpuKernel kernel;
        int threads;
      };
      std::vector<Variant> variants = {{"cpu", CpuKernel::Auto, 1}};
      if (T == 65536 && spec.rfind("int", 0) == 0) {
        variants.push_back({"cpu-ref", CpuKernel::Reference, 1});
        variants.push_back({"cpu-2t", CpuKernel::Auto, 2});
      }
      if (T == 65536 && spec.rfind("int", 0) == 0)
        benchmark::RegisterBenchmark(bench_name("cpu-into", "quantize", spec, T).c_str(), bm_quantize_into, spec, T,
                                     CpuKernel::Auto, 1)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond);
      if (T == 65536 && (spec.rfind("tq", 0) == 0 || spec.rfind("lm", 0) == 0 || spec.rfind("tc", 0) == 0))
        for (const auto& [op, name] :
             {std::pair{FitOp::Fit, "fit"}, {FitOp::Encode, "encode"}, {FitOp::Decode, "decode"}})
          if (op != FitOp::Fit || spec.rfind("tq", 0) != 0)  // tq fits nothing (its codebook depends on D alone)
            benchmark::RegisterBenchmark(bench_name("cpu", name, spec, T).c_str(), bm_fitted, spec, T, op)
                ->UseManualTime()
                ->Unit(benchmark::kMillisecond);
      for (const Variant& v : variants) {
        benchmark::RegisterBenchmark(bench_name(v.device, "quantize", spec, T).c_str(), bm_quantize, spec, T, v.kernel,
                                     v.threads)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond);
        benchmark::RegisterBenchmark(bench_name(v.device, "dequantize", spec, T).c_str(), bm_dequantize, spec, T,
                                     v.kernel, v.threads)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
}

}  // namespace latentq::bench
