// SPDX-License-Identifier: Apache-2.0
// What the sm_90a attention kernels share on the device: the 128-byte swizzle, a key's place in
// its cache, the per-CTA state (Cta) and the Q tile every 64-row kernel loads, P's bf16 packing
// and the finish of a row. The families' own layouts are in their kernel files and
// tile32_layout.cuh.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "attention/sm90_shapes.h"
#include "cuda/attention/ptx.cuh"
#include "cuda/attention/sm90_params.h"
#include "sparse_swa/kv_cache.h"

namespace sparse_swa::detail::sm90 {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared memory of the 64-row kernels, in bytes from a 1024-aligned base: Q first.
constexpr int kQBytes = kHeadGroup * kHeadDim * 2;  // [64, 512] bf16, swizzled
constexpr int kQOff = 0;
// A P tile: [64 heads, 64] bf16, one 128-byte row per head, swizzled like a K column block.
constexpr int kPBytes = kHeadGroup * 128;

// Byte offset of bf16 element (row, col) in a swizzled [rows, 512] tile: 8 column blocks of
// [rows, 64 values = 128 bytes]; the 16-byte chunk index is XOR-ed with row % 8.
__device__ __forceinline__ uint32_t sw128(int row, int col, int rows) {
  return static_cast<uint32_t>((col >> 6) * rows * 128 + row * 128 +
                               ((((col & 63) >> 3) ^ (row & 7)) << 4) + ((col & 7) << 1));
}

// The page that holds slot idx (idx < s.num_slots) and the slot's place in it.
__device__ __forceinline__ const uint8_t* slot_page(const Segment& s, uint32_t idx,
                                                    uint32_t& offset) {
  const uint32_t block =
      static_cast<uint32_t>((static_cast<uint64_t>(idx) * s.block_magic) >> s.block_shift);
  offset = idx - block * s.block_size;
  return s.cache + static_cast<int64_t>(block) * s.page_stride;
}

// The bf16 row of slot idx (idx < s.num_slots) of a bf16 cache: [kHeadDim] bf16.
__device__ __forceinline__ const uint8_t* bf16_slot_row(const Segment& s, uint32_t idx) {
  uint32_t offset;
  const uint8_t* page = slot_page(s, idx, offset);
  return page + static_cast<int64_t>(offset) * kBf16RowBytes;
}

// A finished row from its running max m (log2 units) and sum l: its lse (natural log) and the
// factor its unnormalised O takes (1 / l, shared with the sink's weight `sink`, a logit; nullptr:
// none). No valid key (m = -inf): lse +inf and factor 0, so the row is zeros.
struct RowFinish {
  float lse = INFINITY;
  float factor = 0.0f;
};
__device__ __forceinline__ RowFinish finish_row(float m, float l, const float* sink) {
  RowFinish f;
  if (m != -INFINITY) {
    f.lse = (m + log2f(l)) * kLn2;
    f.factor = 1.0f / l;
    if (sink != nullptr) f.factor /= 1.0f + expf(*sink - f.lse);
  }
  return f;
}

__device__ __forceinline__ uint32_t pack_bf16(float x, float y) {
  const __nv_bfloat162 b = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&b);
}
__device__ __forceinline__ float2 unpack_bf16(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

__device__ __forceinline__ float fast_exp2(float x) {  // 2^x, -inf -> 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// What rounding to bf16 adds to p (P V takes P rounded; docs/design.md#attention-precision).
__device__ __forceinline__ float bf16_rounding(float p) {
  return __bfloat162float(__float2bfloat16_rn(p)) - p;
}

// The running max after a block whose own max is `block`: the old one unless the block's exceeds
// it by more than kMaxLag (log2 units), so that most blocks rescale no accumulator. P = 2^(s - max)
// then stays below 2^kMaxLag; O and the sum carry the same factor, which the finish divides out
// (docs/design.md#attention-precision).
constexpr float kMaxLag = 8.0f;
__device__ __forceinline__ float next_max(float m, float block) {
  return block > m + kMaxLag ? block : m;  // m = -inf: any finite block moves it
}

template <class L>
struct Cta {
  int64_t t;  // key row: the query token, or its query group
  int h0;     // first head of the head group
  int heads;  // rows of the CTA, 1..64: heads of the head group, or the query group's rows
  int split;
  int32_t len0;    // valid SWA entries (clamped)
  int64_t total;   // valid entries of both segments
  int32_t tile0;   // first tile of this split
  int32_t n;       // tiles of this split
  uint8_t* base;   // 1024-aligned shared memory
  uint32_t sbase;  // its shared-window address
  // Row r of the CTA as a row of the [T x H] rows of q, out and lse, and its head: t H + h0 + r,
  // or t g H + r for a query group (kernels whose layout has kQueryGroups take only those).
  // load_q, row_out and store_rows spell the per-token row out beside row(): through row() the
  // bf16 pair kernel's registers spill 8 bytes instead of 4.
  template <class P>
  __device__ __forceinline__ int64_t row(const P& a, int r) const {
    if constexpr (L::kQueryGroups) return t * a.query_group * a.num_heads + r;
    return t * a.num_heads + h0 + r;
  }
  template <class P>
  __device__ __forceinline__ int head(const P& a, int r) const {
    if constexpr (L::kQueryGroups) return r % a.num_heads;
    return h0 + r;
  }
  __device__ uint32_t bar(int i) const { return sbase + L::kBarOff + 8 * i; }
  __device__ uint32_t k_full(int s) const { return bar(s); }
  __device__ uint32_t k_empty(int s) const { return bar(L::kKStages + s); }
  __device__ uint32_t p_full(int b) const { return bar(2 * L::kKStages + b); }
  __device__ uint32_t p_empty(int b) const { return bar(2 * L::kKStages + L::kPBufs + b); }
  __device__ uint32_t q_full() const { return bar(2 * L::kKStages + 2 * L::kPBufs); }
};

// Points c at the dynamic shared memory `raw`, from its first 1024-byte boundary (the swizzled
// tiles need 1024-byte bases; the layouts' kSmem includes the slack).
template <class L>
__device__ __forceinline__ void place_smem(Cta<L>& c, uint8_t* raw) {
  const uint32_t raw_addr = ptx::smem_addr(raw);
  const uint32_t pad = (1024u - (raw_addr & 1023u)) & 1023u;
  c.base = raw + pad;
  c.sbase = raw_addr + pad;
}

// The CTA's Q rows into shared memory at kQOff, swizzled (rows past c.heads as zero rows),
// by kLoaders threads (t = 0..kLoaders - 1), all loads in flight before the first store. The
// caller fences for the async proxy and synchronises its loaders.
template <int kLoaders, class P, class L>
__device__ __forceinline__ void load_q(const P& a, const Cta<L>& c, int t) {
  constexpr int kChunks = kHeadGroup * (kHeadDim / 8);  // 16-byte chunks
  constexpr int kLoads = (kChunks + kLoaders - 1) / kLoaders;
  uint4 qv[kLoads];
#pragma unroll
  for (int r = 0; r < kLoads; ++r) {
    const int i = t + r * kLoaders;
    const int h = i / (kHeadDim / 8);
    const int col = (i % (kHeadDim / 8)) * 8;
    qv[r] =
        (kChunks % kLoaders == 0 || i < kChunks) && h < c.heads
            ? *reinterpret_cast<const uint4*>(
                  a.q + (L::kQueryGroups ? c.row(a, h) : c.t * a.num_heads + c.h0 + h) * kHeadDim +
                  col)
            : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int r = 0; r < kLoads; ++r) {
    const int i = t + r * kLoaders;
    if (kChunks % kLoaders == 0 || i < kChunks) {
      *reinterpret_cast<uint4*>(
          c.base + kQOff + sw128(i / (kHeadDim / 8), (i % (kHeadDim / 8)) * 8, kHeadGroup)) = qv[r];
    }
  }
}

// The segments' lens as loaded (raw1: the extra segment's, any value with one segment) clamped to
// their row widths, since device lens are data: c.len0, and c.total for both segments.
template <class L>
__device__ __forceinline__ void clamp_lens(const CallRows& a, Cta<L>& c, int32_t raw0,
                                           int32_t raw1) {
  c.len0 = min(max(raw0, 0), a.seg0.width);
  const int32_t len1 = a.num_segments > 1 ? min(max(raw1, 0), a.seg1.width) : 0;
  c.total = int64_t{c.len0} + len1;
}

// The CTA's Q rows (as load_q lays them out) by the tensor map, completing on `q_bar` (one
// thread, once per token and head group; heads past H arrive as zeros).
template <class L>
__device__ __forceinline__ void start_q_load(const HeadRowMaps& a, const Cta<L>& c,
                                             uint32_t q_bar) {
  static_assert(!L::kQueryGroups, "the tensor map holds Q per token");
  ptx::mbar_arrive_expect_tx(q_bar, kQBytes);
#pragma unroll
  for (int cb = 0; cb < kHeadDim / 64; ++cb) {
    ptx::tma_load_3d(c.sbase + kQOff + cb * kHeadGroup * 128, &a.q_map, 64 * cb, c.h0,
                     static_cast<int>(c.t), q_bar);
  }
}

}  // namespace sparse_swa::detail::sm90
