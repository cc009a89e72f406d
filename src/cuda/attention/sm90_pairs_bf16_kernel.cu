// SPDX-License-Identifier: Apache-2.0
// The pair kernel on bf16 rows: bf16 caches, or fp8_ds_mla keys decoded into the workspace
// (docs/design.md#attention-kernels). sm_90a only; semantics and precision as the fp8_ds_mla pair
// kernel's (sm90_pairs_fp8_kernel.cu): P rounded to bf16 once.
//
// One item = one query token x a group of up to 64 heads x its key list (or, split, a slice of
// whole pairs: start_item), walked in blocks of 64 keys, two at a time (pair p = blocks 2p
// and 2p + 1), by three warpgroups:
//   math w (warpgroups 0, 1)  S = Q K^T of block 2p + w (wgmma m64n64k16, Q and K in shared
//       memory), P_w = 2^(S - max) in bf16, then O_w (dims 256 w + [0, 256) of the 64 rows) +=
//       P_w V_w (P from registers) + P_{1-w} V_{1-w} (the other's P through shared memory).
//   producer (warpgroup 2)  bf16 rows by cp.async into two 64-key buffers (masked keys as zero
//       rows), buffer w for block 2p + w.
// Each buffer is refilled by halves (L = dims 0..255, R = 256..511) as soon as a half's last
// reader is done: warpgroup w reads both halves of its block for QK and half w of both blocks for
// P V, so half w of buffer w comes free after w's own P V, half 1 - w after the other's. The
// producer fills a pair in the order the halves come free: B0.L, B1.R, B0.R, B1.L.
//
// Warpgroup 0 takes P_0 against its own block's running maximum and starts its own P V at once;
// warpgroup 1 takes the pair's maximum (warpgroup 0's and its block's); warpgroup 0 then moves O,
// its sum and the P_0 it shares to the pair's maximum. So warpgroup 0 runs ahead: its next QK
// goes to the tensor cores while warpgroup 1 finishes the pair's P V and waits for its block.
//
// A CTA walks items blockIdx.x, + gridDim.x, ... (at most one CTA per SM; a cluster-merged split
// launch, one CTA per item), and the next item's prologue overlaps this one's end: the producer
// goes on to the next item's index entries and keys as soon as it has issued this item's last
// fills, and loads its Q once both math warpgroups have done their last QK step; the rows go out
// through places that neither Q nor the key buffers use (PairsBf16Layout::rows_stage). The
// barriers' phases count the CTA's pairs over all its items.
#include <cuda_runtime.h>

#include <cstdint>

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#pragma nv_diag_suppress 177
#endif

#include "attention/sm90_shapes.h"
#include "cuda/attention/grid_launch.cuh"
#include "cuda/attention/pairs_common.cuh"
#include "cuda/attention/ptx.cuh"
#include "cuda/attention/rows_out.cuh"
#include "cuda/attention/sm90_common.cuh"
#include "cuda/attention/sm90_kernels.h"
#include "cuda/attention/sm90_params.h"
#include "sparse_swa/kv_cache.h"

