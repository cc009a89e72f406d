// SPDX-License-Identifier: Apache-2.0
// The pair kernel on fp8_ds_mla caches (the plan, src/attention/sm90_plan.cc, chooses;
// docs/design.md#attention-kernels). sm_90a only; semantics as the tile32 kernel's, but P is
// rounded to bf16 once before P V (one part, not the tile32 kernel's two), which bounds the
// output's extra error by 2^-9 times the weighted mean of |V|
// (docs/design.md#attention-precision). bf16 rows have their own pair kernel
// (sm90_pairs_bf16_kernel.cu).
//
// One CTA = one query token x a group of up to 64 heads x its key list (or, split, a slice of
// whole pairs: start_item), walked in blocks of 32 keys, two at a time (pair p = blocks 2p
// and 2p + 1), by three warpgroups:
//   math w (warpgroups 0, 1)  S = Q K^T of block 2p + w (wgmma m64n32k16, Q and K in shared
//       memory); the two exchange their blocks' row maxima, so that both rescale by one running
//       max; P_w = 2^(S - max) in bf16; then O_w (dims 256 w + [0, 256) of the 64 rows) +=
//       P_w V_w (P from registers) + P_{1-w} V_{1-w} (the other's P through shared memory), both
//       block 2p's product first: each warpgroup's tensor-core work per pair is the same.
//   producer (warpgroup 2)  decodes each key's e4m3 bytes (loaded into registers one block
//       ahead) into bf16 rows of four K buffers (masked keys as zero rows; an odd block count
//       ends on an all-masked block): pair p uses buffers 2 (p % 2) + {0, 1}, so that pair p + 1
//       is decoded while pair p is computed.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#pragma nv_diag_suppress 177
#endif

#include "attention/sm90_shapes.h"
#include "cuda/attention/fp8_decode.cuh"
#include "cuda/attention/grid_launch.cuh"
#include "cuda/attention/pairs_common.cuh"
#include "cuda/attention/ptx.cuh"
#include "cuda/attention/sm90_common.cuh"
#include "cuda/attention/sm90_kernels.h"
#include "cuda/attention/sm90_params.h"
#include "sparse_swa/attention.h"
#include "sparse_swa/kv_cache.h"

