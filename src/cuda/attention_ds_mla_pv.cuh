// SPDX-License-Identifier: Apache-2.0
// The PV role of the tensor-core attention kernel (src/cuda/attention_ds_mla.cu), warpgroups 2-3:
// O += P V per tile, then the finished rows (or a split's partial rows) to global memory.
#pragma once

#include <cstdint>

#include "cuda/attention_ds_mla_layout.cuh"
#include "cuda/attention_ds_mla_qk.cuh"
#include "cuda/mma_ptx.cuh"

namespace sparse_swa::detail::ds_mla {

// ---- PV and the stores ----

// Where one output row goes: finished (bf16 out, lse) or, when split, this slice's partial.
struct RowOut {
  uint16_t* y = nullptr;  // [512] bf16, or nullptr when partial
  float* py = nullptr;    // [512] fp32 partial
  float factor = 0.0f;    // every value is multiplied by it
};
// Row r of the group; `writer` also stores its lse / (max, sum).
template <class L>
__device__ __forceinline__ RowOut row_out(const Args& a, const Cta<L>& c, int r, bool writer) {
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

// m16n8k16 variant: warp v of warpgroups 2-3 owns heads 32 * (v % 2) + [0, 32) and dims
// 128 * (v / 2) + [0, 128); P and V through ldmatrix.
template <class L>
__device__ void pv_mma(const Args& a, const Cta<L>& c, int v, int lane) {
  const int row0 = 32 * (v & 1);
  const int d0 = 128 * (v >> 1);
  // m-tiles past the group's heads: skipped (warp-uniform).
  const bool skip = (a.ablate & kAblatePv) != 0;
  const bool act0 = row0 < c.heads && !skip, act1 = row0 + 16 < c.heads && !skip;
  float o[2][16][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mi][nt][e] = 0.0f;
    }
  }
  for (int i = 0; i < c.n; ++i) {
    const int stage = i % L::kKStages;
    const int b = i % L::kPBufs;
    ptx::mbar_wait(c.p_full(b), (i / L::kPBufs) & 1);
    ptx::mbar_wait(c.k_full(stage), (i / L::kKStages) & 1);
    const float* corr_s = reinterpret_cast<const float*>(c.base + L::kCorrOff) + b * kGroupHeads;
    const uint32_t pt = c.sbase + L::kPOff + b * kPBytes;
    const uint32_t k_base = c.sbase + kKOff + stage * kKBytes;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
      if (!(mi == 0 ? act0 : act1)) continue;
      const int r = row0 + 16 * mi + (lane >> 2);
      const float c0 = corr_s[r], c1 = corr_s[r + 8];
      if (__any_sync(0xffffffffu, c0 != 1.0f || c1 != 1.0f)) {
#pragma unroll
        for (int nt = 0; nt < 16; ++nt) {
          o[mi][nt][0] *= c0;
          o[mi][nt][1] *= c0;
          o[mi][nt][2] *= c1;
          o[mi][nt][3] *= c1;
        }
      }
    }
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      uint32_t ph[2][4], pl[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        if (!(mi == 0 ? act0 : act1)) continue;
        const int r = row0 + 16 * mi + (lane & 15);
        const int col = kk * 16 + (lane >> 4) * 8;
        ptx::ldmatrix_x4(ph[mi], pt + sw128(r, col, kGroupHeads));
        ptx::ldmatrix_x4(pl[mi], pt + sw128(r, kKeys + col, kGroupHeads));
      }
#pragma unroll
      for (int np = 0; np < 8; ++np) {
        uint32_t vb[4];
        ptx::ldmatrix_x4_trans(vb, k_base + sw128(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                  d0 + np * 16 + (lane >> 4) * 8, kKeys));
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          if (!(mi == 0 ? act0 : act1)) continue;
          ptx::mma_bf16_16816(o[mi][2 * np], ph[mi], vb[0], vb[1]);
          ptx::mma_bf16_16816(o[mi][2 * np], pl[mi], vb[0], vb[1]);
          ptx::mma_bf16_16816(o[mi][2 * np + 1], ph[mi], vb[2], vb[3]);
          ptx::mma_bf16_16816(o[mi][2 * np + 1], pl[mi], vb[2], vb[3]);
        }
      }
    }
    ptx::mbar_arrive(c.p_empty(b));
    ptx::mbar_arrive(c.k_empty(stage));
  }
  ptx::named_barrier(2, 384);  // (max, sum) of every row are in shared memory
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = row0 + 16 * mi + (lane >> 2) + 8 * half;
      if (r >= c.heads) continue;
      const RowOut ro = row_out(a, c, r, d0 == 0 && (lane & 3) == 0);
#pragma unroll
      for (int nt = 0; nt < 16; ++nt) {
        put2(ro, d0 + nt * 8 + 2 * (lane & 3), o[mi][nt][2 * half], o[mi][nt][2 * half + 1]);
      }
    }
  }
}

// Calls put(r, ro, col, x, y) for each pair of values this thread holds of warpgroup g's
// accumulators: rows r = row, row + 8 (those below c.heads, ro = row_out of r), dims col, col + 1
// = 256 g + 8 j + 2 (lane % 4) + {0, 1} (the m64n128 layout of two halves).
template <class L, class Put>
__device__ __forceinline__ void for_each_pair(const Args& a, const Cta<L>& c,
                                              const float (&o)[2][64], int g, int row, int lane,
                                              const float (&row_scale)[2], Put put) {
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
    return kQOff + 4 * g * kGroupHeads * 128;
  }
}

