// latentq/gpu/device_buffer.h — CUDA error checking and an owning device buffer (host C++ only;
// no device code). Every CUDA runtime call and kernel launch in latentq goes through LQ_CUDA_CHECK.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace latentq::gpu {

/// Throws std::runtime_error "<file>:<line>: <expr> failed: <cudaErrorName>: <cudaGetErrorString>"
/// unless e is cudaSuccess. Used through LQ_CUDA_CHECK.
inline void check_cuda(cudaError_t e, const char* expr, const char* file, int line) {
  if (e == cudaSuccess) return;
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + expr +
                           " failed: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

}  // namespace latentq::gpu

/// Checks a cudaError_t-returning expression (a runtime call or a launcher); throws std::runtime_error.
#define LQ_CUDA_CHECK(expr) ::latentq::gpu::check_cuda((expr), #expr, __FILE__, __LINE__)

namespace latentq::gpu {

/// Owning device allocation of n elements of T (cudaMalloc / cudaFree). Move-only. resize() keeps
/// the allocation when it is large enough (contents are not preserved across a reallocation).
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n, const char* what = "buffer") { resize(n, what); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)), cap_(std::exchange(o.cap_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
      cap_ = std::exchange(o.cap_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { release(); }

  /// Makes room for n elements. Throws std::runtime_error naming `what` and the bytes asked for
  /// if cudaMalloc fails.
  void resize(size_t n, const char* what = "buffer") {
    if (n > cap_) {
      release();
      const size_t bytes = n * sizeof(T);
      void* p = nullptr;
      const cudaError_t e = cudaMalloc(&p, bytes);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();  // an allocation failure is not sticky: clear the last-error slot
        throw std::runtime_error(std::string("cudaMalloc of ") + std::to_string(bytes) + " bytes for " + what +
                                 " failed: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
      }
      p_ = static_cast<T*>(p);
      cap_ = n;
    }
    n_ = n;
  }
  /// Copies n host elements in (resizing to n).
  void upload(const T* h, size_t n, cudaStream_t stream, const char* what = "buffer") {
    resize(n, what);
    if (n) LQ_CUDA_CHECK(cudaMemcpyAsync(p_, h, n * sizeof(T), cudaMemcpyHostToDevice, stream));
  }
  /// Copies size() elements out; the copy has completed when this returns.
  void download(T* h, cudaStream_t stream) const {
    if (n_) {
      LQ_CUDA_CHECK(cudaMemcpyAsync(h, p_, n_ * sizeof(T), cudaMemcpyDeviceToHost, stream));
      LQ_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
  }

  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }
  bool empty() const { return n_ == 0; }

 private:
  void release() noexcept {
    if (p_) (void)cudaFree(p_);  // no throw from a destructor; a failed free leaves nothing to do
    p_ = nullptr;
    n_ = cap_ = 0;
  }
  T* p_ = nullptr;
  size_t n_ = 0;
  size_t cap_ = 0;
};

}  // namespace latentq::gpu