namespace sparse_swa::detail::sm90 {
namespace {

using pairs_fp8::kBlockKeys;
constexpr int kBuffers = 4;
// setmaxnreg: 168 registers at entry (384 threads), moved from the producer to the math threads;
// the producer holds two keys' bytes in registers.
constexpr int kMathRegs = 192, kProducerRegs = 120;
static_assert(2 * kMathRegs + kProducerRegs == 3 * 168);

// Shared memory, in bytes from a 1024-aligned base (Q at kQOff as in the other 64-row kernels).
struct PairsFp8Buffers {
  static constexpr int kBufBytes = kBlockKeys * kHeadDim * 2;  // [32 keys, 512] bf16, swizzled
  static constexpr int kColBlock = kBlockKeys * 128;           // one [32, 64 dims] column block
  static constexpr int kKOff = kQOff + kQBytes;                // K buffers 0..3
  // [2][64 heads, 32 keys] bf16 in 128-byte rows (columns 32-63 unused), swizzled.
  static constexpr int kPOff = kKOff + kBuffers * kBufBytes;
  static constexpr int kMaxOff = kPOff + 2 * kPBytes;           // [2][64] fp32 row maxima of a pair
  static constexpr int kSumOff = kMaxOff + 2 * kHeadGroup * 4;  // [2][64] fp32 row sums
  static constexpr int kRoundedSumOff = kSumOff + 2 * kHeadGroup * 4;  // + the top's rounding
  static constexpr int kMlOff = kRoundedSumOff + 2 * kHeadGroup * 4;   // [64] (max, sum)
  static constexpr int kMaskOff = kMlOff + kHeadGroup * 8;             // valid-key masks
  static_assert(kKOff % 1024 == 0 && kPOff % 1024 == 0 && kPBytes % 1024 == 0);
};
using PL = PairsFp8Buffers;
// kGroups: the CTA takes a query group's union (docs/design.md#query-groups), with a valid-key
// mask per token of the group. kSplit: the CTA takes a slice of its key list (its blocks from
// c.tile0 on); unsplit, block b is block b of the list.
template <bool kGroups, bool kSplit>
struct PairsFp8Layout : PairsFp8Buffers {
  static constexpr bool kQueryGroups = kGroups;
  static constexpr bool kSplitKeys = kSplit;
  static constexpr int kMaskWords = kGroups ? kMaxQueryGroup : 1;       // [4][kMaskWords] uint32
  static constexpr int kBarOff = kMaskOff + 4 * kBuffers * kMaskWords;  // ready[4], free[4]
  static constexpr size_t kSmem = kBarOff + (2 * kBuffers + 1) * 8 + 1024;  // + alignment slack
  static_assert(kSmem <= 227 * 1024, "more shared memory than an sm_90 CTA can have");
};

// Ready: buffer b holds its block's rows (each of the 128 producer threads arrives after its
// stores, the mask byte of its warp included). Free: both math warpgroups are done reading it
// (its own P V and the other's).
template <class L>
__device__ __forceinline__ uint32_t ready_bar(const Cta<L>& c, int b) {
  return c.sbase + L::kBarOff + 8 * b;
}
template <class L>
__device__ __forceinline__ uint32_t free_bar(const Cta<L>& c, int b) {
  return c.sbase + L::kBarOff + 8 * (kBuffers + b);
}
// Q's arrival (start_q_load; unused with query groups, whose math threads load Q).
template <class L>
__device__ __forceinline__ uint32_t q_bar(const Cta<L>& c) {
  return c.sbase + L::kBarOff + 8 * (2 * kBuffers);
}

// ---- producer: four threads per key ----

// The index entry of key `key` of block b (of the CTA's slice, from block c.tile0 on), or -1.
// (Unsplit, the place is spelled without c.tile0: through a shared helper ptxas lays the unsplit
// kernel out differently, and slower.)
template <class L>
__device__ __forceinline__ int32_t block_index(const PairsFp8Params& a, const Cta<L>& c, int b,
                                               int key) {
  if constexpr (L::kSplitKeys) {
    return item_key_index(a, c, (int64_t{c.tile0} + b) * kBlockKeys + key);
  }
  return item_key_index(a, c, int64_t{b} * kBlockKeys + key);
}

// Warp w records the valid bits of its keys 8 w..8 w + 7 (key tid / 4) as byte w of buffer
// buf's mask (of each token's mask, for a query group: a key is valid for the tokens whose bits
// it carries).
template <class L>
__device__ __forceinline__ void publish_mask(const PairsFp8Params& a, const Cta<L>& c, int buf,
                                             int tid, bool valid, uint32_t tokens) {
  // Lanes 4j of warp w hold keys 8w + j: their ballot bits, packed, are byte w of mask `word`.
  const auto store_byte = [&](int word, bool key_valid) {
    const uint32_t lanes = __ballot_sync(0xffffffffu, (tid & 3) == 0 && key_valid);
    if ((tid & 31) != 0) return;
    uint32_t bits = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) bits |= ((lanes >> (4 * j)) & 1u) << j;
    c.base[L::kMaskOff + 4 * (buf * L::kMaskWords + word) + (tid >> 5)] =
        static_cast<uint8_t>(bits);
  };
  if constexpr (L::kQueryGroups) {
    for (int t = 0; t < a.query_group; ++t) store_byte(t, valid && ((tokens >> t) & 1u));
  } else {
    (void)a;
    (void)tokens;
    store_byte(0, valid);
  }
}

// fp8_ds_mla: one producer thread's share of a key (part p = tid % 4 of key tid / 4): e4m3 chunks
// p + 4 r (r = 0..6, scale byte r each), bf16 RoPE chunks p and p + 4, the key's scale bytes; in
// a query group, the tokens that use the key.
struct RawKeyTokens {
  uint32_t tokens = 0;
};
struct RawKeyNoTokens {};
template <bool kGroups>
struct RawKey : std::conditional_t<kGroups, RawKeyTokens, RawKeyNoTokens> {
  uint4 nope[kNopeChunks / 4];
  uint4 rope[2];
  uint2 scales;
  bool valid;
};

// Where a producer thread's key of block b lies: its row and scale bytes (data == nullptr: masked),
// in a query group the word of the tokens that use it. Resolved a block before the loads start,
// so that the loads of a block go out at the top of the producer's loop.
struct PairKeySource {
  const uint8_t* data = nullptr;
  const uint8_t* scales = nullptr;
  const uint32_t* tokens = nullptr;
};

// Resolves block b's key from its index entry; entries < -1 or past the cache are counted once
// (head group 0, by part 0).
template <class L>
__device__ __forceinline__ PairKeySource resolve_block_key(const PairsFp8Params& a, const Cta<L>& c,
                                                           int b, int tid, int32_t idx) {
  const int key = tid >> 2, part = tid & 3;
  PairKeySource ref;
  if (idx == -1) return ref;
  int64_t j = int64_t{b} * kBlockKeys + key;
  if constexpr (L::kSplitKeys) j += int64_t{c.tile0} * kBlockKeys;
  const Segment& s = j < c.len0 ? a.seg0 : a.seg1;
  if (idx >= 0 && static_cast<uint32_t>(idx) < s.num_slots) {
    uint32_t offset;
    const uint8_t* page = slot_page(s, static_cast<uint32_t>(idx), offset);
    ref.data = page + static_cast<int64_t>(offset) * kDsMlaTokenBytes;
    ref.scales = page + static_cast<int64_t>(s.block_size) * kDsMlaTokenBytes +
                 static_cast<int64_t>(offset) * kDsMlaScaleBytes;
    if constexpr (L::kQueryGroups) ref.tokens = a.unions.tokens_of(c.t) + j;
  } else if (part == 0 && c.h0 == 0 && a.bad_count != nullptr) {
    atomicAdd(a.bad_count, 1);
  }
  return ref;
}

// Starts the loads of a resolved key's share (masked: nothing loaded).
template <bool kGroups>
__device__ __forceinline__ void load_raw(const PairKeySource& ref, int tid, RawKey<kGroups>& r) {
  const int part = tid & 3;
  r.valid = ref.data != nullptr;
  if (!r.valid) return;
#pragma unroll
  for (int i = 0; i < kNopeChunks / 4; ++i) {
    r.nope[i] = __ldg(reinterpret_cast<const uint4*>(ref.data + (part + 4 * i) * 16));
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    r.rope[i] = __ldg(reinterpret_cast<const uint4*>(ref.data + kNopeDim + (part + 4 * i) * 16));
  }
  r.scales = __ldg(reinterpret_cast<const uint2*>(ref.scales));
  if constexpr (kGroups) r.tokens = __ldg(ref.tokens);
}

// That share decoded into buffer `k` (zero rows for a masked key), as the tile32 kernel's
// decode_tile does from shared memory.
template <bool kGroups>
__device__ __forceinline__ void store_key(const RawKey<kGroups>& r, uint8_t* k, int tid) {
  const int key = tid >> 2, part = tid & 3;
  if (r.valid) {
    if (!has_huge_scale(r.scales)) {
      store_nope_share<false>(r.nope, r.scales, k, key, part, kBlockKeys);
    } else {
      store_nope_share<true>(r.nope, r.scales, k, key, part, kBlockKeys);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      *reinterpret_cast<uint4*>(k + sw128(key, kNopeDim + (part + 4 * i) * 8, kBlockKeys)) =
          r.rope[i];
    }
  } else {
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < kNopeChunks / 4; ++i) {
      *reinterpret_cast<uint4*>(k + sw128(key, (part + 4 * i) * 16, kBlockKeys)) = zero;
      *reinterpret_cast<uint4*>(k + sw128(key, (part + 4 * i) * 16 + 8, kBlockKeys)) = zero;
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      *reinterpret_cast<uint4*>(k + sw128(key, kNopeDim + (part + 4 * i) * 8, kBlockKeys)) = zero;
    }
  }
}

