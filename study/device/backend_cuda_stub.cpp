// The CUDA backend hook for builds without one. A CUDA build provides make_cuda_backend() in
// study/device/backend_cuda.cpp instead of this file (see study/CMakeLists.txt): it must
// return a LatentBackend (latentq/study.h) whose run() gives the CPU reference's numbers, and throw
// std::runtime_error("... no CUDA device ...") when no GPU is present; and device_build_info() for --version.
#include <stdexcept>
#include <string>

#include "latentq/study.h"

namespace latentq {

std::unique_ptr<LatentBackend> make_cuda_backend() {
  throw std::runtime_error(
      "--device cuda: this latentq build has no CUDA backend (configure with -DLATENTQ_CUDA=ON on a machine "
      "with nvcc; the GPU path lives in study/device/backend_cuda.cpp); use --device cpu");
}

std::string device_build_info() { return "cpu (no CUDA backend in this build)"; }

}  // namespace latentq
