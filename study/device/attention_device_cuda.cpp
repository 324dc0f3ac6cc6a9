// The CUDA backend's attention device (latentq/attention_device_cuda.h make_cuda_attention_device):
// probes::AttentionDevice over latentq::DeviceAbsorbedAttention (kernels/include/latentq/attention_cuda.h),
// attention_error's terms included (computes_error_terms: the probabilities stay on the device). Built with cuBLAS
// (study/CMakeLists.txt; a CUDA build without it takes study/device/attention_device_none.cpp); test_gpu_emu
// compiles it against the host emulator's kernels.
#include <cstdint>
#include <memory>
#include <string>
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
             l.softmax_scale, l.nkeys, segments_of(l), l.q_lat, l.q_pe, l.w_uv),
        nkeys_(l.nkeys.size()),
        heads_(l.dims.num_heads) {}
  void run(const float* c_kv, const float* k_pe, float* out_sorted, float* probs) const override {
    dev_.run(c_kv, k_pe, out_sorted, probs);
  }
  bool computes_error_terms() const override { return true; }
  void keep_reference(const float* c_kv, const float* k_pe, float* out_sorted) const override {
    dev_.keep_reference(c_kv, k_pe, out_sorted);
  }
  void error_terms(const float* c_kv, const float* k_pe, probes::AttentionPairTerms* terms) const override {
    terms_of(c_kv, k_pe, nullptr, terms);
  }
  bool runs_mixed() const override { return true; }
  void run_mixed(const float* c_kv_a, const float* k_pe_a, const float* c_kv_b, const float* k_pe_b,
                 const int64_t* ranges, float* out_sorted, float* probs) const override {
    dev_.run_mixed(c_kv_a, k_pe_a, DeviceMixedStores{c_kv_b, k_pe_b, ranges}, out_sorted, probs);
  }
  void error_terms_mixed(const float* c_kv_a, const float* k_pe_a, const float* c_kv_b, const float* k_pe_b,
                         const int64_t* ranges, probes::AttentionPairTerms* terms) const override {
    const DeviceMixedStores b{c_kv_b, k_pe_b, ranges};
    terms_of(c_kv_a, k_pe_a, &b, terms);
  }

 private:
  void terms_of(const float* c_kv, const float* k_pe, const DeviceMixedStores* mixed,
                probes::AttentionPairTerms* terms) const {
    const int64_t n = static_cast<int64_t>(nkeys_) * heads_;
    std::vector<DeviceAttentionTerms> d(static_cast<size_t>(n));
    dev_.error_terms(c_kv, k_pe, mixed, probes::kKlProbFloor, d.data());
    for (int64_t q = 0; q < n; ++q) {
      const DeviceAttentionTerms& x = d[q];
      probes::AttentionPairTerms& t = terms[q];
      t.kl = x.kl, t.dot = x.dot, t.ref2 = x.ref2, t.test2 = x.test2, t.err2 = x.err2;
      t.equal = x.equal != 0, t.top1 = x.top1 != 0, t.top_common = x.top_common;
      t.nonfinite_probs = x.nonfinite_probs, t.nonfinite_out = x.nonfinite_out;
    }
  }

  DeviceAbsorbedAttention dev_;
  size_t nkeys_;   // Tq
  int64_t heads_;  // H
};

}  // namespace

std::unique_ptr<probes::AttentionDevice> make_cuda_attention_device(const probes::AttentionLayout& layout) {
  return std::make_unique<CudaAttentionDevice>(layout);
}

probes::AttentionDeviceFactory cuda_attention_device(std::string* why) {
  if (!cuda_attention_available(why)) return {};
  return make_cuda_attention_device;
}

const char* cuda_attention_build() { return "attention on the GPU: cuBLAS"; }

}  // namespace latentq
