// SPDX-License-Identifier: Apache-2.0
// The QK + softmax role of the tile32 kernel (sm90_tile32_kernel.cu), warpgroup 1: S = Q K^T per
// tile, the online softmax, P's bf16 hi and lo parts for PV.
#pragma once

#include <cstdint>

#include "cuda/attention/ptx.cuh"
#include "cuda/attention/sm90_params.h"
#include "cuda/attention/tile32_layout.cuh"

namespace sparse_swa::detail::sm90 {

// ---- QK + softmax: warp q of warpgroup 1 owns head rows 16q..16q+15 ----

// Starts S = Q K^T of K stage `stage` for all 64 rows (wgmma, asynchronous: one commit group);
// d gets the m16n8 accumulator layout (n-tile j in d[4j..4j+3]) of warp q's 16 rows.
template <class L>
__device__ __forceinline__ void qk_issue_wgmma(const Cta<L>& c, int stage, float (&d)[16]) {
  const uint32_t q_base = c.sbase + kQOff;
  const uint32_t k_base = c.sbase + kKOff + stage * kKBytes;
  const uint64_t q_desc = ptx::sw128_desc(q_base), k_desc = ptx::sw128_desc(k_base);
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    const uint32_t step = (kk & 3) * 32;  // 16 bf16 along K inside a 128-byte row
    const uint64_t da = ptx::desc_advance(q_desc, (kk >> 2) * (kHeadGroup * 128) + step);
    const uint64_t db = ptx::desc_advance(k_desc, (kk >> 2) * (kTileKeys * 128) + step);
    if (kk == 0) {
      ptx::wgmma_m64n32k16_first(d, da, db);
    } else {
      ptx::wgmma_m64n32k16(d, da, db, true);
    }
  }
  ptx::wgmma_commit();
}

// The online softmax of tile i from warp q's S (rows 16q + lane / 4 and + 8): P's hi and lo
// parts and the rows' rescale factors into P buffer i % 2, then p_full. Releases K stage i.
struct SoftmaxState {
  float m[2] = {-INFINITY, -INFINITY};  // running max, log2 units
  float l[2] = {0.0f, 0.0f};            // this thread's part of the running sum
};
template <class L>
__device__ __forceinline__ void softmax_tile(const Tile32Params& a, const Cta<L>& c, int i, int q,
                                             int lane, const float (&d)[16], SoftmaxState& st) {
  const int stage = i % L::kKStages;
  const int b = i % L::kPBufs;
  const int row = 16 * q + (lane >> 2);
  const uint32_t mask = *reinterpret_cast<const uint32_t*>(c.base + L::kValidKOff + stage * 4);
  ptx::mbar_arrive(c.k_empty(stage));
  if (i >= L::kPBufs) ptx::mbar_wait(c.p_empty(b), ((i / L::kPBufs) - 1) & 1);
  uint8_t* pt = c.base + L::kPOff + b * kPBytes;
  float* corr_s = reinterpret_cast<float*>(c.base + L::kCorrOff) + b * kHeadGroup;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row + 8 * half;
    uint8_t* prow = pt + r * 128 + 4 * (lane & 3);
    float x[4][2];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool valid = (mask >> (j * 8 + 2 * (lane & 3) + e)) & 1u;
        x[j][e] = valid ? d[4 * j + 2 * half + e] * a.scale_log2 : -INFINITY;
        mx = fmaxf(mx, x[j][e]);
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = next_max(st.m[half], mx);
    const bool none = m_new == -INFINITY;
    const float corr = none ? 1.0f : fast_exp2(st.m[half] - m_new);
    st.m[half] = m_new;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float p0 = none ? 0.0f : fast_exp2(x[j][0] - m_new);
      const float p1 = none ? 0.0f : fast_exp2(x[j][1] - m_new);
      sum += p0 + p1;
      const uint32_t h = pack_bf16(p0, p1);
      const float2 hf = unpack_bf16(h);
      // Column j * 8 + 2 (lane % 4) of the hi half (chunk j) and of the lo half (chunk 4 + j).
      *reinterpret_cast<uint32_t*>(prow + ((j ^ (r & 7)) << 4)) = h;
      *reinterpret_cast<uint32_t*>(prow + (((4 + j) ^ (r & 7)) << 4)) =
          pack_bf16(p0 - hf.x, p1 - hf.y);
    }
    st.l[half] = st.l[half] * corr + sum;
    if ((lane & 3) == 0) corr_s[r] = corr;
  }
  ptx::fence_proxy_async();  // wgmma reads P through the async proxy
  ptx::mbar_arrive(c.p_full(b));
}

// The role's loop: per tile, S by one wgmma chain over all 64 rows of the group (faster at
// every head count than MMAs that skip the empty rows), then its softmax. (Tile i + 1's wgmma in
// flight during tile i's softmax was slower.)
template <class L>
__device__ void qk_softmax(const Tile32Params& a, const Cta<L>& c, int q, int lane) {
  SoftmaxState st;
  for (int i = 0; i < c.n; ++i) {
    ptx::mbar_wait(c.k_full(i % L::kKStages), (i / L::kKStages) & 1);
    float d[16];
    qk_issue_wgmma(c, i % L::kKStages, d);
    ptx::wgmma_wait<0>();
    softmax_tile(a, c, i, q, lane, d, st);
  }
  float2* ml = reinterpret_cast<float2*>(c.base + L::kMlOff);
  const int row = 16 * q + (lane >> 2);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float l = st.l[half];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if ((lane & 3) == 0) ml[row + 8 * half] = make_float2(st.m[half], l);
  }
  ptx::named_barrier(2, 384);  // the PV warps read (max, sum) next
}

}  // namespace sparse_swa::detail::sm90
