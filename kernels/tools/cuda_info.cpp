// latentq_cuda_info: prints the CUDA device latentq_cuda would use, or why none is usable.
// Exit status: 0 a device is usable, 1 none (the reason is printed). Used by kernels/gpu_check.sh.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>

#include "latentq/quantize_cuda.h"

int main() {
  std::string why;
  if (!latentq::cuda_device_available(&why)) {
    std::printf("no CUDA device: %s\n", why.c_str());
    return 1;
  }
  int dev = 0, runtime = 0, driver = 0;
  cudaDeviceProp p{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
    std::printf("no CUDA device: cannot read the device properties\n");
    return 1;
  }
  (void)cudaRuntimeGetVersion(&runtime);
  (void)cudaDriverGetVersion(&driver);
  int mem_clock_khz = 0, bus_bits = 0;
  (void)cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, dev);
  (void)cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev);
  const double peak_gbs = 2.0 * mem_clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;  // DDR: two transfers per clock
  std::printf("device %d: %s\n", dev, why.c_str());
  std::printf("  memory %.1f GiB, bus %d bit, memory clock %d MHz, nominal peak %.0f GB/s\n",
              static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0), bus_bits, mem_clock_khz / 1000,
              peak_gbs);
  std::printf("  L2 %d MiB, shared memory per block (opt-in) %zu KiB, CUDA runtime %d, driver %d\n",
              p.l2CacheSize / (1024 * 1024), p.sharedMemPerBlockOptin / 1024, runtime, driver);
  return 0;
}
