// latentq/attention_device_cuda.h — the CUDA backend's attention device (`latentq run --device cuda`).
#pragma once

#include <memory>

#include "latentq/attention/attention.h"

namespace latentq {

/// The device side of one layer's absorbed attention for probes::AbsorbedAttention::attach_device:
/// latentq::DeviceAbsorbedAttention (kernels/include/latentq/attention_cuda.h: cuBLAS sgemm and a softmax
/// kernel) on `layout`. Defined in builds with cuBLAS only (study/device/attention_device_cuda.cpp).
/// Throws std::invalid_argument for an inconsistent layout and std::runtime_error for a CUDA or cuBLAS
/// failure (an allocation naming its bytes).
std::unique_ptr<probes::AttentionDevice> make_cuda_attention_device(const probes::AttentionLayout& layout);

}  // namespace latentq
