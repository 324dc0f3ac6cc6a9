// The CUDA backend of the latent-error study (`latentq run --device cuda`): each cell is quantized
// and dequantized by the kernels of kernels/ (latentq/quantize_cuda.h), whose codes, scales and
// offsets are byte-identical to the CPU reference, so every metric equals the CPU run's; the
// metrics and accounting are computed on the host from the decoded matrix and the stored bytes.
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "latentq/quantize_cuda.h"
#include "latentq/study.h"

namespace latentq {
namespace {

class CudaBackend final : public LatentBackend {
 public:
  std::string name() const override { return "cuda"; }
  bool concurrent() const override { return false; }  // one device, one stream: cells run in turn
  CellResult run(const QuantSpec& spec, Target target, const float* X, int64_t T, int64_t D,
                 std::span<const int64_t> seq_offsets, float* decoded) override {
    std::lock_guard<std::mutex> lock(mu_);
    out_.resize(static_cast<size_t>(T * D));
    QuantizedTensor q;
    quantize_dequantize_gpu(spec, target, X, T, D, seq_offsets, out_.data(), &q);
    if (decoded) std::copy(out_.begin(), out_.end(), decoded);
    return {q.spec, account(q), error_metrics(X, out_.data(), T, D), diagnose(q, X)};
  }

 private:
  std::mutex mu_;
  std::vector<float> out_;  // [T, D] decoded on the device, copied back
};

}  // namespace

std::unique_ptr<LatentBackend> make_cuda_backend() {
  std::string why;
  if (!cuda_device_available(&why))
    throw std::runtime_error("--device cuda: no CUDA device available (" + why + "); use --device cpu");
  return std::make_unique<CudaBackend>();
}

}  // namespace latentq
