// SPDX-License-Identifier: Apache-2.0
// How the 64-row kernels' finished rows and split partials leave a CTA (the tile32 kernel's PV
// warpgroups and the pair kernels' math warpgroups hold O alike: warpgroup g dims 256 g +
// [0, 256) of rows `row` and row + 8, the m64n256 layout of two halves): bf16 rows with their
// lse, or fp32 partials with their (max, sum).
#pragma once

#include <cstdint>

#include "cuda/attention/ptx.cuh"
#include "cuda/attention/sm90_common.cuh"
#include "cuda/attention/sm90_params.h"

namespace sparse_swa::detail::sm90 {

// Where one output row goes: finished (bf16 out, lse) or, when split, this slice's partial.
struct RowOut {
  uint16_t* y = nullptr;  // [512] bf16, or nullptr when partial
  float* py = nullptr;    // [512] fp32 partial
  float factor = 0.0f;    // every value is multiplied by it
};
// Row r of the group; `writer` also stores its lse / (max, sum).
template <class P, class L>
__device__ __forceinline__ RowOut row_out(const P& a, const Cta<L>& c, int r, bool writer) {
  const float2 st = reinterpret_cast<const float2*>(c.base + L::kMlOff)[r];
  const float m = st.x, l = st.y;
  const int head = c.head(a, r);
  const int64_t row = L::kQueryGroups ? c.row(a, r) : c.t * a.num_heads + head;
  RowOut o;
  if (finished_token(a, c.t)) {
    const RowFinish f = finish_row(m, l, a.sinks != nullptr ? a.sinks + head : nullptr);
    o.factor = f.factor;
    o.y = a.out + row * kHeadDim;
    if (writer) a.lse[row] = f.lse;
  } else {
    const int64_t prow = partial_row(a, c.split, row);
    o.py = a.partial_o + prow * kHeadDim;
    o.factor = 1.0f;
    if (writer) a.partial_ml[prow] = make_float2(m, l);
  }
  return o;
}
__device__ __forceinline__ void put2(const RowOut& o, int d, float x, float y) {
  if (o.y != nullptr) {
    *reinterpret_cast<uint32_t*>(o.y + d) = pack_bf16(x * o.factor, y * o.factor);
  } else {
    *reinterpret_cast<float2*>(o.py + d) = make_float2(x * o.factor, y * o.factor);
  }
}

// Calls put(r, ro, col, x, y) for each pair of values this thread holds of warpgroup g's
// accumulators: rows r = row, row + 8 (those below c.heads, ro = row_out of r), dims col, col + 1
// = 256 g + 8 j + 2 (lane % 4) + {0, 1} (the m64n128 layout of two halves).
template <class P, class L, class Put>
__device__ __forceinline__ void for_each_pair(const P& a, const Cta<L>& c, const float (&o)[2][64],
                                              int g, int row, int lane, const float (&row_scale)[2],
                                              Put put) {
  const int d0 = 256 * g;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row + 8 * half;
    if (r >= c.heads) continue;
    RowOut ro = row_out(a, c, r, g == 0 && (lane & 3) == 0);
    ro.factor *= row_scale[half];
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      put(r, ro, d0 + j * 8 + 2 * (lane & 3), o[j >> 4][4 * (j & 15) + 2 * half],
          o[j >> 4][4 * (j & 15) + 2 * half + 1]);
    }
  }
}

// Where warpgroup g stages its four [64, 64 dims] sw128 column blocks of a group's rows (offsets
// from the 1024-aligned base): over Q's column blocks 4 g..4 g + 3 in one round, or, where the
// layout names 16 KB places of its own (L::rows_stage(g), free of what the next item loads), two
// blocks at a time in two rounds.
template <class L>
__host__ __device__ constexpr int rows_rounds() {
  if constexpr (requires { L::rows_stage(0); }) {
    return 2;
  } else {
    return 1;
  }
}
template <class L>
__device__ __forceinline__ int rows_stage_off(int g) {
  if constexpr (requires { L::rows_stage(0); }) {
    return L::rows_stage(g);
  } else {
    return kQOff + 4 * g * kHeadGroup * 128;
  }
}