// The wgmma variant's finished rows of a group of more than 32 heads (bf16, scaled), by
// way of shared memory: the accumulator fragments go into sw128 column blocks (rows_stage_off:
// over Q's bytes, free once every QK step is done, or the layout's own places), then each
// warpgroup's blocks go out by the tensor map (one token's 64 heads x 64 dims a box; heads past H
// are not written). Query groups' rows span tokens, so their 256 threads store whole 1024-byte
// rows in 16-byte pieces instead (the launcher refuses an `out` that is not 16-byte aligned).
template <class L>
__device__ __forceinline__ void store_rows(const Args& a, const Cta<L>& c, const float (&o)[2][64],
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
          *reinterpret_cast<uint32_t*>(dst + (jj >> 3) * (kGroupHeads * 128) +
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
                            static_cast<int>(c.t), c.sbase + stage + k * kGroupHeads * 128);
        }
        ptx::tma_store_wait_read();
      }
      // A place of the layout's own is written again next round, or by the next item.
      if (kRounds > 1) ptx::named_barrier(7 + g, 128);
    }
  } else {
    for_each_pair(a, c, o, g, row, lane, row_scale,
                  [tile](int r, const RowOut& ro, int col, float x, float y) {
                    *reinterpret_cast<uint32_t*>(tile + sw128(r, col, kGroupHeads)) =
                        pack_bf16(x * ro.factor, y * ro.factor);
                  });
    ptx::named_barrier(3, 256);  // the PV warpgroups' tile is complete
    uint16_t* dst = a.out + c.row(a, 0) * kHeadDim;
    for (int i = tid256; i < c.heads * 64; i += 256) {
      const int r = i >> 6, ch = i & 63;
      *reinterpret_cast<uint4*>(dst + r * kHeadDim + ch * 8) =
          *reinterpret_cast<const uint4*>(tile + sw128(r, ch * 8, kGroupHeads));
    }
  }
}

// The rows of warpgroup g's accumulators (dims 256 g + [0, 256) of rows `row` and row + 8, each
// times its row_scale), finished (unsplit calls, and the whole tokens of a last-wave split) or
// partial; tid256 = the thread's index among the 256 threads of the two warpgroups that hold a
// group's O.
template <class L>
__device__ __forceinline__ void write_rows(const Args& a, const Cta<L>& c, const float (&o)[2][64],
                                           int g, int row, int lane, int tid256,
                                           const float (&row_scale)[2]) {
  if (finished_token(a, c.t) && c.heads > 32) {
    store_rows(a, c, o, g, row, lane, tid256, row_scale);
  } else {
    // Partials and small groups: straight from the fragments (the shared-memory pass measured
    // slower there; bench/README.md#variant-log, run 26).
    for_each_pair(a, c, o, g, row, lane, row_scale,
                  [](int, const RowOut& ro, int col, float x, float y) { put2(ro, col, x, y); });
  }
}

// wgmma variant: warpgroup g (0, 1) owns dims 256 g + [0, 256) of all 64 rows, as two halves of
// 128; per tile and half four m64n128k16 steps: P's hi columns against V, then its lo columns
// against V again.
template <class L>
__device__ void pv_wgmma(const Args& a, const Cta<L>& c, int g, int w, int lane) {
  const int d0 = 256 * g;
  const int row = 16 * w + (lane >> 2);  // and row + 8
  const bool skip = (a.ablate & kAblatePv) != 0;
  RoleClock clk(a, g == 0 ? 2 : 3);  // slots: waits, rescale, MMAs, arrives, end wait, stores
  if (g != 0) clk.out = nullptr;     // warpgroup 2 only
  float o[2][64];
#pragma unroll
  for (int k = 0; k < 64; ++k) o[0][k] = o[1][k] = 0.0f;
  for (int i = 0; i < c.n; ++i) {
    const int stage = i % L::kKStages;
    const int b = i % L::kPBufs;
    ptx::mbar_wait(c.p_full(b), (i / L::kPBufs) & 1);
    ptx::mbar_wait(c.k_full(stage), (i / L::kKStages) & 1);
    clk.lap(0);
    const float* corr_s = reinterpret_cast<const float*>(c.base + L::kCorrOff) + b * kGroupHeads;
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
    clk.lap(1);
    if (!skip) {
      const uint64_t pt = ptx::sw128_desc(c.sbase + L::kPOff + b * kPBytes);
      const uint64_t vt = ptx::sw128_desc(
          c.sbase + kKOff + stage * kKBytes + (d0 / 64) * (kKeys * 128), kKeys * 128, 1024);
      ptx::wgmma_fence();
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (j >= 2 && (a.ablate & kAblatePLo)) break;
          const uint64_t da = ptx::desc_advance(pt, j * 32);
          const uint64_t db = ptx::desc_advance(vt, h * 2 * (kKeys * 128) + (j & 1) * 2048);
          ptx::wgmma_m64n128k16_bt(o[h], da, db, true);
        }
      }
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();
    }
    clk.lap(2);
    ptx::mbar_arrive(c.p_empty(b));
    ptx::mbar_arrive(c.k_empty(stage));
    clk.lap(3);
  }
  ptx::named_barrier(2, 384);  // (max, sum) of every row are in shared memory
  clk.lap(4);
  write_rows(a, c, o, g, row, lane, static_cast<int>(threadIdx.x) - 256, {1.0f, 1.0f});
  clk.lap(5);
  clk.store(c.n);
}

}  // namespace sparse_swa::detail::ds_mla
