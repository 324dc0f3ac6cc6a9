// latentq/attention/device_seam.h — the one name the study's generic layers need of the attention device seam:
// the factory a compute backend hands to the attention probes (LatentBackend::attention_device ->
// LayerStore -> LayerAccess::attention_device). The device interface itself is declared in
// latentq/attention/engine.h (AttentionDevice) and latentq/attention/types.h (AttentionLayout); the CUDA
// implementation is kernels/attention/attention.cu.
#pragma once

#include <functional>
#include <memory>

namespace latentq::probes {

class AttentionDevice;
struct AttentionLayout;

/// Makes the device side of one layer from its layout (called once per AbsorbedAttention::attach_device).
using AttentionDeviceFactory = std::function<std::unique_ptr<AttentionDevice>(const AttentionLayout&)>;

}  // namespace latentq::probes
