// latentq/attention_device_cuda.h — the CUDA backend's attention device (`latentq run --device cuda`).
#pragma once

#include <memory>
#include <string>

#include "latentq/attention/attention.h"

namespace latentq {

/// The device side of one layer's absorbed attention for probes::AbsorbedAttention::attach_device:
/// latentq::DeviceAbsorbedAttention (kernels/include/latentq/attention_cuda.h: cuBLAS sgemm and a softmax
/// kernel) on `layout`. Defined in builds with cuBLAS only (study/device/attention_device_cuda.cpp).
/// Throws std::invalid_argument for an inconsistent layout and std::runtime_error for a CUDA or cuBLAS
/// failure (an allocation naming its bytes).
std::unique_ptr<probes::AttentionDevice> make_cuda_attention_device(const probes::AttentionLayout& layout);

/// The CUDA backend's attention device (LatentBackend::attention_device): make_cuda_attention_device when this
/// build has cuBLAS and it loads on a CUDA device (cuda_attention_available); otherwise empty, the attention
/// probes staying on the CPU, with the reason in *why (one line, no trailing newline). The one place that
/// knows whether the build has cuBLAS: study/device/attention_device_cuda.cpp defines it in builds with
/// cuBLAS, study/device/attention_device_none.cpp in CUDA builds without (LATENTQ_CUBLAS=OFF, or none found).
probes::AttentionDeviceFactory cuda_attention_device(std::string* why);

/// Where this build runs the attention probes under `--device cuda`, for `latentq --version`: "attention on
/// the GPU: cuBLAS" or "attention on the CPU: built without cuBLAS". Loads nothing.
const char* cuda_attention_build();

}  // namespace latentq
