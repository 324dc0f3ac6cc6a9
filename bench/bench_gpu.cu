// bench/bench_gpu.cu — CUDA quantize / dequantize benchmarks and the device-to-device copy baseline
// (see bench_common.h for the byte accounting and vs_memcpy). Inputs are generated on the device.
// Timing: CUDA events around each call. quantize_device returns after reading back its status
// (NaN/Inf, overflow), so its time includes that synchronization (~tens of µs); dequantize_device
// is asynchronous and timed kernel to kernel.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "bench_common.h"
#include "latentq/fused_decode_cuda.h"
#include "latentq/quantize_cuda.h"
#include "latentq/transform.h"

namespace latentq::bench {
namespace {

__device__ __forceinline__ uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ float unit(uint64_t h) {
  return (static_cast<float>(h >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

// Latent-like values: a normal (Box–Muller) per element, per-channel scale and offset, 0.1% ×20.
__global__ void fill_latent(float* x /*[n / D, D]*/, int64_t n, int64_t D, uint64_t seed) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = i % D;
    const uint64_t h1 = splitmix64(seed ^ (static_cast<uint64_t>(i) * 2)),
                   h2 = splitmix64(seed ^ (static_cast<uint64_t>(i) * 2 + 1));
    const float z = sqrtf(-2.0f * logf(unit(h1))) * cospif(2.0f * unit(h2));
    const uint64_t hc = splitmix64(seed + 77 + static_cast<uint64_t>(d));
    const float scale = expf(0.7f * (unit(hc) * 2.0f - 1.0f) * 1.7f), offset = 0.2f * (unit(hc >> 7) - 0.5f);
    x[i] = z * scale + offset;
    if ((h1 & 1023) == 0) x[i] *= 20.0f;
  }
}

const float* gpu_input(int64_t T) {
  static std::map<int64_t, gpu::DeviceBuffer<float>> cache;
  auto it = cache.find(T);
  if (it != cache.end()) return it->second.data();
  gpu::DeviceBuffer<float> b(static_cast<size_t>(T * kD), "benchmark input");
  fill_latent<<<4096, 256>>>(b.data(), T * kD, kD, static_cast<uint64_t>(T));
  LQ_CUDA_CHECK(cudaGetLastError());
  LQ_CUDA_CHECK(cudaDeviceSynchronize());
  return cache.emplace(T, std::move(b)).first->second.data();
}

struct Events {
  cudaEvent_t a = nullptr, b = nullptr;
  Events() {
    LQ_CUDA_CHECK(cudaEventCreate(&a));
    LQ_CUDA_CHECK(cudaEventCreate(&b));
  }
  ~Events() {
    (void)cudaEventDestroy(a);
    (void)cudaEventDestroy(b);
  }
  double seconds() {
    LQ_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    LQ_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms * 1e-3;
  }
};

/// Seconds per device-to-device cudaMemcpyAsync of `bytes` (median of ≥ 10 copies). Cached.
double d2d_seconds(int64_t bytes) {
  static std::map<int64_t, double> cache;
  if (auto it = cache.find(bytes); it != cache.end()) return it->second;
  gpu::DeviceBuffer<char> src(static_cast<size_t>(bytes), "copy source"),
      dst(static_cast<size_t>(bytes), "copy target");
  LQ_CUDA_CHECK(cudaMemset(src.data(), 1, static_cast<size_t>(bytes)));
  Events ev;
  std::vector<double> t;
  for (int i = 0; i < 12; ++i) {
    LQ_CUDA_CHECK(cudaEventRecord(ev.a, nullptr));
    LQ_CUDA_CHECK(
        cudaMemcpyAsync(dst.data(), src.data(), static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, nullptr));
    LQ_CUDA_CHECK(cudaEventRecord(ev.b, nullptr));
    if (i >= 2)
      t.push_back(ev.seconds());  // two warm-ups
    else
      (void)ev.seconds();
  }
  std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
  return cache[bytes] = t[t.size() / 2];
}

void set_counters(benchmark::State& st, int64_t bytes, double seconds_total) {
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * bytes);
  const double per_iter = seconds_total / static_cast<double>(std::max<int64_t>(st.iterations(), 1));
  st.counters["vs_memcpy"] = per_iter > 0 ? d2d_seconds((bytes + 1) / 2) / per_iter : 0.0;
  st.counters["MB"] = static_cast<double>(bytes) / 1e6;
}

template <class V>
bool same_bytes(const V& a, const V& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0);
}

// Codes, scales, offsets and decoded values of the device result equal the CPU reference's.
bool identical_to_cpu(const QuantSpec& spec, const float* d_x, int64_t T, const std::vector<int64_t>& seqs,
                      const DeviceQuantized& dq) {
  std::vector<float> X(static_cast<size_t>(T * kD));
  LQ_CUDA_CHECK(cudaMemcpy(X.data(), d_x, X.size() * sizeof(float), cudaMemcpyDeviceToHost));
  const QuantizedTensor cpu = quantize(spec, Target::CKV, X.data(), T, kD, seqs);
  const QuantizedTensor got = to_host(dq);
  if (!same_bytes(cpu.codes, got.codes) || !same_bytes(cpu.scales, got.scales) || !same_bytes(cpu.offsets, got.offsets))
    return false;
  std::vector<float> want(X.size()), have(X.size());
  dequantize(cpu, want.data());
  gpu::DeviceBuffer<float> out(X.size(), "verification output");
  dequantize_device(dq, out.data());
  out.download(have.data(), nullptr);
  return same_bytes(want, have);
}

void bm_quantize(benchmark::State& st, const std::string& spec_s, int64_t T, Options opt) {
  try {
    const QuantSpec spec = QuantSpec::parse(spec_s);
    const float* d_x = gpu_input(T);
    const std::vector<int64_t> seqs = bench_seq_offsets(T);
    DeviceQuantized dq;
    quantize_device(spec, Target::CKV, d_x, T, kD, seqs, dq);  // warm-up, allocations, plan
    const int64_t bytes = T * kD * 4 + dq.storage_bytes();
    Events ev;
    double total = 0;
    for (auto _ : st) {
      LQ_CUDA_CHECK(cudaEventRecord(ev.a, nullptr));
      quantize_device(spec, Target::CKV, d_x, T, kD, seqs, dq);
      LQ_CUDA_CHECK(cudaEventRecord(ev.b, nullptr));
      const double s = ev.seconds();
      st.SetIterationTime(s);
      total += s;
    }
    set_counters(st, bytes, total);
    if (opt.verify && T * kD <= opt.verify_max_elems)
      st.counters["identical"] = identical_to_cpu(spec, d_x, T, seqs, dq) ? 1.0 : 0.0;
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
  }
}

void bm_dequantize(benchmark::State& st, const std::string& spec_s, int64_t T) {
  try {
    const QuantSpec spec = QuantSpec::parse(spec_s);
    DeviceQuantized dq;
    quantize_device(spec, Target::CKV, gpu_input(T), T, kD, bench_seq_offsets(T), dq);
    gpu::DeviceBuffer<float> out(static_cast<size_t>(T * kD), "dequantize output");
    dequantize_device(dq, out.data());  // warm-up (token → group map of channel specs)
    LQ_CUDA_CHECK(cudaDeviceSynchronize());
    const int64_t bytes = dq.storage_bytes() + T * kD * 4;
    Events ev;
    double total = 0;
    for (auto _ : st) {
      LQ_CUDA_CHECK(cudaEventRecord(ev.a, nullptr));
      dequantize_device(dq, out.data());
      LQ_CUDA_CHECK(cudaEventRecord(ev.b, nullptr));
      const double s = ev.seconds();
      st.SetIterationTime(s);
      total += s;
    }
    set_counters(st, bytes, total);
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
  }
}

// The randomized Hadamard forward (`had`: block 64 at D = 576) on the device, in place on a copy of
// the input; counter identical = 1 when the result equals Rotation::forward byte for byte.
void bm_hadamard(benchmark::State& st, int64_t T, Options opt) {
  try {
    const int64_t block = hadamard_block(kD, 0);
    const std::vector<float> signs = hadamard_signs(kD, 0);
    gpu::DeviceBuffer<float> ds, dx(static_cast<size_t>(T * kD), "Hadamard rows");
    ds.upload(signs.data(), signs.size(), nullptr, "Hadamard signs");
    const float* d_in = gpu_input(T);
    Events ev;
    double total = 0;
    for (auto _ : st) {
      LQ_CUDA_CHECK(
          cudaMemcpyAsync(dx.data(), d_in, static_cast<size_t>(T * kD) * 4, cudaMemcpyDeviceToDevice, nullptr));
      LQ_CUDA_CHECK(cudaEventRecord(ev.a, nullptr));
      hadamard_rows_device(dx.data(), T, kD, block, ds.data(), false);
      LQ_CUDA_CHECK(cudaEventRecord(ev.b, nullptr));
      const double s = ev.seconds();
      st.SetIterationTime(s);
      total += s;
    }
    set_counters(st, 2 * T * kD * 4, total);
    if (opt.verify && T * kD <= opt.verify_max_elems) {
      std::vector<float> x(static_cast<size_t>(T * kD)), got(x.size());
      LQ_CUDA_CHECK(cudaMemcpy(x.data(), d_in, x.size() * 4, cudaMemcpyDeviceToHost));
      dx.download(got.data(), nullptr);
      Rotation::hadamard(kD, block, 0).forward(x.data(), T, kD);
      st.counters["identical"] = same_bytes(x, got) ? 1.0 : 0.0;
    }
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
  }
}

void bm_d2d(benchmark::State& st, int64_t bytes) {
  try {
    gpu::DeviceBuffer<char> src(static_cast<size_t>(bytes), "copy source"),
        dst(static_cast<size_t>(bytes), "copy target");
    LQ_CUDA_CHECK(cudaMemset(src.data(), 1, static_cast<size_t>(bytes)));
    Events ev;
    for (auto _ : st) {
      LQ_CUDA_CHECK(cudaEventRecord(ev.a, nullptr));
      LQ_CUDA_CHECK(
          cudaMemcpyAsync(dst.data(), src.data(), static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, nullptr));
      LQ_CUDA_CHECK(cudaEventRecord(ev.b, nullptr));
      st.SetIterationTime(ev.seconds());
    }
    st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * 2 * bytes);  // read + written
    st.counters["MB"] = 2.0 * static_cast<double>(bytes) / 1e6;
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
  }
}

