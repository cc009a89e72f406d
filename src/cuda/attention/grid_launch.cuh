// SPDX-License-Identifier: Apache-2.0
// Host launch of the kernels that take items (token x head group x split): the pair kernels and
// the few-heads kernel, one CTA per item, CTAs that walk items, or clusters of a token's slices.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "attention/sm90_shapes.h"
#include "cuda/attention/sm90_params.h"
#include "sparse_swa/status.h"

namespace sparse_swa::detail::sm90 {

// The configuration of `ctas` pair-kernel CTAs (`smem` bytes each) in clusters of `size` along x.
struct ClusterLaunch {
  cudaLaunchAttribute cluster{};
  cudaLaunchConfig_t config{};
  ClusterLaunch(unsigned ctas, unsigned size, size_t smem, cudaStream_t stream) {
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = size;
    cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
    config.gridDim = dim3(ctas);
    config.blockDim = dim3(pairs::kThreads);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    config.attrs = &cluster;
    config.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;  // config points at this object's attribute
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// Whether clusters of `splits` CTAs of kKernel (`smem` bytes each) can run on this device at all
// (a partition with few SMs per GPC may hold none); asked once per cluster size.
template <auto kKernel>
bool clusters_fit(int splits, size_t smem) {
  static std::once_flag once[kMaxClusterSplits + 1];
  static bool fits[kMaxClusterSplits + 1] = {};
  std::call_once(once[splits], [splits, smem] {
    const ClusterLaunch launch(static_cast<unsigned>(splits), static_cast<unsigned>(splits), smem,
                               nullptr);
    int clusters = 0;
    const cudaError_t err = cudaOccupancyMaxActiveClusters(&clusters, kKernel, &launch.config);
    if (err != cudaSuccess) cudaGetLastError();  // a refusal is an answer, not this call's error
    fits[splits] = err == cudaSuccess && clusters > 0;
  });
  return fits[splits];
}

// Launches kKernel over the items of `a` (launch_items) with `smem` bytes of dynamic shared
// memory (reserved once per kernel): one CTA per item, at most `max_ctas` CTAs that walk items
// (max_ctas > 0, kernels whose CTAs walk them), or with `cluster` = a.splits (2..8, clusters that
// clusters_fit) the slices of each (token, head group) as one cluster.
template <auto kKernel, class P>
Status launch_item_grid(const P& a, size_t smem, int threads, unsigned max_ctas, unsigned cluster,
                        cudaStream_t stream) {
  static std::once_flag once;
  static cudaError_t attr_err = cudaSuccess;
  std::call_once(once, [smem] {
    attr_err = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem));
  });
  if (attr_err != cudaSuccess) {
    return internal_error("sparse_attention: cannot reserve ", smem,
                          " bytes of shared memory per CTA: ", cudaGetErrorString(attr_err));
  }
  const unsigned ctas = static_cast<unsigned>(launch_items(a));
  if (cluster == 0) {
    const unsigned grid = max_ctas > 0 ? std::min(ctas, max_ctas) : ctas;
    kKernel<<<grid, threads, smem, stream>>>(a);
    return Status::Ok();
  }
  const ClusterLaunch launch(ctas, cluster, smem, stream);
  const cudaError_t err = cudaLaunchKernelEx(&launch.config, kKernel, a);
  if (err != cudaSuccess) {
    return internal_error("sparse_attention: cannot launch clusters of ", cluster,
                          " CTAs: ", cudaGetErrorString(err));
  }
  return Status::Ok();
}

}  // namespace sparse_swa::detail::sm90