namespace sparse_swa::detail::sm90 {
namespace {

using pairs_bf16::kBlockKeys;
// setmaxnreg: 168 registers at entry (384 threads), moved from the producer (cp.async needs few)
// to the math threads.
constexpr int kMathRegs = 224, kProducerRegs = 56;
static_assert(2 * kMathRegs + kProducerRegs == 3 * 168);

// Shared memory, in bytes from a 1024-aligned base (Q at kQOff as in the other kernels).
struct PairsBf16Layout {
  static constexpr bool kQueryGroups = false;                  // never given a query group
  static constexpr bool kSplitKeys = true;                     // split or not at run time
  static constexpr int kBufBytes = kBlockKeys * kHeadDim * 2;  // [64 keys, 512] bf16, swizzled
  static constexpr int kColBlock = kBlockKeys * 128;           // one [64, 64 dims] column block
  static constexpr int kKOff = kQOff + kQBytes;                // buffers 0, 1
  static constexpr int kPBytes = kHeadGroup * 128;             // [64 heads, 64 keys] bf16, swizzled
  static constexpr int kPOff = kKOff + 2 * kBufBytes;          // P of warpgroup 0, 1
  static constexpr int kMaxOff = kPOff + 2 * kPBytes;  // [2][64] fp32: warpgroup 0's max, pair's
  static constexpr int kSumOff = kMaxOff + 2 * kHeadGroup * 4;  // [2][64] fp32 row sums
  // [2][64] fp32 row sums with the rounding of each block's largest P (finish_pair_rows), in
  // the maxima's place at an item's end: each warpgroup's maxima were last read before the
  // other's P handoff, which it waited for before its last P V.
  static constexpr int kRoundedSumOff = kMaxOff;
  static constexpr int kMlOff = kSumOff + 2 * kHeadGroup * 4;  // [64] (max, sum), row_out's
  static constexpr int kMaskOff = kMlOff + kHeadGroup * 8;     // [2] uint64 valid-key masks
  // mbarriers: ready[buf][half] x 4, free[buf][half] x 4, the handoffs between the math
  // warpgroups (kMax0, kMax1, kP0, kP1), then Q's arrival and Q's release.
  static constexpr int kBarOff = kMaskOff + 16;
  // Where the rows out are staged (store_rows), 16 KB a math warpgroup: 0 over the two P buffers,
  // 1 past the barriers; so Q and the buffers are free for the next item while the rows go out.
  static constexpr int kStageOff = (kBarOff + 14 * 8 + 1023) / 1024 * 1024;
  static constexpr int rows_stage(int g) { return g == 0 ? kPOff : kStageOff; }
  static constexpr size_t kSmem = kStageOff + 2 * kPBytes + 1024;
  static_assert(kSmem <= 227 * 1024, "more shared memory than an sm_90 CTA can have");
  static_assert(kKOff % 1024 == 0 && kPOff % 1024 == 0 && kPBytes * 2 == 16384);
};
using BL = PairsBf16Layout;

// Ready: the half's copies have landed (128 producer arrivals; the half that carries the block's
// mask also its 4 warps' mask stores). Free: the warpgroup that reads it last is done (128).
__device__ __forceinline__ uint32_t ready_bar(const Cta<BL>& c, int buf, int half) {
  return c.sbase + BL::kBarOff + 8 * (2 * buf + half);
}
__device__ __forceinline__ uint32_t free_bar(const Cta<BL>& c, int buf, int half) {
  return c.sbase + BL::kBarOff + 8 * (4 + 2 * buf + half);
}

// Q's arrival (start_q_load), after the 12 barriers above, and its release: every QK step of the
// item is done (256 math threads), so the next item's Q may land.
__device__ __forceinline__ uint32_t q_bar(const Cta<BL>& c) {
  return c.sbase + BL::kBarOff + 8 * 12;
}
__device__ __forceinline__ uint32_t q_free_bar(const Cta<BL>& c) {
  return c.sbase + BL::kBarOff + 8 * 13;
}

// The items (token x head group x split) a launch covers; CTA blockIdx.x takes items blockIdx.x,
// + gridDim.x, ... in turn.
__device__ __forceinline__ uint32_t item_count(const PairsBf16Params& a) {
  return static_cast<uint32_t>(launch_items(a));
}

// The index entry of key `key` of block b, or -1.
__device__ __forceinline__ int32_t key_index(const PairsBf16Params& a, const Cta<BL>& c, int b,
                                             int key) {
  return item_key_index(a, c, item_key(c.tile0, b, kBlockKeys, key));
}

// The segment (SWA or extra) that key `key` of block b belongs to.
__device__ __forceinline__ const Segment& key_segment(const PairsBf16Params& a, const Cta<BL>& c,
                                                      int b, int key) {
  return item_key(c.tile0, b, kBlockKeys, key) < c.len0 ? a.seg0 : a.seg1;
}

// The bf16 row of that key, or nullptr (masked); entries < -1 or past the cache are counted (by
// head group 0; one thread resolves each key).
__device__ __forceinline__ const uint8_t* key_row(const PairsBf16Params& a, const Cta<BL>& c, int b,
                                                  int key, int32_t idx) {
  if (idx == -1) return nullptr;
  const Segment& s = key_segment(a, c, b, key);
  if (idx >= 0 && static_cast<uint32_t>(idx) < s.num_slots) {
    return bf16_slot_row(s, static_cast<uint32_t>(idx));
  }
  if (c.h0 == 0 && a.bad_count != nullptr) atomicAdd(a.bad_count, 1);
  return nullptr;
}

// Asks L2 for the bf16 row of key `key` of block b (index entry idx) when the CTAs of other head
// groups copy the same rows; masked or out-of-range entries ask nothing.
__device__ __forceinline__ void prefetch_key_row(const PairsBf16Params& a, const Cta<BL>& c, int b,
                                                 int key, int32_t idx) {
  if (idx < 0) return;
  const Segment& s = key_segment(a, c, b, key);
  if (static_cast<uint32_t>(idx) >= s.num_slots) return;
  ptx::bulk_prefetch_l2(bf16_slot_row(s, static_cast<uint32_t>(idx)), kBf16RowBytes);
}

// A pair's keys as a producer thread copies them: rows[w][i] = key copy_key(tid, i) of block
// 2 p + w (a masked key: Q's first row, a valid address that is never read); `valid` = the warp's
// ballot of the keys' resolvers, bit 8 j + 4 w + i for the keys of lanes 8 j..8 j + 7.
struct PairKeys {
  const uint8_t* rows[2][4];
  uint32_t valid;
};

// Half `half` of block 2 p + buf into buffer buf (zeros for masked keys); the copies arrive on
// ready(buf, half) when they land. The first half of a buffer also carries the block's valid
// mask (one lane per warp arrives).
__device__ __forceinline__ void fill_half(const Cta<BL>& c, int buf, int half, const PairKeys& k,
                                          bool with_mask, int tid) {
  const int chunk = tid & 7, group = (tid >> 3) & 3;
  const uint32_t dst = c.sbase + BL::kKOff + buf * BL::kBufBytes + 4 * half * BL::kColBlock;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int key = copy_key(tid, i);
    const bool valid = (k.valid >> (8 * group + 4 * buf + i)) & 1u;
    const uint8_t* src = k.rows[buf][i] + half * 512 + chunk * 16;
#pragma unroll
    for (int cb = 0; cb < 4; ++cb) {
      ptx::cp_async_16_or_zero(dst + cb * BL::kColBlock + key * 128 + ((chunk ^ (key & 7)) << 4),
                               src + cb * 128, valid);
    }
  }
  if (with_mask) {
    // Bit 4 i + j of warp v's mask: key 16 v + 4 i + j, the ballot's bit 8 j + 4 buf + i. The
    // multiply gathers bits 0, 8, 16, 24 into bits 24..27 (no two partial products meet).
    uint32_t bits = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      bits |= ((((k.valid >> (4 * buf + i)) & 0x01010101u) * 0x01020408u) >> 24) << (4 * i);
    }
    if ((tid & 31) == 0) {
      reinterpret_cast<uint16_t*>(c.base + BL::kMaskOff + 8 * buf)[tid >> 5] =
          static_cast<uint16_t>(bits);
      ptx::mbar_arrive(ready_bar(c, buf, half));
    }
  }
  ptx::cp_async_mbar_arrive(ready_bar(c, buf, half));
}