// One decode step of the absorbed attention on the quantized cache (fused_decode_cuda.h): B sequences of L
// keys, H heads, c_kv [B·L, 512] and k_pe [B·L, 64] stored in `spec_s` (a preset: each target in its format),
// queries generated on the device. bytes_per_second: the cache bytes read (codes, scales, offsets of c_kv and
// k_pe: storage_bytes()) per second of the step (both kernels: split-K and combine); vs_memcpy: that rate over a
// device-to-device copy moving as many bytes (read + written) in the same run; us_per_token: the step's time
// per sequence (one decoded token, one layer); splits: the automatic split of the keys.
void bm_fused_decode(benchmark::State& st, const std::string& spec_s, int64_t B, int64_t H, int64_t L) {
  try {
    constexpr int64_t Dc = 512, Dr = 64;
    const QuantSpec spec = QuantSpec::parse(spec_s);
    const int64_t T = B * L;
    std::vector<int64_t> seqs(static_cast<size_t>(B + 1));
    for (int64_t b = 0; b <= B; ++b) seqs[b] = b * L;
    DeviceQuantized dc, dk;
    {
      gpu::DeviceBuffer<float> x(static_cast<size_t>(T * Dc), "fused decode c_kv input");
      fill_latent<<<4096, 256>>>(x.data(), T * Dc, Dc, 1234);
      LQ_CUDA_CHECK(cudaGetLastError());
      quantize_device(spec, Target::CKV, x.data(), T, Dc, seqs, dc);
      fill_latent<<<4096, 256>>>(x.data(), T * Dr, Dr, 5678);
      LQ_CUDA_CHECK(cudaGetLastError());
      quantize_device(spec, Target::KPE, x.data(), T, Dr, seqs, dk);
    }
    gpu::DeviceBuffer<float> ql(static_cast<size_t>(B * H * Dc), "q_lat"), qp(static_cast<size_t>(B * H * Dr), "q_pe"),
        out(static_cast<size_t>(B * H * Dc), "fused decode output"), lse(static_cast<size_t>(B * H), "lse");
    fill_latent<<<1024, 256>>>(ql.data(), B * H * Dc, Dc, 99);
    fill_latent<<<1024, 256>>>(qp.data(), B * H * Dr, Dr, 98);
    LQ_CUDA_CHECK(cudaGetLastError());
    gpu::DeviceBuffer<int64_t> d_seq;
    d_seq.upload(seqs.data(), seqs.size(), nullptr, "seq_offsets");
    const gpu::FusedCacheView vc = gpu::fused_cache_view(dc, gpu::kFusedMaxCkv),
                              vk = gpu::fused_cache_view(dk, gpu::kFusedMaxKpe);
    const gpu::FusedDecodePlan plan = gpu::plan_fused_decode(B, H, Dc, L, 0, gpu::device_sm_count());
    gpu::DeviceBuffer<unsigned char> ws(plan.workspace_bytes, "fused decode workspace");
    gpu::FusedDecodeParams p;
    p.B = B;
    p.H = H;
    p.Dc = Dc;
    p.Dr = Dr;
    p.softmax_scale = 1.0f / std::sqrt(192.0f);
    p.q_lat = ql.data();
    p.q_pe = qp.data();
    p.seq_offsets = d_seq.data();
    p.out = out.data();
    p.lse = lse.data();
    LQ_CUDA_CHECK(gpu::launch_fused_decode(vc, vk, p, plan, ws.data(), nullptr));  // warm-up
    LQ_CUDA_CHECK(cudaDeviceSynchronize());
    const int64_t bytes = dc.storage_bytes() + dk.storage_bytes();
    Events ev;
    double total = 0;
    for (auto _ : st) {
      LQ_CUDA_CHECK(cudaEventRecord(ev.a, nullptr));
      LQ_CUDA_CHECK(gpu::launch_fused_decode(vc, vk, p, plan, ws.data(), nullptr));
      LQ_CUDA_CHECK(cudaEventRecord(ev.b, nullptr));
      const double s = ev.seconds();
      st.SetIterationTime(s);
      total += s;
    }
    set_counters(st, bytes, total);
    const double per_iter = total / static_cast<double>(std::max<int64_t>(st.iterations(), 1));
    st.counters["us_per_token"] = per_iter * 1e6 / static_cast<double>(B);
    st.counters["splits"] = plan.splits;
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
  }
}