// fp8_ds_mla producer: block b + 1's bytes are loaded into registers while block b is decoded
// into its buffer (block b + 2's key resolved and block b + 3's index entry loaded meanwhile);
// every thread arrives on ready(buf) after its stores. early[b]: early_key_index of the thread's
// key of blocks 0..2 (issued before the lens were known).
template <class L>
__device__ void pairs_fp8_producer(const PairsFp8Params& a, const Cta<L>& c, int tid,
                                   const int32_t (&early)[3]) {
  const int key = tid >> 2;
  const int blocks = (c.n + 1) / 2 * 2;  // an odd count ends on an all-masked block
  RawKey<L::kQueryGroups> cur, next;
  const auto first_index = [&](int b) {
    return first_key_index(a, c, (int64_t{c.tile0} + b) * kBlockKeys + key, early[b]);
  };
  load_raw(resolve_block_key(a, c, 0, tid, first_index(0)), tid, cur);
  PairKeySource ref = resolve_block_key(a, c, 1, tid, first_index(1));
  int32_t idx = first_index(2);
  for (int b = 0; b < blocks; ++b) {
    const int p = b >> 1, buf = 2 * (p & 1) + (b & 1);
    const int32_t after = block_index(a, c, b + 3, key);
    load_raw(ref, tid, next);
    ref = resolve_block_key(a, c, b + 2, tid, idx);
    if (p >= 2) ptx::mbar_wait(free_bar(c, buf), ((p >> 1) - 1) & 1);
    store_key(cur, c.base + PL::kKOff + buf * PL::kBufBytes, tid);
    if constexpr (L::kQueryGroups) {
      publish_mask(a, c, buf, tid, cur.valid, cur.tokens);
    } else {
      publish_mask(a, c, buf, tid, cur.valid, 0u);
    }
    ptx::fence_proxy_async();  // wgmma reads these rows through the async proxy
    ptx::mbar_arrive(ready_bar(c, buf));
    cur = next;
    idx = after;
  }
}

