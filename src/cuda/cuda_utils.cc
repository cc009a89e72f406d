// SPDX-License-Identifier: Apache-2.0
#include "cuda/cuda_utils.h"

namespace sparse_swa::detail {

Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return internal_error(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
}

Status check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return internal_error(what, ": kernel launch failed: ", cudaGetErrorString(err));
  }
  return Status::Ok();
}

bool cuda_device_usable() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return count > 0;
}

Status check_cuda_device() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    cudaGetLastError();
    return unavailable("backend cuda: no usable CUDA device (",
                       err != cudaSuccess ? cudaGetErrorString(err) : "0 devices", ")");
  }
  return Status::Ok();
}

bool stream_capturing(void* stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return status != cudaStreamCaptureStatusNone;
}

Status check_device_pointer(const void* ptr, const char* name) {
  if (ptr == nullptr) return invalid_argument(name, ": null device pointer");
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) {
    cudaGetLastError();  // not sticky; do not leave it for the next launch check
    return invalid_argument(name, ": not a CUDA pointer (", cudaGetErrorString(err), ")");
  }
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    return invalid_argument(name, ": expected device or managed memory, got ",
                            attr.type == cudaMemoryTypeHost ? "pinned host" : "unregistered host",
                            " memory");
  }
  return Status::Ok();
}

}  // namespace sparse_swa::detail
