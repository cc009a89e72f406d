// SPDX-License-Identifier: Apache-2.0
// CUDA plumbing shared by every CUDA source and the CUDA tests: CUDA errors as a Status, the
// launch check, device and pointer checks, owned device and pinned buffers, warp helpers.
// Host parts are plain C++ with the CUDA runtime; the warp helpers only exist under nvcc.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/int_limits.h"
#include "sparse_swa/status.h"

namespace sparse_swa::detail {

// Ok for cudaSuccess, else INTERNAL "what: cudaErrorName (description)".
Status cuda_status(cudaError_t err, const char* what);
// After a kernel launch: Ok, or INTERNAL "what: kernel launch failed: description".
Status check_launch(const char* what);

// True when a CUDA device can be used (clears the sticky "no device" error otherwise).
bool cuda_device_usable();
// Ok, or UNAVAILABLE "backend cuda: no usable CUDA device (why)".
Status check_cuda_device();
// True while `stream` (a cudaStream_t) is being captured into a graph. Launchers skip the
// pointer-attribute queries then: capture must record kernels only.
bool stream_capturing(void* stream);
// Ok when `ptr` is device (or managed) memory the current device can read; `name` prefixes the
// message. A host pointer handed to a kernel would fault, so launchers check first.
Status check_device_pointer(const void* ptr, const char* name);

// Owned cudaMalloc allocation of n elements of T (none for n = 0).
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  // Frees what the buffer held, then allocates n elements.
  Status allocate(size_t n) {
    reset();
    if (n == 0) return Status::Ok();
    const cudaError_t err = cudaMalloc(reinterpret_cast<void**>(&ptr_), n * sizeof(T));
    if (err != cudaSuccess) {
      ptr_ = nullptr;
      return cuda_status(err, "cudaMalloc");
    }
    size_ = n;
    return Status::Ok();
  }
  void reset() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    size_ = 0;
  }
  T* get() const { return ptr_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }

 private:
  T* ptr_ = nullptr;
  size_t size_ = 0;
};

// Owned page-locked host allocation of n elements of T (none for n = 0).
template <typename T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
  }

  Status allocate(size_t n) {
    if (n == 0) return Status::Ok();
    const cudaError_t err = cudaMallocHost(reinterpret_cast<void**>(&ptr_), n * sizeof(T));
    if (err != cudaSuccess) ptr_ = nullptr;
    return cuda_status(err, "cudaMallocHost");
  }
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
};

#if defined(__CUDACC__)
inline constexpr int kWarpSize = 32;
inline constexpr unsigned kFullWarpMask = 0xffffffffu;

// op over the 32 lanes (xor butterfly: every lane gets the result, in the same order).
template <typename T, typename Op>
__device__ __forceinline__ T warp_allreduce(T v, Op op) {
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(kFullWarpMask, v, o));
  return v;
}
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  return warp_allreduce(v, [](T a, T b) { return a + b; });
}
__device__ __forceinline__ float warp_max(float v) {
  return warp_allreduce(v, [](float a, float b) { return fmaxf(a, b); });
}
#endif

}  // namespace sparse_swa::detail