// The 8 threads that copy the same keys (tid / 8 alike: keys copy_key(tid, i), i < 4, of both
// blocks of a pair) resolve them once between them: lane 4 w + i of the group (tid % 8) resolves
// key i of block 2 p + w and the group shares the rows by shuffles.
// The key a producer thread resolves of each pair: key_mine(tid) of block 2 p + (tid / 4) % 2.
__device__ __forceinline__ int key_mine(int tid) { return copy_key(tid, tid & 3); }
// One item's fills: pair p of the item is the CTA's pair pair0 + p (the barriers' phases).
// early: early_key_index of the thread's key of pair 0.
__device__ __forceinline__ void producer_item(const PairsBf16Params& a, const Cta<BL>& c, int tid,
                                              int32_t early, uint32_t pair0) {
  const int pairs = (c.n + 1) / 2;
  const int mine_w = (tid >> 2) & 1, mine_key = key_mine(tid);
  const int group_lane0 = tid & 24;  // the group's first lane in the warp
  PairKeys k;
  int32_t next = first_key_index(a, c, item_key(c.tile0, mine_w, kBlockKeys, mine_key), early);
  for (int p = 0; p < pairs; ++p) {
    const uint32_t g = pair0 + p;
    const uint32_t parity = (g - 1) & 1;  // the phase pair g - 1's frees completed
    const uint8_t* mine = key_row(a, c, 2 * p + mine_w, mine_key, next);
    next = key_index(a, c, 2 * p + 2 + mine_w, mine_key);
    k.valid = __ballot_sync(0xffffffffu, mine != nullptr);
    if (mine == nullptr) mine = reinterpret_cast<const uint8_t*>(a.q);
#pragma unroll
    for (int w = 0; w < 2; ++w) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        k.rows[w][i] = reinterpret_cast<const uint8_t*>(
            __shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(mine), group_lane0 + 4 * w + i));
      }
    }
    // B0.L, B1.R (freed by their own warpgroup's P V), then B0.R, B1.L (by the other's).
    if (g > 0) ptx::mbar_wait(free_bar(c, 0, 0), parity);
    fill_half(c, 0, 0, k, true, tid);
    if (g > 0) ptx::mbar_wait(free_bar(c, 1, 1), parity);
    fill_half(c, 1, 1, k, true, tid);
    if (g > 0) ptx::mbar_wait(free_bar(c, 0, 1), parity);
    fill_half(c, 0, 1, k, false, tid);
    if (g > 0) ptx::mbar_wait(free_bar(c, 1, 0), parity);
    fill_half(c, 1, 0, k, false, tid);
    // Where head groups share the rows (over 64 heads), the next pair's rows into L2: the CTA
    // that comes later finds them there.
    if (a.groups > 1 && p + 1 < pairs) prefetch_key_row(a, c, 2 * p + 2 + mine_w, mine_key, next);
  }
}

