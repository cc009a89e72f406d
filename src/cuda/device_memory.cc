// SPDX-License-Identifier: Apache-2.0
// Device memory entry points for src/device_copies.cc.
#include <cuda_runtime.h>

#include <cstddef>

#include "backend.h"
#include "cuda/cuda_utils.h"

namespace sparse_swa::detail {

Status cuda_device_alloc(void** ptr, size_t bytes) {
  if (!cuda_device_usable()) {
    *ptr = nullptr;
    return unavailable("device memory: no usable CUDA device");
  }
  return cuda_status(cudaMalloc(ptr, bytes), "cudaMalloc");
}
void cuda_device_free(void* ptr) { cudaFree(ptr); }
bool cuda_stream_capturing(void* cuda_stream) { return stream_capturing(cuda_stream); }
Status cuda_copy_host_to_device(void* dst, const void* src, size_t bytes) {
  return cuda_status(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice),
                     "cudaMemcpy(host to device)");
}
Status cuda_copy_device_to_host(void* dst, const void* src, size_t bytes) {
  return cuda_status(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost),
                     "cudaMemcpy(device to host)");
}

}  // namespace sparse_swa::detail
