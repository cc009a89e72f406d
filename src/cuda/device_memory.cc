// Device memory entry points for src/device_copies.cc (CUDA builds).
#include <cuda_runtime.h>

#include <cstddef>

#include "sparse_swa/status.h"

namespace sparse_swa::detail {

namespace {
Status check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return internal_error(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
}
}  // namespace

Status device_alloc(void** ptr, size_t bytes) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    *ptr = nullptr;
    return unavailable("device memory: no usable CUDA device");
  }
  return check(cudaMalloc(ptr, bytes), "cudaMalloc");
}
void device_free(void* ptr) { cudaFree(ptr); }
Status copy_host_to_device(void* dst, const void* src, size_t bytes) {
  return check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy(host to device)");
}
Status copy_device_to_host(void* dst, const void* src, size_t bytes) {
  return check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy(device to host)");
}

}  // namespace sparse_swa::detail
