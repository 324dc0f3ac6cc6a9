// latentq_bench: Google Benchmark executable for the quantizers — CPU reference always, CUDA
// kernels when built with LATENTQ_CUDA (bench_gpu.cu). Names: <cpu|gpu>/<op>/<spec>/T:<T>/D:576,
// baselines cpu/memcpy/... and gpu/d2d_copy/...; select with --benchmark_filter=<regex>.
// Counters: bytes_per_second (read + written), vs_memcpy (see bench_common.h), identical (GPU with
// --lq_verify: 1 if codes, scales, offsets and decoded values equal the CPU reference's).
//
// Own flags (removed before Google Benchmark parses the rest):
//   --lq_cpu_max_tokens=N     register CPU benchmarks up to T = N (default 65536; max 1048576)
//   --lq_verify               GPU: after timing, compare with the CPU reference
//   --lq_verify_max_elems=N   ... only where T·D ≤ N (default 2^28)
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_common.h"
#if !defined(LATENTQ_BENCH_QUANT_ONLY)  // kernels/standalone builds the quantizer rows alone
#include "latentq/analysis/gemm.h"
#endif

int main(int argc, char** argv) {
  latentq::bench::Options opt;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      const std::string f = std::string(flag) + "=";
      return a.rfind(f, 0) == 0 ? argv[i] + f.size() : nullptr;
    };
    if (const char* v = value("--lq_cpu_max_tokens"))
      opt.cpu_max_tokens = std::atoll(v);
    else if (const char* v = value("--lq_verify_max_elems"))
      opt.verify_max_elems = std::atoll(v);
    else if (a == "--lq_verify")
      opt.verify = true;
    else {
      if (a == "--help") {
        std::printf(
            "latentq_bench own flags:\n  --lq_cpu_max_tokens=N  (default 65536)\n  --lq_verify\n"
            "  --lq_verify_max_elems=N  (default 268435456)\nGoogle Benchmark flags follow.\n");
      }
      rest.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(rest.size());
  rest.push_back(nullptr);
  latentq::bench::register_cpu_benchmarks(opt);
#if !defined(LATENTQ_BENCH_QUANT_ONLY)
  latentq::bench::register_attention_benchmarks(opt);
  latentq::bench::register_study_benchmarks(opt);
  latentq::bench::register_plan_benchmarks(opt);
#endif
#if defined(LATENTQ_BENCH_GPU)
  latentq::bench::register_gpu_benchmarks(opt);
#endif
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 1;
#if !defined(LATENTQ_BENCH_QUANT_ONLY)
  benchmark::AddCustomContext("blas", latentq::probes::blas_backend());  // the attention rows' GEMMs
#endif
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
