// SPDX-License-Identifier: Apache-2.0
// What the pair kernels share (sm90_pairs_fp8_kernel.cu, 32-key blocks, and
// sm90_pairs_bf16_kernel.cu, 64-key blocks), and with them the few-heads kernel: an item's token,
// head group and slice of the key list, a key's index entry, and for the pair kernels the end of
// the math warpgroups' pair loop and their roles. The pair kernels: 384 threads, two math
// warpgroups (0, 1) and a producer (2); docs/design.md#attention-kernels.
#pragma once

#include <cstdint>
#include <type_traits>

#include "attention/sm90_shapes.h"
#include "cuda/attention/cluster_merge.cuh"
#include "cuda/attention/ptx.cuh"
#include "cuda/attention/rows_out.cuh"
#include "cuda/attention/sm90_common.cuh"
#include "cuda/attention/sm90_params.h"

namespace sparse_swa::detail::sm90 {

// Item `item` = (token * groups + head group) * splits + split (CTA blockIdx.x, or one of the
// items a CTA of the bf16 kernel walks): its token, heads, and its slice of the token's key list
// (both segments' lens, clamped to their widths). kSplit: split s takes whole pairs of
// `block_keys`-key blocks (the kernels walk pairs), ceil(pairs / splits) of them from pair
// s ceil(pairs / splits) on; c.tile0 is its first block, c.n its blocks and c.total the end of
// its keys; the a.whole_tokens first tokens come first, one item per (token, head group), split
// 0 of 1. Without kSplit (a.splits = 1) the item takes the whole list from c.tile0 = 0. With
// query groups (L::kQueryGroups, never split), item = a query group, all heads of its tokens as
// rows, and the group's union as the key list.
//
// In two steps, so that nothing waits for the lens before Q's load and the first index entries
// are on their way: start_item places the item and loads the lens (c.len0, c.total hold
// them raw), settle_item clamps them and works out the slice.
template <bool kSplit, class P, class L>
__device__ __forceinline__ void start_item(const P& a, Cta<L>& c, uint32_t item) {
  c.split = 0;
  if constexpr (L::kQueryGroups) {
    c.h0 = 0;
    c.t = item;
    const int64_t first = c.t * a.query_group;
    c.heads = static_cast<int>(min(int64_t{a.query_group}, a.num_tokens - first)) * a.num_heads;
    c.len0 = a.unions.lens[2 * c.t];  // the union's, within its cap
    c.total = a.unions.lens[2 * c.t + 1];
  } else {
    if constexpr (kSplit) {
      // Items of whole tokens first (one each), then those of split tokens (a.splits each).
      const uint32_t whole = static_cast<uint32_t>(a.whole_tokens) * a.groups;
      const uint32_t rest = item - whole;
      const uint32_t tg = item < whole ? item : whole + rest / a.splits;  // token x groups + group
      c.split = item < whole ? 0 : static_cast<int>(rest % a.splits);
      c.h0 = static_cast<int>(tg % a.groups) * kHeadGroup;
      c.t = tg / a.groups;
    } else {
      c.h0 = static_cast<int>(item % a.groups) * kHeadGroup;
      c.t = item / a.groups;
    }
    c.heads = min(kHeadGroup, a.num_heads - c.h0);
    c.len0 = a.seg0.lens[c.t];
    c.total = a.num_segments > 1 ? a.seg1.lens[c.t] : 0;
  }
}
template <bool kSplit, class P, class L>
__device__ __forceinline__ void settle_item(const P& a, Cta<L>& c, int block_keys) {
  if constexpr (!L::kQueryGroups) {
    clamp_lens(a, c, c.len0, static_cast<int32_t>(c.total));
  }
  c.tile0 = 0;
  if constexpr (kSplit) {
    const int32_t pairs = static_cast<int32_t>((c.total + 2 * block_keys - 1) / (2 * block_keys));
    const int32_t splits = finished_token(a, c.t) ? 1 : a.splits;
    const int32_t per_split = (pairs + splits - 1) / splits;
    const int32_t first = min(c.split * per_split, pairs), last = min(first + per_split, pairs);
    c.tile0 = 2 * first;
    c.total = min(c.total, int64_t{last} * 2 * block_keys);
    c.n = static_cast<int32_t>((c.total - int64_t{c.tile0} * block_keys + block_keys - 1) /
                               block_keys);
  } else {
    c.n = static_cast<int32_t>((c.total + block_keys - 1) / block_keys);
  }
}

// The index entry of key j of the first blocks of a slice that starts at the list's first key,
// loaded before the lens are known: the SWA entry j, which is key j whenever j < len0
// (first_key_index checks that once the CTA is settled). -1 where it cannot be: past the SWA
// width, in a slice of a split that starts later, or with query groups (their lists are the
// unions).
template <class P, class L>
__device__ __forceinline__ int32_t early_key_index(const P& a, const Cta<L>& c, int64_t j) {
  if (L::kQueryGroups || c.split != 0 || j >= a.seg0.width) return -1;
  return a.seg0.indices[c.t * a.seg0.row_stride + j];
}

// Key `key` of block b of the CTA's slice, as a place in the token's key list.
__device__ __forceinline__ int64_t item_key(int32_t tile0, int b, int block_keys, int key) {
  return (int64_t{tile0} + b) * block_keys + key;
}

// The index entry of key j of the token's list (both segments as one list, SWA entries first),
// or -1 past the slice's end (so also in the all-masked block an odd block count ends on).
template <class P, class L>
__device__ __forceinline__ int32_t item_key_index(const P& a, const Cta<L>& c, int64_t j) {
  if (j >= c.total) return -1;
  if constexpr (L::kQueryGroups) return a.unions.slots_of(c.t)[j];  // checked slots
  const bool swa = j < c.len0;
  const Segment& s = swa ? a.seg0 : a.seg1;
  return s.indices[c.t * s.row_stride + (swa ? j : j - c.len0)];
}

// The index entry of key j of the slice's first blocks, given early_key_index's guess for it.
template <class P, class L>
__device__ __forceinline__ int32_t first_key_index(const P& a, const Cta<L>& c, int64_t j,
                                                   int32_t early) {
  if (!L::kQueryGroups && c.split == 0 && j < c.len0) return early;  // j < len0 <= total
  return item_key_index(a, c, j);
}

// bf16 copies (the bf16 and few-heads kernels' producers, 128 threads): 8 threads per key row,
// each 16 bytes of every 128-byte column block, so that a warp's copy reads 4 rows x 128
// contiguous bytes. Thread t copies keys 16 (t / 32) + 4 i + (t / 8) % 4, i < 4, chunk t % 8 of
// each column block.
__device__ __forceinline__ int copy_key(int tid, int i) {
  return 16 * (tid >> 5) + 4 * i + ((tid >> 3) & 3);
}

// A math warpgroup's P [64 rows, 8 kChunks keys] bf16 into shared memory at p_base (128-byte
// rows, swizzled like a K column block) for the other warpgroup's P V. pa[2 j + hh]: rows row +
// 8 hh (row = 16 (tid / 32) + lane / 4), keys 8 j + 2 (lane % 4) + {0, 1}, i.e. this lane's part
// of the 8x8 block (warp's rows 8 hh.., keys 8 j..), so one stmatrix x4 stores blocks j, j + 1 of
// both row halves; lane L gives row L % 8 of block L / 8.
template <int kChunks>
__device__ __forceinline__ void store_p_sw128(const uint32_t (&pa)[2 * kChunks], uint32_t p_base,
                                              int tid) {
  const int lane = tid & 31;
  const int r = 16 * (tid >> 5) + (lane & 7) + 8 * ((lane >> 3) & 1);
  // Block j + (lane / 16)'s 16 bytes of row r: chunk (j + lane / 16) ^ (r % 8), j even.
  const uint32_t row_addr = p_base + r * 128;
  const int c0 = (lane >> 4) ^ (lane & 7);
#pragma unroll
  for (int j = 0; j < kChunks; j += 2) {
    const uint32_t regs[4] = {pa[2 * j], pa[2 * j + 1], pa[2 * j + 2], pa[2 * j + 3]};
    ptx::stmatrix_x4(row_addr + ((j ^ c0) << 4), regs);
  }
}

// A math thread's part of O (its two rows, row and row + 8, of warpgroup w's dims 256 w + [0,
// 256)), the first row times f[0], the second times f[1].
__device__ __forceinline__ void scale_rows(float (&o)[2][64], const float (&f)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      o[h][4 * j] *= f[0];
      o[h][4 * j + 1] *= f[0];
      o[h][4 * j + 2] *= f[1];
      o[h][4 * j + 3] *= f[1];
    }
  }
}