// ---- math warpgroups ----

// S = Q K^T of the block in buffer `k_base` (32 wgmma m64n32k16 steps of 16 dims; a step's
// column block is step / 4, 32 bytes apart inside it).
__device__ __forceinline__ void qk_block(float (&s)[16], uint32_t q_base, uint32_t k_base) {
  const uint64_t q_desc = ptx::sw128_desc(q_base), k_desc = ptx::sw128_desc(k_base);
#pragma unroll
  for (int step = 0; step < kHeadDim / 16; ++step) {
    const uint32_t inner = (step & 3) * 32;
    const uint64_t da = ptx::desc_advance(q_desc, (step >> 2) * (kHeadGroup * 128) + inner);
    const uint64_t db = ptx::desc_advance(k_desc, (step >> 2) * PL::kColBlock + inner);
    if (step == 0) {
      ptx::wgmma_m64n32k16_first(s, da, db);
    } else {
      ptx::wgmma_m64n32k16(s, da, db, true);
    }
  }
}

// V descriptor of a K buffer (descriptor `v0` of its first byte): keys 16 kk + [0, 16) x dims
// 256 w + [0, 256).
__device__ __forceinline__ uint64_t v_desc(uint64_t v0, int w, int kk) {
  return ptx::desc_advance(v0, 4 * w * PL::kColBlock + kk * 2048);
}
__device__ __forceinline__ uint64_t v_base_desc(uint32_t k_base) {
  return ptx::sw128_desc(k_base, PL::kColBlock, 1024);
}

// w as a template argument: every shared-memory address below is then warp-uniform, and the
// wgmma descriptors live in uniform registers.
template <int w, class L>
__device__ void pair_math(const PairsFp8Params& a, const Cta<L>& c, int tid) {
  const int lane = tid & 31;
  const int row = 16 * (tid >> 5) + (lane >> 2);  // and row + 8
  int token[2] = {0, 0};  // a query group's rows: their tokens (rows past the group's: any)
  if constexpr (L::kQueryGroups) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      token[hh] = min((row + 8 * hh) / a.num_heads, kMaxQueryGroup - 1);
    }
  }
  const uint32_t q_base = c.sbase + kQOff;
  float* maxes = reinterpret_cast<float*>(c.base + PL::kMaxOff);
  float o[2][64];