// The wgmma variant's finished rows of a group of more than 32 heads (bf16, scaled), by
// way of shared memory: the accumulator fragments go into sw128 column blocks (rows_stage_off:
// over Q's bytes, free once every QK step is done, or the layout's own places), then each
// warpgroup's blocks go out by the tensor map (one token's 64 heads x 64 dims a box; heads past H
// are not written). Query groups' rows span tokens, so their 256 threads store whole 1024-byte
// rows in 16-byte pieces instead (the launcher refuses an `out` that is not 16-byte aligned).
template <class P, class L>
__device__ __forceinline__ void store_rows(const P& a, const Cta<L>& c, const float (&o)[2][64],
                                           int g, int row, int lane, int tid256,
                                           const float (&row_scale)[2]) {
  uint8_t* tile = c.base + kQOff;
  if constexpr (!L::kQueryGroups) {
    const float2* ml = reinterpret_cast<const float2*>(c.base + L::kMlOff);
    float factor[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = row + 8 * half;
      const int head = c.h0 + r;
      // Rows past the group's heads are never stored (past H), and have no sink to read.
      const bool real = r < c.heads;
      const RowFinish f =
          finish_row(ml[r].x, ml[r].y, a.sinks != nullptr && real ? a.sinks + head : nullptr);
      if (g == 0 && (lane & 3) == 0 && real) a.lse[c.t * a.num_heads + head] = f.lse;
      factor[half] = f.factor * row_scale[half];
    }
    constexpr int kRounds = rows_rounds<L>(), kBlocks = 4 / kRounds;  // column blocks a round
    const int stage = rows_stage_off<L>(g);
#pragma unroll
    for (int round = 0; round < kRounds; ++round) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = row + 8 * half;
        uint8_t* dst = c.base + stage + r * 128 + 4 * (lane & 3);
#pragma unroll
        for (int jj = 0; jj < 8 * kBlocks; ++jj) {
          const int j = 8 * kBlocks * round + jj;  // dims 256 g + 8 j + 2 (lane % 4) + {0, 1}
          *reinterpret_cast<uint32_t*>(dst + (jj >> 3) * (kHeadGroup * 128) +
                                       (((j & 7) ^ (r & 7)) << 4)) =
              pack_bf16(o[j >> 4][4 * (j & 15) + 2 * half] * factor[half],
                        o[j >> 4][4 * (j & 15) + 2 * half + 1] * factor[half]);
        }
      }
      ptx::fence_proxy_async();
      ptx::named_barrier(7 + g, 128);  // this round's column blocks are complete
      if ((tid256 & 127) == 0) {
#pragma unroll
        for (int k = 0; k < kBlocks; ++k) {
          ptx::tma_store_3d(&a.out_map, 64 * (4 * g + kBlocks * round + k), c.h0,
                            static_cast<int>(c.t), c.sbase + stage + k * kHeadGroup * 128);
        }
        ptx::tma_store_wait_read();
      }
      // A place of the layout's own is written again next round, or by the next item.
      if (kRounds > 1) ptx::named_barrier(7 + g, 128);
    }
  } else {
    for_each_pair(a, c, o, g, row, lane, row_scale,
                  [tile](int r, const RowOut& ro, int col, float x, float y) {
                    *reinterpret_cast<uint32_t*>(tile + sw128(r, col, kHeadGroup)) =
                        pack_bf16(x * ro.factor, y * ro.factor);
                  });
    ptx::named_barrier(3, 256);  // the PV warpgroups' tile is complete
    uint16_t* dst = a.out + c.row(a, 0) * kHeadDim;
    for (int i = tid256; i < c.heads * 64; i += 256) {
      const int r = i >> 6, ch = i & 63;
      *reinterpret_cast<uint4*>(dst + r * kHeadDim + ch * 8) =
          *reinterpret_cast<const uint4*>(tile + sw128(r, ch * 8, kHeadGroup));
    }
  }
}

// The rows of warpgroup g's accumulators (dims 256 g + [0, 256) of rows `row` and row + 8, each
// times its row_scale), finished (unsplit calls, and the whole tokens of a last-wave split) or
// partial; tid256 = the thread's index among the 256 threads of the two warpgroups that hold a
// group's O.
template <class P, class L>
__device__ __forceinline__ void write_rows(const P& a, const Cta<L>& c, const float (&o)[2][64],
                                           int g, int row, int lane, int tid256,
                                           const float (&row_scale)[2]) {
  if (finished_token(a, c.t) && c.heads > 32) {
    store_rows(a, c, o, g, row, lane, tid256, row_scale);
  } else {
    // Partials and small groups: straight from the fragments (the shared-memory pass is slower
    // there).
    for_each_pair(a, c, o, g, row, lane, row_scale,
                  [](int, const RowOut& ro, int col, float x, float y) { put2(ro, col, x, y); });
  }
}

}  // namespace sparse_swa::detail::sm90