// lr, a row's sum of P with each block's largest P as P V takes it (rounded to bf16), after a
// block: l's update (corr, sum) plus, from one lane of the row's four, that rounding of
// 2^(block_max - m) (docs/design.md#attention-precision).
__device__ __forceinline__ float rounded_sum_step(float lr, float corr, float sum, float block_max,
                                                  float m, int lane) {
  const float top = m == -INFINITY ? 0.0f : fast_exp2(block_max - m);
  return lr * corr + sum + ((lane & 3) == 0 ? bf16_rounding(top) : 0.0f);
}

// Whether this launch's slices (of a kernel with layout L) merge inside their cluster
// (cluster_merge.cuh) rather than through partials and the merge kernel.
template <class L, class P>
__device__ __forceinline__ bool merges_in_cluster(const P& a) {
  return L::kSplitKeys && a.cluster_merge;
}

// The end of math warpgroup w's pair loop: the row sums of both warpgroups, (max, sum) for
// row_out, then the rows out. m: the running max (log2 units, the same in both warpgroups); l,
// lr: this thread's part of warpgroup w's sums of P, and of P with each block's largest P rounded
// to bf16 as P V took it; row: the thread's first accumulator row (and row + 8).
template <class P, class L>
__device__ __forceinline__ void finish_pair_rows(const P& a, const Cta<L>& c, float (&o)[2][64],
                                                 const float (&m)[2], float (&l)[2], float (&lr)[2],
                                                 int w, int row, int lane, int tid) {
  float* sums = reinterpret_cast<float*>(c.base + L::kSumOff);                 // [2][64]
  float* rounded_sums = reinterpret_cast<float*>(c.base + L::kRoundedSumOff);  // [2][64]
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    l[hh] += __shfl_xor_sync(0xffffffffu, l[hh], 1);
    l[hh] += __shfl_xor_sync(0xffffffffu, l[hh], 2);
    lr[hh] += __shfl_xor_sync(0xffffffffu, lr[hh], 1);
    lr[hh] += __shfl_xor_sync(0xffffffffu, lr[hh], 2);
    if ((lane & 3) == 0) {
      sums[w * kHeadGroup + row + 8 * hh] = l[hh];
      rounded_sums[w * kHeadGroup + row + 8 * hh] = lr[hh];
    }
  }
  ptx::named_barrier(6, 256);
  // O holds V weighted by P rounded to bf16, whose largest weights the running maximum no longer
  // keeps at exactly 1: scaled by l / lr, O / l weighs a key that dominates a row by one, as with
  // the exact maximum, while the lse keeps the exact sum (docs/design.md#attention-precision).
  float ratio[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = row + 8 * hh;
    const float total = sums[r] + sums[kHeadGroup + r];
    const float rounded = rounded_sums[r] + rounded_sums[kHeadGroup + r];
    ratio[hh] = rounded > 0.0f ? total / rounded : 1.0f;
    if (w == 0 && (lane & 3) == 0) {
      reinterpret_cast<float2*>(c.base + L::kMlOff)[r] = make_float2(m[hh], total);
    }
  }
  ptx::named_barrier(6, 256);  // also: every QK step is done, Q's bytes are free
  if (merges_in_cluster<L>(a)) {
    scale_rows(o, ratio);
    stash_rows(c, o, w, row, lane);  // merged at the end of run_pair_roles
  } else {
    write_rows(a, c, o, w, row, lane, 128 * w + tid, ratio);
  }
}

