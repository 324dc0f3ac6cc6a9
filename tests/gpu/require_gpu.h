// tests/gpu/require_gpu.h — every GPU test starts with LQ_REQUIRE_GPU(): it skips with "no CUDA device:
// <reason>" where no device is usable (latentq::cuda_device_available; the host emulator always has one).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "latentq/quantize_cuda.h"

#define LQ_REQUIRE_GPU()                                                                    \
  do {                                                                                      \
    std::string why_;                                                                       \
    if (!latentq::cuda_device_available(&why_)) GTEST_SKIP() << "no CUDA device: " << why_; \
  } while (0)