// Walks the CTA's items; after an item's last fills it issues the next item's Q (once the math
// warpgroups release Q) and goes on to that item's keys. early: early_key_index of the thread's
// key of the first item's pair 0 (issued before the lens were known).
__device__ void pairs_bf16_producer(const PairsBf16Params& a, Cta<BL> c, int tid, int32_t early) {
  const uint32_t items = item_count(a);
  uint32_t pair0 = 0;  // pairs of the CTA's earlier items
  for (uint32_t item = blockIdx.x, seq = 0;;) {
    producer_item(a, c, tid, early, pair0);
    pair0 += (c.n + 1) / 2;
    item += gridDim.x;
    ++seq;
    if (item >= items) break;
    start_item<true>(a, c, item);
    early = early_key_index(a, c, item_key(0, (tid >> 2) & 1, kBlockKeys, key_mine(tid)));
    if (tid == 0) {
      ptx::mbar_wait(q_free_bar(c), (seq - 1) & 1);
      start_q_load(a, c, q_bar(c));
    }
    settle_item<true>(a, c, kBlockKeys);
  }
  ptx::cp_async_wait<0>();
}

// S += Q K^T over half `half` of the block in buffer `k_base` (16 m64n64k16 steps).
__device__ __forceinline__ void qk_half(float (&s)[32], uint64_t q_desc, uint64_t k_desc, int half,
                                        bool first) {
#pragma unroll
  for (int step = 0; step < 16; ++step) {
    const int cb = 4 * half + (step >> 2);  // column block
    const uint32_t inner = (step & 3) * 32;
    const uint64_t da = ptx::desc_advance(q_desc, cb * (kHeadGroup * 128) + inner);
    const uint64_t db = ptx::desc_advance(k_desc, cb * BL::kColBlock + inner);
    if (first && step == 0) {
      ptx::wgmma_m64n64k16_first(s, da, db);
    } else {
      ptx::wgmma_m64n64k16(s, da, db, true);
    }
  }
}

// V descriptor of buffer `v0`: keys 16 kk + [0, 16) x dims 256 w + [0, 256).
__device__ __forceinline__ uint64_t v_desc(uint64_t v0, int w, int kk) {
  return ptx::desc_advance(v0, 4 * w * BL::kColBlock + kk * 2048);
}

