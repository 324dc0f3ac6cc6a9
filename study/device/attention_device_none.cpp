// The CUDA backend's attention device in a CUDA build without cuBLAS (LATENTQ_CUBLAS=OFF, or none found at
// configure time; study/CMakeLists.txt picks this file instead of attention_device_cuda.cpp): there is none,
// so `--device cuda` quantizes on the GPU and keeps the attention probes on the CPU, saying why.
#include <string>

#include "latentq/attention_device_cuda.h"

namespace latentq {

probes::AttentionDeviceFactory cuda_attention_device(std::string* why) {
  if (why) *why = "this build has no cuBLAS (configured with LATENTQ_CUBLAS=OFF, or none found)";
  return {};
}

const char* cuda_attention_build() { return "attention on the CPU: built without cuBLAS"; }

}  // namespace latentq
