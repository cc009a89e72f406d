// SPDX-License-Identifier: Apache-2.0
// The merge of split-KV slices (docs/design.md#splits): the slices of a (token, head) row left
// unnormalised partials (O, max, sum) in the workspace; this kernel combines them into the
// finished row and its lse, after the attention kernel on the same stream. (Slices merged inside
// a cluster need no merge kernel: cluster_merge.cuh.)
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/attention/sm90_common.cuh"
#include "cuda/attention/sm90_kernels.h"
#include "cuda/attention/sm90_params.h"

namespace sparse_swa::detail::sm90 {
namespace {

// Merges the splits of a (token, head) row: kThreads threads per row, 512 / kThreads floats of it
// each, the splits read kBatch at a time with every load in flight (a round trip per batch, not
// two per split), their weights 2^(m_s - M) kept against a running M; then the same finish as
// an unsplit kernel's. Few rows take 128 threads each, many take a warp (fewer registers per row).
template <int kThreads, int kBatch>
__global__ void __launch_bounds__(256, 4)
    split_merge_kernel(const __grid_constant__ MergeParams a) {
  constexpr int kVecs = kHeadDim / 4 / kThreads;            // float4s per thread
  const int64_t first = first_split_row(a);                 // rows before it are finished
  const int64_t rows = a.num_tokens * a.num_heads - first;  // the split rows
  const int64_t r = int64_t{blockIdx.x} * (256 / kThreads) + threadIdx.x / kThreads;
  if (r >= rows) return;
  const int64_t row = first + r;
  const int col = threadIdx.x % kThreads;  // float4 columns col + kThreads j
  float m = -INFINITY, l = 0.0f;
  float4 acc[kVecs];
#pragma unroll
  for (int j = 0; j < kVecs; ++j) acc[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int s0 = 0; s0 < a.splits; s0 += kBatch) {
    float2 ml[kBatch];
    float4 v[kBatch][kVecs];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int64_t prow = int64_t{s0 + k} * rows + r;
      const bool in = s0 + k < a.splits;
      ml[k] = in ? a.partial_ml[prow] : make_float2(-INFINITY, 0.0f);
      const float4* po = reinterpret_cast<const float4*>(a.partial_o + prow * kHeadDim);
#pragma unroll
      for (int j = 0; j < kVecs; ++j) {
        v[k][j] = in ? po[col + kThreads * j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
    float mb = m;
#pragma unroll
    for (int k = 0; k < kBatch; ++k) mb = fmaxf(mb, ml[k].x);
    if (mb == -INFINITY) continue;
    const float corr = exp2f(m - mb);  // m = -inf: 0, and acc, l are still 0
    l *= corr;
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      acc[j].x *= corr;
      acc[j].y *= corr;
      acc[j].z *= corr;
      acc[j].w *= corr;
    }
    m = mb;
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const float w = exp2f(ml[k].x - m);  // an empty split has max -inf: weight 0
      if (w == 0.0f) continue;             // (and its O is not used: 0 * inf would be NaN)
      l += w * ml[k].y;
#pragma unroll
      for (int j = 0; j < kVecs; ++j) {
        acc[j].x += w * v[k][j].x;
        acc[j].y += w * v[k][j].y;
        acc[j].z += w * v[k][j].z;
        acc[j].w += w * v[k][j].w;
      }
    }
  }
  const RowFinish f = finish_row(m, l, a.sinks != nullptr ? a.sinks + row % a.num_heads : nullptr);
  uint16_t* y = a.out + row * kHeadDim;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    *reinterpret_cast<uint2*>(y + 4 * (col + kThreads * j)) =
        make_uint2(pack_bf16(acc[j].x * f.factor, acc[j].y * f.factor),
                   pack_bf16(acc[j].z * f.factor, acc[j].w * f.factor));
  }
  if (col == 0) a.lse[row] = f.lse;
}

}  // namespace

Status launch_split_merge(const MergeParams& a, int row_threads, cudaStream_t stream) {
  const int64_t rows = a.num_tokens * a.num_heads - first_split_row(a);
  if (row_threads == 128) {
    split_merge_kernel<128, 4><<<static_cast<unsigned>((rows + 1) / 2), 256, 0, stream>>>(a);
  } else {
    split_merge_kernel<32, 2><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(a);
  }
  return Status::Ok();
}

}  // namespace sparse_swa::detail::sm90