// The handoffs of a pair between the math warpgroups, mbarriers that one warpgroup's 128 threads
// arrive on and the other waits on (phase = pair parity).
constexpr int kMax0 = 0;  // warpgroup 0's block maximum is in maxes[0]
constexpr int kMax1 = 1;  // the pair's maximum is in maxes[1]
constexpr int kP0 = 2;    // P_0 (at the pair's maximum) is in shared memory
constexpr int kP1 = 3;    // P_1 is in shared memory
__device__ __forceinline__ uint32_t handoff_bar(const Cta<BL>& c, int which) {
  return c.sbase + BL::kBarOff + 8 * (8 + which);
}

// Warpgroup 0 does not wait for warpgroup 1's maximum before its own P V: it uses its block's
// maximum, then rescales O and P_0 once the pair's maximum is known. Warpgroup 1 takes the pair's
// maximum at once. Warpgroup 0 frees block 1's half L as soon as its P_1 V_1 is done, then
// starts the next pair's QK (waiting for that QK's first half must not hold the free back).
// One item, whose pair p is the CTA's pair pair0 + p (the barriers' phases); returns pair0 plus
// the item's pairs. Q is released (q_free_bar) after the item's last QK step, so that the next
// item's Q lands while this one finishes.
template <int w>
__device__ uint32_t pair_math(const PairsBf16Params& a, const Cta<BL>& c, int tid, uint32_t pair0) {
  const int lane = tid & 31;
  const int row = 16 * (tid >> 5) + (lane >> 2);  // and row + 8
  float* maxes = reinterpret_cast<float*>(c.base + BL::kMaxOff);
  const uint64_t q_desc = ptx::sw128_desc(c.sbase + kQOff);
  const uint32_t my_k = c.sbase + BL::kKOff + w * BL::kBufBytes;
  const uint32_t other_k = c.sbase + BL::kKOff + (1 - w) * BL::kBufBytes;
  const uint64_t my_qk = ptx::sw128_desc(my_k);
  const uint64_t my_v = ptx::sw128_desc(my_k, BL::kColBlock, 1024);
  const uint64_t other_v = ptx::sw128_desc(other_k, BL::kColBlock, 1024);
  const uint64_t other_p = ptx::sw128_desc(c.sbase + BL::kPOff + (1 - w) * BL::kPBytes);
  const uint32_t my_p = c.sbase + BL::kPOff + w * BL::kPBytes;
  float o[2][64];
#pragma unroll
  for (int k = 0; k < 64; ++k) o[0][k] = o[1][k] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};   // sums of P
  float lr[2] = {0.0f, 0.0f};  // the same plus each block's largest P's rounding to bf16
  const uint32_t end = pair0 + (c.n + 1) / 2;  // the CTA's pairs after this item
  float s[32];
  // S of this warpgroup's block of the CTA's pair g: warpgroup 0 reads half L first, 1 half R
  // (the halves the producer fills first).
  const auto qk_first = [&](uint32_t g) {
    ptx::mbar_wait(ready_bar(c, w, w), g & 1);
    ptx::fence_proxy_async();
    ptx::wgmma_fence();
    qk_half(s, q_desc, my_qk, w, true);
    ptx::wgmma_commit();
  };
  const auto qk_second = [&](uint32_t g) {
    ptx::mbar_wait(ready_bar(c, w, 1 - w), g & 1);
    ptx::fence_proxy_async();
    ptx::wgmma_fence();
    qk_half(s, q_desc, my_qk, 1 - w, false);
    ptx::wgmma_commit();
  };
  const auto rescale_o = [&](const float(&f)[2]) {
    if (__any_sync(0xffffffffu, f[0] != 1.0f || f[1] != 1.0f)) scale_rows(o, f);
  };
  // pa[2j + hh]: row + 8 hh, keys 8 j + 2 (lane % 4) + {0, 1}: the A fragments of P V.
  uint32_t pa[16];
  const auto store_p = [&] {
    store_p_sw128<8>(pa, my_p, tid);
    ptx::fence_proxy_async();
  };
  const auto own_pv = [&] {
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t frag[4] = {pa[4 * kk], pa[4 * kk + 1], pa[4 * kk + 2], pa[4 * kk + 3]};
      ptx::wgmma_m64n256k16_rs_bt(o[0], o[1], frag, v_desc(my_v, w, kk));
    }
    ptx::wgmma_commit();
  };
  const auto other_pv = [&] {
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      ptx::wgmma_m64n256k16_bt(o[0], o[1], ptx::desc_advance(other_p, kk * 32),
                               v_desc(other_v, w, kk));
    }
    ptx::wgmma_commit();
  };
  if (w == 0 && pair0 < end) {
    qk_first(pair0);
    qk_second(pair0);
    ptx::wgmma_wait<0>();
  }
  if (pair0 == end) ptx::mbar_arrive(q_free_bar(c));
  for (uint32_t g = pair0; g < end; ++g) {
    if constexpr (w == 1) {
      qk_first(g);
      qk_second(g);
      ptx::wgmma_wait<0>();
    }
    if (g + 1 == end) ptx::mbar_arrive(q_free_bar(c));  // the item's last QK step is done
    // The block's valid keys, shifted so that bit 8 j + e is this thread's key 8 j + 2 (lane % 4)
    // + e (immediate shifts below: no per-lane bit masks held through the loop).
    const uint64_t mask =
        *reinterpret_cast<const uint64_t*>(c.base + BL::kMaskOff + 8 * w) >> (2 * (lane & 3));
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool valid = (mask >> (8 * j + e)) & 1u;
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          float& x = s[4 * j + 2 * hh + e];
          x = valid ? x * a.scale_log2 : -INFINITY;
          mx[hh] = fmaxf(mx[hh], x);
        }
      }
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 1));
      mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 2));
    }
    // The maximum P is taken against, moved only by more than kMaxLag (next_max), so that most
    // pairs rescale no O: warpgroup 0 moves the running maximum by its block's, warpgroup 1 moves
    // warpgroup 0's by its own, which makes it the pair's.
    float m_new[2];
    if constexpr (w == 1) ptx::mbar_wait(handoff_bar(c, kMax0), g & 1);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      m_new[hh] = next_max(w == 0 ? m[hh] : maxes[row + 8 * hh], mx[hh]);
      if ((lane & 3) == 0) maxes[w * kHeadGroup + row + 8 * hh] = m_new[hh];
    }
    ptx::mbar_arrive(handoff_bar(c, w == 0 ? kMax0 : kMax1));
    float corr[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      corr[hh] = m_new[hh] == -INFINITY ? 1.0f : fast_exp2(m[hh] - m_new[hh]);
      m[hh] = m_new[hh];
    }
    rescale_o(corr);
    // P (fp32 in s) and its bf16 fragments; the sum takes P before rounding.
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const bool none = m[hh] == -INFINITY;
        float& p0 = s[4 * j + 2 * hh];
        float& p1 = s[4 * j + 2 * hh + 1];
        p0 = none ? 0.0f : fast_exp2(p0 - m[hh]);
        p1 = none ? 0.0f : fast_exp2(p1 - m[hh]);
        sum[hh] += p0 + p1;
        pa[2 * j + hh] = pack_bf16(p0, p1);
      }
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) l[hh] = l[hh] * corr[hh] + sum[hh];
    own_pv();
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {  // while P V runs
      lr[hh] = rounded_sum_step(lr[hh], corr[hh], sum[hh], mx[hh], m[hh], lane);
    }
    if constexpr (w == 0) {
      // The pair's maximum: P_0 moves to it and goes to warpgroup 1 while the own P V still runs
      // (in registers of its own: that wgmma reads pa), then O and l move once it is done.
      ptx::mbar_wait(handoff_bar(c, kMax1), g & 1);
      float f[2];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float mp = maxes[kHeadGroup + row + 8 * hh];
        f[hh] = mp == -INFINITY ? 1.0f : fast_exp2(m[hh] - mp);
        m[hh] = mp;
        l[hh] *= f[hh];
        lr[hh] *= f[hh];
      }
      uint32_t p0[16];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          p0[2 * j + hh] = pack_bf16(s[4 * j + 2 * hh] * f[hh], s[4 * j + 2 * hh + 1] * f[hh]);
        }
      }
      store_p_sw128<8>(p0, my_p, tid);
      ptx::fence_proxy_async();
      ptx::mbar_arrive(handoff_bar(c, kP0));
      ptx::wgmma_wait<0>();
      ptx::mbar_arrive(free_bar(c, 0, 0));  // block 0's half L: QK and own P V done
      rescale_o(f);
      ptx::mbar_wait(handoff_bar(c, kP1), g & 1);
      other_pv();
      ptx::wgmma_wait<0>();
      ptx::mbar_arrive(free_bar(c, 1, 0));  // block 1's half L: P_1 V_1 done
      if (g + 1 < end) {
        qk_first(g + 1);
        qk_second(g + 1);
        ptx::wgmma_wait<0>();
      }
    } else {
      store_p();
      ptx::mbar_arrive(handoff_bar(c, kP1));
      ptx::mbar_wait(handoff_bar(c, kP0), g & 1);
      other_pv();
      ptx::wgmma_wait<1>();
      ptx::mbar_arrive(free_bar(c, 1, 1));  // block 1's half R: QK and own P V done
      ptx::wgmma_wait<0>();
      ptx::mbar_arrive(free_bar(c, 0, 1));  // block 0's half R: P_0 V_0 done
    }
  }
  finish_pair_rows(a, c, o, m, l, lr, w, row, lane, tid);
  return end;
}