#pragma unroll
  for (int k = 0; k < 64; ++k) o[0][k] = o[1][k] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};  // running max, log2 units (the same in both warpgroups)
  float l[2] = {0.0f, 0.0f};            // this thread's part of this warpgroup's sum
  float lr[2] = {0.0f, 0.0f};           // the same plus each block's largest P's rounding
  for (int p = 0; 2 * p < c.n; ++p) {
    const int mine = 2 * (p & 1) + w, theirs = 2 * (p & 1) + 1 - w;
    const uint32_t my_k = c.sbase + PL::kKOff + mine * PL::kBufBytes;
    const uint32_t other_k = c.sbase + PL::kKOff + theirs * PL::kBufBytes;
    float s[16];
    ptx::mbar_wait(ready_bar(c, mine), (p >> 1) & 1);
    ptx::fence_proxy_async();  // the copies, now visible here, before the async-proxy reads
    ptx::wgmma_fence();
    qk_block(s, q_base, my_k);
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    const uint32_t mask = *reinterpret_cast<const uint32_t*>(c.base + L::kMaskOff + 4 * mine);
    uint32_t token_masks[2] = {mask, mask};
    if constexpr (L::kQueryGroups) {
      const uint32_t* masks =
          reinterpret_cast<const uint32_t*>(c.base + L::kMaskOff) + mine * L::kMaskWords;
      token_masks[0] = masks[token[0]];
      token_masks[1] = masks[token[1]];
    }
    // Scaled scores (masked keys -inf) and this block's row maxima, exchanged.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool valid = (mask >> (8 * j + 2 * (lane & 3) + e)) & 1u;
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          float& x = s[4 * j + 2 * hh + e];
          const bool used =
              L::kQueryGroups ? (token_masks[hh] >> (8 * j + 2 * (lane & 3) + e)) & 1u : valid;
          x = used ? x * a.scale_log2 : -INFINITY;
          mx[hh] = fmaxf(mx[hh], x);
        }
      }
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 1));
      mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 2));
      if ((lane & 3) == 0) maxes[w * kHeadGroup + row + 8 * hh] = mx[hh];
    }
    ptx::named_barrier(4, 256);
    float corr[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float m_new = next_max(  // moves by more than kMaxLag only: most blocks rescale no O
          m[hh], fmaxf(mx[hh], maxes[(1 - w) * kHeadGroup + row + 8 * hh]));
      corr[hh] = m_new == -INFINITY ? 1.0f : fast_exp2(m[hh] - m_new);
      m[hh] = m_new;
    }
    if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) scale_rows(o, corr);
    // P in bf16: pa[2j] = row's columns 8j + 2 (lane % 4) + {0, 1}, pa[2j + 1] the same of
    // row + 8, which is also the A fragment of P V step kk = pa[4kk..4kk+3]. The sum takes P
    // before rounding (the lse stays exact; docs/design.md#attention-precision).
    uint32_t pa[8];
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const bool none = m[hh] == -INFINITY;
        const float p0 = none ? 0.0f : fast_exp2(s[4 * j + 2 * hh] - m[hh]);
        const float p1 = none ? 0.0f : fast_exp2(s[4 * j + 2 * hh + 1] - m[hh]);
        sum[hh] += p0 + p1;
        pa[2 * j + hh] = pack_bf16(p0, p1);
      }
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      l[hh] = l[hh] * corr[hh] + sum[hh];
      lr[hh] = rounded_sum_step(lr[hh], corr[hh], sum[hh], mx[hh], m[hh], lane);
    }
    // For the other warpgroup: P in 128-byte rows, swizzled like a K column block.
    store_p_sw128<4>(pa, c.sbase + PL::kPOff + w * kPBytes, tid);
    ptx::fence_proxy_async();
    const auto own_pv = [&] {  // P_w V_w, P from registers
      ptx::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        const uint32_t frag[4] = {pa[4 * kk], pa[4 * kk + 1], pa[4 * kk + 2], pa[4 * kk + 3]};
        ptx::wgmma_m64n256k16_rs_bt(o[0], o[1], frag, v_desc(v_base_desc(my_k), w, kk));
      }
      ptx::wgmma_commit();
    };
    const auto other_pv = [&] {  // P_{1-w} V_{1-w}, P through shared memory
      const uint64_t other_p = ptx::sw128_desc(c.sbase + PL::kPOff + (1 - w) * kPBytes);
      ptx::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        ptx::wgmma_m64n256k16_bt(o[0], o[1], ptx::desc_advance(other_p, kk * 32),
                                 v_desc(v_base_desc(other_k), w, kk));
      }
      ptx::wgmma_commit();
    };
    // Both warpgroups read block 2p (warpgroup 0's) first, so that its buffer, which the
    // producer refills first, comes free one P V step before block 2p + 1's.
    if constexpr (w == 0) {
      own_pv();
      ptx::named_barrier(5, 256);  // both P tiles are in shared memory
      other_pv();
    } else {
      ptx::named_barrier(5, 256);
      other_pv();
      own_pv();
    }
    ptx::wgmma_wait<1>();
    ptx::mbar_arrive(free_bar(c, 2 * (p & 1)));
    ptx::wgmma_wait<0>();
    ptx::mbar_arrive(free_bar(c, 2 * (p & 1) + 1));
  }
  finish_pair_rows(a, c, o, m, l, lr, w, row, lane, tid);
}

