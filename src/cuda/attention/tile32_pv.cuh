// SPDX-License-Identifier: Apache-2.0
// The PV role of the tile32 kernel (sm90_tile32_kernel.cu), warpgroups 2-3: O += P V per tile,
// then the finished rows (or a split's partial rows) out (rows_out.cuh).
#pragma once

#include <cstdint>

#include "cuda/attention/ptx.cuh"
#include "cuda/attention/rows_out.cuh"
#include "cuda/attention/sm90_params.h"
#include "cuda/attention/tile32_layout.cuh"

namespace sparse_swa::detail::sm90 {

// Warpgroup g (0, 1) owns dims 256 g + [0, 256) of all 64 rows, as two halves of
// 128; per tile and half four m64n128k16 steps: P's hi columns against V, then its lo columns
// against V again.
template <class L>
__device__ void pv_wgmma(const Tile32Params& a, const Cta<L>& c, int g, int w, int lane) {
  const int d0 = 256 * g;
  const int row = 16 * w + (lane >> 2);  // and row + 8
  float o[2][64];
#pragma unroll
  for (int k = 0; k < 64; ++k) o[0][k] = o[1][k] = 0.0f;
  for (int i = 0; i < c.n; ++i) {
    const int stage = i % L::kKStages;
    const int b = i % L::kPBufs;
    ptx::mbar_wait(c.p_full(b), (i / L::kPBufs) & 1);
    ptx::mbar_wait(c.k_full(stage), (i / L::kKStages) & 1);
    const float* corr_s = reinterpret_cast<const float*>(c.base + L::kCorrOff) + b * kHeadGroup;
    const float c0 = corr_s[row], c1 = corr_s[row + 8];
    if (__any_sync(0xffffffffu, c0 != 1.0f || c1 != 1.0f)) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          o[h][4 * j] *= c0;
          o[h][4 * j + 1] *= c0;
          o[h][4 * j + 2] *= c1;
          o[h][4 * j + 3] *= c1;
        }
      }
    }
    const uint64_t pt = ptx::sw128_desc(c.sbase + L::kPOff + b * kPBytes);
    const uint64_t vt = ptx::sw128_desc(
        c.sbase + kKOff + stage * kKBytes + (d0 / 64) * (kTileKeys * 128), kTileKeys * 128, 1024);
    ptx::wgmma_fence();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint64_t da = ptx::desc_advance(pt, j * 32);
        const uint64_t db = ptx::desc_advance(vt, h * 2 * (kTileKeys * 128) + (j & 1) * 2048);
        ptx::wgmma_m64n128k16_bt(o[h], da, db, true);
      }
    }
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    ptx::mbar_arrive(c.p_empty(b));
    ptx::mbar_arrive(c.k_empty(stage));
  }
  ptx::named_barrier(2, 384);  // (max, sum) of every row are in shared memory
  write_rows(a, c, o, g, row, lane, static_cast<int>(threadIdx.x) - 256, {1.0f, 1.0f});
}

}  // namespace sparse_swa::detail::sm90