// The roles of a pair-kernel CTA once its barriers are set up: warpgroup 2 runs `producer(t)` (t =
// its thread, 0..127; it starts while Q arrives), warpgroups 0 and 1 wait for Q (per token: on
// `q_bar`, start_q_load's barrier; query groups: they load it themselves) and run
// `math(std::integral_constant<int, w>, t)`; setmaxnreg moves registers between them. A
// cluster-merged split CTA then merges its rows (the math warpgroups, which hold the registers)
// between two cluster barriers; the second keeps each stash until the whole cluster has read it.
template <int kMathRegs, int kProducerRegs, class P, class L, class Producer, class Math>
__device__ __forceinline__ void run_pair_roles(const P& a, const Cta<L>& c, int tid,
                                               Producer&& producer, Math&& math, uint32_t q_bar) {
  const int wg = tid >> 7;
  if (wg == 2) {
    ptx::setmaxnreg_dec<kProducerRegs>();
    producer(tid - 256);
    if (merges_in_cluster<L>(a)) {
      ptx::cluster_sync();
      ptx::cluster_sync();
    }
  } else {
    ptx::setmaxnreg_inc<kMathRegs>();
    if constexpr (!L::kQueryGroups) {
      ptx::mbar_wait(q_bar, 0);  // Q by the tensor map (start_q_load)
    } else {
      load_q<256>(a, c, tid);  // by the 256 math threads
      ptx::fence_proxy_async();
      ptx::named_barrier(4, 256);
    }
    if (wg == 0) {
      math(std::integral_constant<int, 0>{}, tid);
    } else {
      math(std::integral_constant<int, 1>{}, tid - 128);
    }
    if (merges_in_cluster<L>(a)) {
      static_assert(kQOff + kStashBytes <= L::kPOff, "the stash must not reach P or the barriers");
      ptx::cluster_sync();
      merge_cluster_rows(a, c, tid);
      ptx::cluster_sync();
    }
  }
}

}  // namespace sparse_swa::detail::sm90
