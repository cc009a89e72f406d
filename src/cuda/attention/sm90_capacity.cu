// SPDX-License-Identifier: Apache-2.0
// The current device's facts the sm_90a plan needs (src/attention/sm90_plan.h's SmCapacity):
// its SMs, and how many clusters of 2..8 SM-filling CTAs it runs at once, asked of the driver
// once per device.
#include <cuda_runtime.h>

#include <cstdint>
#include <iterator>
#include <mutex>

#include "attention/sm90_shapes.h"
#include "cuda/attention/sm90_launch.h"

namespace sparse_swa::detail {
namespace {

// Stands in for the pair kernels in the cluster query: a CTA of theirs fills an SM, and so does
// one of this with more than half an SM's shared memory.
__global__ void sm_filling_kernel() {}
constexpr int kSmFillingBytes = 160 * 1024;
static_assert(sm90::kMaxClusterSplits < static_cast<int>(std::size(SmCapacity{}.clusters)));

SmCapacity ask_device(int device, int32_t num_sms) {
  SmCapacity c = SmCapacity::ideal(num_sms);
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device ||
      cudaFuncSetAttribute(sm_filling_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           kSmFillingBytes) != cudaSuccess) {
    cudaGetLastError();
    return c;
  }
  for (int size = 2; size <= sm90::kMaxClusterSplits; ++size) {
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = static_cast<unsigned>(size);
    cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(size));
    config.blockDim = dim3(sm90::pairs::kThreads);
    config.dynamicSmemBytes = kSmFillingBytes;
    config.attrs = &cluster;
    config.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, sm_filling_kernel, &config) == cudaSuccess) {
      c.clusters[size] = n;
    } else {
      cudaGetLastError();  // no answer: the ideal count stays
    }
  }
  return c;
}

// Asked once per device (every call plans, so no lock after that); past kDevices, every time.
SmCapacity device_capacity(int device, int32_t num_sms) {
  constexpr int kDevices = 64;
  static std::once_flag once[kDevices];
  static SmCapacity known[kDevices];
  if (device < 0 || device >= kDevices) return ask_device(device, num_sms);
  std::call_once(once[device], [&] { known[device] = ask_device(device, num_sms); });
  return known[device].num_sms == num_sms ? known[device] : ask_device(device, num_sms);
}

}  // namespace

cudaError_t current_sm_capacity(SmCapacity* sms) {
  int device = 0, num_sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device);
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    return err;
  }
  *sms = device_capacity(device, num_sms);
  return cudaSuccess;
}

}  // namespace sparse_swa::detail
