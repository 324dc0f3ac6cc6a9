// The CUDA backend of the latent-error study (`latentq run --device cuda`): each cell is quantized
// and dequantized by the kernels of kernels/ (latentq/quantize_cuda.h), whose codes, scales and
// offsets are byte-identical to the CPU reference, so every metric equals the CPU run's; the
// accounting and diagnostics are computed on the host from the stored bytes, the metrics by
// run_latent_error from the decoded matrix. With cuBLAS, the /attention_error and /attention_position (decode
// order) cells run on the device too, their metrics included (attention_device(): latentq/attention_cuda.h);
// without it (cuda_attention_device: latentq/attention_device_cuda.h) they stay on the CPU, and make_cuda_backend
// says so. The attention check, the fold check, the SVD and cross-layer probes stay on the CPU.
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "latentq/attention_device_cuda.h"
#include "latentq/quantize_cuda.h"
#include "latentq/study.h"

namespace latentq {
namespace {

class CudaBackend final : public LatentBackend {
 public:
  std::string name() const override { return "cuda"; }
  // One device, one stream: the quantize and dequantize of the cells run in turn (mu_), while the cells' host work
  // (rotations, the error metrics against X, the spectra, the accounting) runs on every worker thread. With
  // false, the batch ran each latent-error cell whole under one lock: on one H200 (commit 4b101e0) the
  // V2-Lite-shaped study's 336 latent-error cells took 1,351 thread-seconds (90 s wall on 16 threads) against
  // 122 on the CPU (36 s wall).
  bool concurrent() const override { return true; }
  // The /attention_error cells on the device too (cuBLAS); empty keeps them on the CPU (make_cuda_backend says so).
  probes::AttentionDeviceFactory attention_device() const override { return attention_; }
  probes::AttentionDeviceFactory attention_;  // cuda_attention_device (make_cuda_backend)
  StoredCell run(const QuantSpec& spec, Target target, const float* X, int64_t T, int64_t D,
                 std::span<const int64_t> seq_offsets, float* decoded) override {
    QuantizedTensor q;
    {
      const std::lock_guard<std::mutex> lock(mu_);
      quantize_dequantize_gpu(spec, target, X, T, D, seq_offsets, decoded, &q);
    }
    return {q.spec, account(q), diagnose(q, X)};  // host code on the stored bytes, outside the lock
  }

 private:
  std::mutex mu_;
};

}  // namespace

std::unique_ptr<LatentBackend> make_cuda_backend() {
  std::string why;
  if (!cuda_device_available(&why))
    throw std::runtime_error("--device cuda: no CUDA device available (" + why + "); use --device cpu");
  auto b = std::make_unique<CudaBackend>();
  b->attention_ = cuda_attention_device(&why);
  if (!b->attention_) std::fprintf(stderr, "--device cuda: the attention probes run on the CPU: %s\n", why.c_str());
  return b;
}

std::string device_build_info() { return std::string("cpu, cuda (") + cuda_attention_build() + ")"; }

}  // namespace latentq