// Math warpgroup w over the CTA's items (the first one's Q already in).
template <int w>
__device__ void math_items(const PairsBf16Params& a, Cta<BL> c, int tid) {
  const uint32_t items = item_count(a);
  uint32_t pair0 = 0;
  for (uint32_t item = blockIdx.x, seq = 0;;) {
    pair0 = pair_math<w>(a, c, tid, pair0);
    item += gridDim.x;
    ++seq;
    if (item >= items) break;
    start_item<true>(a, c, item);
    settle_item<true>(a, c, kBlockKeys);
    ptx::mbar_wait(q_bar(c), seq & 1);
  }
}

__global__ void __launch_bounds__(pairs::kThreads, 1)
    sm90_pairs_bf16_kernel(const __grid_constant__ PairsBf16Params a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  Cta<BL> c;
  place_smem(c, smem_raw);
  const int tid = threadIdx.x;
  start_item<true>(a, c, blockIdx.x);
  // The producer's first index entry goes out with the lens, before the barrier (so that nothing
  // is scheduled to wait for the lens ahead of it).
  const int pt = tid - 256;  // producer thread
  const int32_t early =
      pt >= 0 ? early_key_index(a, c, item_key(0, (pt >> 2) & 1, kBlockKeys, key_mine(pt))) : -1;
  if (tid == 0) {
    for (int b = 0; b < 2; ++b) {
      for (int h = 0; h < 2; ++h) {
        // The half that carries the block's mask (B0.L, B1.R) also counts its 4 mask arrivals.
        ptx::mbar_init(ready_bar(c, b, h), h == b ? 128 + 4 : 128);
        ptx::mbar_init(free_bar(c, b, h), 128);
      }
    }
    for (int i = 0; i < 4; ++i) ptx::mbar_init(handoff_bar(c, i), 128);
    ptx::mbar_init(q_bar(c), 1);
    ptx::mbar_init(q_free_bar(c), 256);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  if (tid == 0) start_q_load(a, c, q_bar(c));
  settle_item<true>(a, c, kBlockKeys);
  run_pair_roles<kMathRegs, kProducerRegs>(
      a, c, tid, [&](int t) { pairs_bf16_producer(a, c, t, early); },
      [&](auto w, int t) { math_items<decltype(w)::value>(a, c, t); }, q_bar(c));
#else
  (void)a;  // sm_90a only
#endif
}

}  // namespace

Status launch_sm90_pairs_bf16(const PairsBf16Params& a, unsigned max_ctas, cudaStream_t stream) {
  return launch_item_grid<sm90_pairs_bf16_kernel>(a, BL::kSmem, pairs::kThreads, max_ctas,
                                                  a.cluster_merge ? a.splits : 0, stream);
}

bool sm90_pairs_bf16_clusters_fit(int splits) {
  return clusters_fit<sm90_pairs_bf16_kernel>(splits, BL::kSmem);
}

}  // namespace sparse_swa::detail::sm90