template <bool kGroups, bool kSplit>
__global__ void __launch_bounds__(pairs::kThreads, 1)
    sm90_pairs_fp8_kernel(const __grid_constant__ PairsFp8Params a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = PairsFp8Layout<kGroups, kSplit>;
  extern __shared__ uint8_t smem_raw[];
  Cta<L> c;
  place_smem(c, smem_raw);
  const int tid = threadIdx.x;
  start_item<kSplit>(a, c, blockIdx.x);
  // The producer's first index entries go out with the lens, before the barrier (so that nothing
  // is scheduled to wait for the lens ahead of them).
  int32_t early[3];
#pragma unroll
  for (int b = 0; b < 3; ++b) {
    early[b] = tid >= 256 ? early_key_index(a, c, b * kBlockKeys + ((tid - 256) >> 2)) : -1;
  }
  if (tid == 0) {
    for (int b = 0; b < kBuffers; ++b) {
      ptx::mbar_init(ready_bar(c, b), 128);
      ptx::mbar_init(free_bar(c, b), 256);
    }
    ptx::mbar_init(q_bar(c), 1);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  if constexpr (!kGroups) {
    if (tid == 0) start_q_load(a, c, q_bar(c));
  }
  settle_item<kSplit>(a, c, kBlockKeys);
  run_pair_roles<kMathRegs, kProducerRegs>(
      a, c, tid, [&](int t) { pairs_fp8_producer(a, c, t, early); },
      [&](auto w, int t) { pair_math<decltype(w)::value>(a, c, t); }, q_bar(c));
#else
  (void)a;  // sm_90a only
#endif
}

}  // namespace

Status launch_sm90_pairs_fp8(const PairsFp8Params& a, cudaStream_t stream) {
  constexpr int kThreads = pairs::kThreads;
  if (a.query_group > 1) {  // never split
    return launch_item_grid<sm90_pairs_fp8_kernel<true, false>>(
        a, PairsFp8Layout<true, false>::kSmem, kThreads, 0, 0, stream);
  }
  if (a.splits > 1) {
    return launch_item_grid<sm90_pairs_fp8_kernel<false, true>>(
        a, PairsFp8Layout<false, true>::kSmem, kThreads, 0, a.cluster_merge ? a.splits : 0, stream);
  }
  return launch_item_grid<sm90_pairs_fp8_kernel<false, false>>(
      a, PairsFp8Layout<false, false>::kSmem, kThreads, 0, 0, stream);
}

bool sm90_pairs_fp8_clusters_fit(int splits) {
  return clusters_fit<sm90_pairs_fp8_kernel<false, true>>(splits,
                                                          PairsFp8Layout<false, true>::kSmem);
}

}  // namespace sparse_swa::detail::sm90