/// The fused decode's formats: bf16, integer per-channel (token groups of 32) and per-token, ggml, fp8 tiles
/// with FlashMLA's and vLLM's rules, MXFP4, NVFP4, FlashMLA's FP4 tiles, and the FlashMLA V3.2 record (fp8 c_kv,
/// bf16 k_pe).
std::vector<std::string> fused_decode_specs() {
  return {"bf16",
          "int8-asym-token",
          "int8-sym-channel-g32",
          "int4-asym-channel-g32",
          "int4-sym-token-g32",
          "int2-asym-channel-g32",
          "q8_0",
          "q4_0",
          "fp8-e4m3-tile128-pow2",
          "fp8-e4m3-tile128-fp32",
          "mxfp4",
          "nvfp4",
          "fp4-e2m1-tile16-e4m3",
          "flashmla-v32-fp8"};
}

void bm_unavailable(benchmark::State& st, const std::string& why) {
  for (auto _ : st) {
  }
  st.SkipWithError(("no CUDA device: " + why).c_str());
}

}  // namespace

void register_gpu_benchmarks(const Options& opt) {
  std::string why;
  if (!cuda_device_available(&why)) {
    benchmark::RegisterBenchmark("gpu/unavailable", bm_unavailable, why);
    return;
  }
  benchmark::AddCustomContext("cuda_device", why);
  for (const int64_t T : bench_tokens()) {
    // baseline: device-to-device copy of the float32 [T, 576] matrix
    benchmark::RegisterBenchmark(("gpu/d2d_copy/T:" + std::to_string(T) + "/D:" + std::to_string(kD)).c_str(), bm_d2d,
                                 T * kD * 4)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(bench_name("gpu", "hadamard", "had", T).c_str(), bm_hadamard, T, opt)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    for (const std::string& spec : bench_specs()) {
      // Lloyd-Max and transform coding fit their tables on the host (the matrix copied back): past
      // T = 65,536 a row would time the host fit of up to 600 M values, not the kernels
      if (T > 65536 && (spec.rfind("lm", 0) == 0 || spec.rfind("tc", 0) == 0)) continue;
      benchmark::RegisterBenchmark(bench_name("gpu", "quantize", spec, T).c_str(), bm_quantize, spec, T, opt)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(bench_name("gpu", "dequantize", spec, T).c_str(), bm_dequantize, spec, T)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  // the fused decode: batch x heads x context, B·L ≤ 2^21 tokens (64 x 32k, 8 x 128k)
  for (const std::string& spec : fused_decode_specs())
    for (const int64_t B : {1, 8, 64})
      for (const int64_t H : {16, 128})
        for (const int64_t L : {4096, 32768, 131072}) {
          if (B * L > (int64_t{1} << 21)) continue;
          const std::string name = "gpu/fused_decode/" + spec + "/B:" + std::to_string(B) + "/H:" + std::to_string(H) +
                                   "/L:" + std::to_string(L);
          benchmark::RegisterBenchmark(name.c_str(), bm_fused_decode, spec, B, H, L)
              ->UseManualTime()
              ->Unit(benchmark::kMicrosecond);
        }
}

}  // namespace latentq::bench
