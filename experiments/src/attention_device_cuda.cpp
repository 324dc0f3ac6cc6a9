// The CUDA backend's attention device (latentq/study.h make_cuda_attention_device): probes::AttentionDevice
// over latentq::DeviceAbsorbedAttention (kernels/include/latentq/attention_cuda.h). Built with cuBLAS
// (LATENTQ_CUBLAS); test_gpu_emu compiles it against the host emulator's kernels.
#include <memory>
#include <vector>

#include "latentq/attention_cuda.h"
#include "latentq/attention_device_cuda.h"

namespace latentq {
namespace {

std::vector<DeviceAttentionSegment> segments_of(const probes::AttentionLayout& l) {
  std::vector<DeviceAttentionSegment> s;
  s.reserve(l.segments.size());
  for (const probes::AttentionSegment& g : l.segments) s.push_back({g.begin, g.end, g.key_begin, g.nk});
  return s;
}

class CudaAttentionDevice final : public probes::AttentionDevice {
 public:
  explicit CudaAttentionDevice(const probes::AttentionLayout& l)
      : dev_(l.dims.num_heads, l.dims.kv_lora_rank, l.dims.qk_rope_head_dim, l.dims.v_head_dim, l.num_tokens,
             l.softmax_scale, l.nkeys, segments_of(l), l.q_lat, l.q_pe, l.w_uv) {}
  void run(const float* c_kv, const float* k_pe, float* out_sorted, float* probs) const override {
    dev_.run(c_kv, k_pe, out_sorted, probs);
  }

 private:
  DeviceAbsorbedAttention dev_;
};

}  // namespace

std::unique_ptr<probes::AttentionDevice> make_cuda_attention_device(const probes::AttentionLayout& layout) {
  return std::make_unique<CudaAttentionDevice>(layout);
}

}  // namespace latentq
