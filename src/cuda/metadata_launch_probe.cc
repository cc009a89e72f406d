// SPDX-License-Identifier: Apache-2.0
// The metadata kernel launched with no rows to write, for the launch probes of bench/.
#include <cuda_runtime.h>

#include "backend.h"
#include "cuda/cuda_utils.h"
#include "cuda/metadata_kernel.cuh"

namespace sparse_swa::detail {

Status cuda_init_metadata_launch_probe(MetadataLaunchProbe* probe) {
  SPARSE_SWA_RETURN_IF_ERROR(check_cuda_device());
  int device = 0;
  SPARSE_SWA_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&device), "cudaGetDevice"));
  MetadataKernelLauncher launcher;
  SPARSE_SWA_RETURN_IF_ERROR(
      cuda_status(init_metadata_kernel_launcher(device, &launcher), "metadata kernel launcher"));
  probe->resident_blocks = launcher.resident_blocks;
  probe->params_bytes = static_cast<int64_t>(sizeof(MetadataKernelParams));
  probe->function = launcher.function;
  probe->cu_launch_kernel = launcher.cu_launch_kernel;
  return Status::Ok();
}

Status cuda_launch_metadata_kernel_without_rows(const MetadataLaunchProbe& probe, void* cuda_stream,
                                                bool driver) {
  MetadataKernelLauncher launcher;
  launcher.resident_blocks = probe.resident_blocks;
  if (driver) {
    launcher.function = probe.function;
    launcher.cu_launch_kernel = probe.cu_launch_kernel;
  }
  const MetadataKernelParams no_rows{};
  return cuda_status(
      launch_metadata_kernel(no_rows, launcher, static_cast<cudaStream_t>(cuda_stream)),
      "metadata kernel launch");
}

}  // namespace sparse_swa::detail
