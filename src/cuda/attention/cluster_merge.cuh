// SPDX-License-Identifier: Apache-2.0
// The split-KV merge of the pair kernels inside a cluster: the a.splits slices of a (token,
// head group) run as one cluster (rank = split), each leaves its unnormalised O rows and (max,
// sum) in its own shared memory, and after a cluster barrier each CTA merges every a.splits-th
// row from all of them through distributed shared memory into the finished rows. No fp32
// partials in global memory and no merge kernel; docs/design.md#attention-kernels.
#pragma once

#include <cstdint>

#include "attention/sm90_shapes.h"
#include "cuda/attention/ptx.cuh"
#include "cuda/attention/sm90_common.cuh"
#include "cuda/attention/sm90_params.h"

namespace sparse_swa::detail::sm90 {

// A stashed row: 512 fp32 and 8 more, so that the 8 rows of a warp's fragment stores start 32
// bytes apart in the banks (two wavefronts a store, the fewest for 256 bytes).
constexpr int kStashRowBytes = (kHeadDim + 8) * 4;
constexpr int kStashBytes = kHeadGroup * kStashRowBytes;  // [64][520] fp32 at kQOff
static_assert(kStashBytes <= 3 * kQBytes, "the stash lies over Q and the K buffers");

// Math warpgroup w's accumulators (dims 256 w + [0, 256) of rows `row` and row + 8, the m64n256
// layout of two halves) into the stash. Only once both warpgroups are past their last wgmma:
// the stash lies over Q and the K buffers.
template <class L>
__device__ __forceinline__ void stash_rows(const Cta<L>& c, const float (&o)[2][64], int w, int row,
                                           int lane) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    uint8_t* dst = c.base + kQOff + (row + 8 * half) * kStashRowBytes;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const int col = 256 * w + j * 8 + 2 * (lane & 3);
      *reinterpret_cast<float2*>(dst + col * 4) =
          make_float2(o[j >> 4][4 * (j & 15) + 2 * half], o[j >> 4][4 * (j & 15) + 2 * half + 1]);
    }
  }
}

// The float4 columns of this CTA's `rows` rows (rank + kSplits k), kItems per thread at a time
// with the loads of all kSplits slices in flight; `weights` as merge_cluster_rows leaves them.
template <int kItems, int kSplits, class P>
__device__ __forceinline__ void merge_cluster_columns(const P& a, const int64_t row0,
                                                      const uint32_t (&peer)[kMaxClusterSplits],
                                                      const float* weights, int rank, int rows,
                                                      int t) {
  constexpr int kWeights = kMaxClusterSplits + 1;
  for (int i0 = t; i0 < rows * 128; i0 += 256 * kItems) {
    float4 v[kItems][kSplits];
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int i = i0 + 256 * j, k = i >> 7;
      const uint32_t offset = kQOff + (rank + kSplits * k) * kStashRowBytes + 16 * (i & 127);
#pragma unroll
      for (int s = 0; s < kSplits; ++s) {
        if (i < rows * 128) v[j][s] = ptx::ld_cluster_f4(peer[s] + offset);
      }
    }
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int i = i0 + 256 * j, k = i >> 7;
      if (i >= rows * 128) break;
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int s = 0; s < kSplits; ++s) {
        const float w = weights[k * kWeights + s];
        if (w == 0.0f) continue;
        acc.x += w * v[j][s].x;
        acc.y += w * v[j][s].y;
        acc.z += w * v[j][s].z;
        acc.w += w * v[j][s].w;
      }
      const float factor = weights[k * kWeights + kMaxClusterSplits];
      const int64_t row = row0 + rank + kSplits * k;
      *reinterpret_cast<uint2*>(a.out + row * kHeadDim + 4 * (i & 127)) = make_uint2(
          pack_bf16(acc.x * factor, acc.y * factor), pack_bf16(acc.z * factor, acc.w * factor));
    }
  }
}

// merge_cluster_columns with the slice count `splits` (2..kMaxClusterSplits) as a template
// argument and about 24 remote loads in flight per thread (24 / splits columns, 3 to 8).
template <int kSplits = 2, class P>
__device__ __forceinline__ void merge_cluster_columns_for(int splits, const P& a, int64_t row0,
                                                          const uint32_t (&peer)[kMaxClusterSplits],
                                                          const float* weights, int rank, int rows,
                                                          int t) {
  if constexpr (kSplits < kMaxClusterSplits) {
    if (splits != kSplits) {
      return merge_cluster_columns_for<kSplits + 1>(splits, a, row0, peer, weights, rank, rows, t);
    }
  }
  constexpr int kItems = 24 / kSplits < 3 ? 3 : (24 / kSplits > 8 ? 8 : 24 / kSplits);
  merge_cluster_columns<kItems, kSplits>(a, row0, peer, weights, rank, rows, t);
}

// After a cluster barrier: this CTA (rank c.split) finishes rows c.split + a.splits k of its
// head group from every rank's stash and (max, sum) at L::kMlOff, by the 256 math threads (t =
// 0..255); the same arithmetic as split_merge_kernel. Each row's weights 2^(m_s - M) and final
// factor first (a thread a row, into shared memory past the stash), then the rows' float4
// columns several at a time per thread with all their remote loads in flight: a remote load
// takes hundreds of cycles, so one row at a time would leave the merge latency-bound.
template <class P, class L>
__device__ __forceinline__ void merge_cluster_rows(const P& a, const Cta<L>& c, int t) {
  constexpr int kWeights = kMaxClusterSplits + 1;  // per row: the slices' weights, the factor
  static_assert(kQOff + kStashBytes + kHeadGroup * kWeights * 4 <= L::kPOff);
  const int splits = a.splits, rank = c.split;
  const int rows = (c.heads - rank + splits - 1) / splits;
  float* weights = reinterpret_cast<float*>(c.base + kQOff + kStashBytes);  // [64][kWeights]
  uint32_t peer[kMaxClusterSplits];
#pragma unroll
  for (int s = 0; s < kMaxClusterSplits; ++s) {
    peer[s] = ptx::cluster_map(c.sbase, static_cast<uint32_t>(min(s, splits - 1)));
  }
  if (t < rows) {
    const int r = rank + splits * t;
    float2 ml[kMaxClusterSplits];
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      if (s < splits) ml[s] = ptx::ld_cluster_f2(peer[s] + L::kMlOff + 8 * r);
    }
    float m = -INFINITY;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      if (s < splits) m = fmaxf(m, ml[s].x);
    }
    float l = 0.0f;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      // An empty slice has max -inf: weight 0 (and its O, zeros, adds nothing).
      const float w = s < splits && m != -INFINITY ? exp2f(ml[s].x - m) : 0.0f;
      l += w * (s < splits ? ml[s].y : 0.0f);
      weights[t * kWeights + s] = w;
    }
    const int64_t row = c.t * a.num_heads + c.h0 + r;
    const RowFinish f = finish_row(m, l, a.sinks != nullptr ? a.sinks + c.h0 + r : nullptr);
    weights[t * kWeights + kMaxClusterSplits] = f.factor;
    a.lse[row] = f.lse;
  }
  ptx::named_barrier(6, 256);  // the weights are in shared memory
  merge_cluster_columns_for(splits, a, c.t * a.num_heads + c.h0, peer, weights, rank, rows, t);
}

}  // namespace sparse_swa::detail::sm90
