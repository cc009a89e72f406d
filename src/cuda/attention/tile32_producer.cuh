// SPDX-License-Identifier: Apache-2.0
// The producer role of the tile32 kernel (sm90_tile32_kernel.cu), warpgroup 0: gathers each
// tile's keys into shared memory and, for fp8_ds_mla caches, decodes them into the bf16 K stages
// that QK and PV read.
#pragma once

#include <cstdint>

#include "cuda/attention/fp8_decode.cuh"
#include "cuda/attention/ptx.cuh"
#include "cuda/attention/sm90_params.h"
#include "cuda/attention/tile32_layout.cuh"

namespace sparse_swa::detail::sm90 {

// The index entry of key `key` (= tid / 4) of tile i, or -1 past the tile list or the token's
// total (masked). Loaded one tile before resolve_key needs it, so that its latency hides behind a
// decode instead of stalling the producer.
template <class L>
__device__ __forceinline__ int32_t load_index(const Tile32Params& a, const Cta<L>& c, int i,
                                              int tid) {
  const int64_t j = int64_t{c.tile0 + i} * kTileKeys + (tid >> 2);
  if (i >= c.n || j >= c.total) return -1;
  const bool swa = j < c.len0;
  const Segment& s = swa ? a.seg0 : a.seg1;
  return s.indices[c.t * s.row_stride + (swa ? j : j - c.len0)];
}

// The index entries of the first kEarlyTiles tiles, loaded before the lens are known (c holds
// only the CTA's place): the slice and the segments' boundary guessed from full lens (each len its
// row's width). first_index keeps a guess that the settled lens confirm.
constexpr int kEarlyTiles = 4;
struct EarlyIndex {
  int32_t tile0 = 0;
  int32_t idx[kEarlyTiles] = {-1, -1, -1, -1};
};
template <class L>
__device__ __forceinline__ EarlyIndex load_early_index(const Tile32Params& a, const Cta<L>& c,
                                                       int tid) {
  const int32_t w0 = a.seg0.width, w1 = a.num_segments > 1 ? a.seg1.width : 0;
  const int32_t all_tiles = static_cast<int32_t>((int64_t{w0} + w1 + kTileKeys - 1) / kTileKeys);
  EarlyIndex e;
  e.tile0 = c.split * ((all_tiles + a.splits - 1) / a.splits);
#pragma unroll
  for (int i = 0; i < kEarlyTiles; ++i) {
    const int64_t j = int64_t{e.tile0 + i} * kTileKeys + (tid >> 2);
    if (j < w0) {
      e.idx[i] = a.seg0.indices[c.t * a.seg0.row_stride + j];
    } else if (j - w0 < w1) {
      e.idx[i] = a.seg1.indices[c.t * a.seg1.row_stride + (j - w0)];
    }
  }
  return e;
}
// load_index of tile i < kEarlyTiles, from the early guess where the settled CTA confirms it: the
// same first tile, and key j either in the SWA segment (j < len0 <= width) or past a full one.
template <class L>
__device__ __forceinline__ int32_t first_index(const Tile32Params& a, const Cta<L>& c, int i,
                                               int tid, const EarlyIndex& e) {
  const int64_t j = int64_t{c.tile0 + i} * kTileKeys + (tid >> 2);
  if (i >= c.n || j >= c.total) return -1;
  if (c.tile0 == e.tile0 && (j < c.len0 || c.len0 == a.seg0.width)) return e.idx[i];
  return load_index(a, c, i, tid);
}

// Where the key with index entry idx of tile i lives: its data (and fp8_ds_mla scale) bytes, or
// nothing (masked). Entries < -1 or >= num_slots are counted (once: head group 0, the thread of
// part 0). 128 threads, 4 per key.
struct KeySource {
  const uint8_t* data = nullptr;
  const uint8_t* scales = nullptr;
};
template <class L>
__device__ __forceinline__ KeySource resolve_key(const Tile32Params& a, const Cta<L>& c, int i,
                                                 int tid, int32_t idx) {
  KeySource k;
  if (idx == -1) return k;
  const int64_t j = int64_t{c.tile0 + i} * kTileKeys + (tid >> 2);
  const Segment& s = j < c.len0 ? a.seg0 : a.seg1;
  if (idx >= 0 && static_cast<uint32_t>(idx) < s.num_slots) {
    uint32_t offset;
    const uint8_t* page = slot_page(s, static_cast<uint32_t>(idx), offset);
    if constexpr (L::kBf16) {
      k.data = page + static_cast<int64_t>(offset) * kBf16RowBytes;
    } else {
      k.data = page + static_cast<int64_t>(offset) * kDsMlaTokenBytes;
      k.scales = page + static_cast<int64_t>(s.block_size) * kDsMlaTokenBytes +
                 static_cast<int64_t>(offset) * kDsMlaScaleBytes;
    }
  } else if ((tid & 3) == 0 && c.h0 == 0 && a.bad_count != nullptr) {
    atomicAdd(a.bad_count, 1);
  }
  return k;
}

// Starts the copies of tile i's keys into raw stage i % L::kRawStages and records which keys are
// valid.
template <class L>
__device__ __forceinline__ void gather_tile(const Cta<L>& c, int i, int tid, const KeySource& k) {
  const int key = tid >> 2;
  const int part = tid & 3;
  uint8_t* raw = c.base + L::kRawOff + (i % L::kRawStages) * kRawStage;
  if (k.data != nullptr) {
    const uint32_t dst = ptx::smem_addr(raw + key * kDsMlaTokenBytes);
#pragma unroll
    for (int ch = part; ch < kChunks; ch += 4) ptx::cp_async_16(dst + ch * 16, k.data + ch * 16);
    if (part == 0) {
      ptx::cp_async_8(ptx::smem_addr(raw + kRawScales + key * kDsMlaScaleBytes), k.scales);
    }
  }
  if (part == 0)
    c.base[L::kValidRawOff + (i % L::kRawStages) * kTileKeys + key] = k.data != nullptr;
}

// One thread's seven NoPE chunks of a key (part p: chunks p, p + 4, ..., scale byte r for its
// r-th chunk), with no branch between chunks so that their loads and conversions interleave.
// kHuge: some scale byte of the key is 255.
template <bool kHuge>
__device__ __forceinline__ void decode_nope(const uint8_t* src, uint2 sc, uint8_t* k, int key,
                                            int part) {
#pragma unroll
  for (int r = 0; r < kNopeChunks / 4; ++r) {
    const int ch = part + 4 * r;
    const uint4 v = *reinterpret_cast<const uint4*>(src + ch * 16);
    uint4 lo, hi;
    decode_nope_chunk<kHuge>(v, sc, r, lo, hi);
    *reinterpret_cast<uint4*>(k + sw128(key, ch * 16, kTileKeys)) = lo;
    *reinterpret_cast<uint4*>(k + sw128(key, ch * 16 + 8, kTileKeys)) = hi;
  }
}

// Raw stage i % L::kRawStages -> K stage, swizzled bf16; invalid keys become zero rows. 128
// threads, 4 per key: part p decodes NoPE chunks p, p + 4, ... (scale byte r for its r-th chunk)
// and RoPE chunks 28 + p, 32 + p. No divergence inside a warp but masked keys, every loop unrolled.
template <class L>
__device__ __forceinline__ void decode_tile(const Cta<L>& c, int i, int stage, int tid) {
  const int key = tid >> 2;
  const int part = tid & 3;
  const uint8_t* raw = c.base + L::kRawOff + (i % L::kRawStages) * kRawStage;
  const uint8_t* src = raw + key * kDsMlaTokenBytes;
  uint8_t* k = c.base + kKOff + stage * kKBytes;
  const bool ok = c.base[L::kValidRawOff + (i % L::kRawStages) * kTileKeys + key] != 0;
  if (ok) {
    const uint2 sc = *reinterpret_cast<const uint2*>(raw + kRawScales + key * kDsMlaScaleBytes);
    if (!has_huge_scale(sc)) {
      decode_nope<false>(src, sc, k, key, part);
    } else {
      decode_nope<true>(src, sc, k, key, part);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int ch = kNopeChunks + part + 4 * r;
      *reinterpret_cast<uint4*>(k + sw128(key, kNopeDim + (ch - kNopeChunks) * 8, kTileKeys)) =
          *reinterpret_cast<const uint4*>(src + ch * 16);
    }
  } else {
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int r = 0; r < kNopeChunks / 4; ++r) {
      const int ch = part + 4 * r;
      *reinterpret_cast<uint4*>(k + sw128(key, ch * 16, kTileKeys)) = zero;
      *reinterpret_cast<uint4*>(k + sw128(key, ch * 16 + 8, kTileKeys)) = zero;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      *reinterpret_cast<uint4*>(k + sw128(key, kNopeDim + (part + 4 * r) * 8, kTileKeys)) = zero;
    }
  }
  if (tid < 32) {  // warp 0: the stage's valid-key mask, bit k for key k
    const uint32_t mask = __ballot_sync(
        0xffffffffu, c.base[L::kValidRawOff + (i % L::kRawStages) * kTileKeys + tid] != 0);
    if (tid == 0) *reinterpret_cast<uint32_t*>(c.base + L::kValidKOff + stage * 4) = mask;
  }
}

template <class L>
__device__ void decode_producer(const Tile32Params& a, const Cta<L>& c, int tid,
                                const EarlyIndex& early) {
  static_assert(L::kRawStages <= kEarlyTiles);
  int32_t idx[L::kRawStages];
#pragma unroll
  for (int i = 0; i < L::kRawStages; ++i) idx[i] = first_index(a, c, i, tid, early);
#pragma unroll
  for (int i = 0; i + 1 < L::kRawStages; ++i) {
    gather_tile(c, i, tid, resolve_key(a, c, i, tid, idx[i]));
    ptx::cp_async_commit();
  }
  int32_t next = idx[L::kRawStages - 1];  // the index entry of tile i + L::kRawStages - 1
  for (int i = 0; i < c.n; ++i) {
    const int stage = i % L::kKStages;
    const int ahead = i + L::kRawStages - 1;
    // The next iteration's entry is in flight while tile i is decoded.
    const int32_t after = load_index(a, c, ahead + 1, tid);
    ptx::cp_async_wait<L::kRawStages - 2>();
    ptx::named_barrier(1, 128);  // every producer thread's copies of tile i have landed
    if (i >= L::kKStages) ptx::mbar_wait(c.k_empty(stage), ((i / L::kKStages) - 1) & 1);
    decode_tile(c, i, stage, tid);
    ptx::fence_proxy_async();  // wgmma reads these rows through the async proxy
    ptx::mbar_arrive(c.k_full(stage));
    ptx::named_barrier(1, 128);  // raw stage i % L::kRawStages is free again
    if (ahead < c.n) gather_tile(c, ahead, tid, resolve_key(a, c, ahead, tid, next));
    ptx::cp_async_commit();
    next = after;
  }
  ptx::cp_async_wait<0>();
}

// bf16 caches: tile i's rows go straight into K stage i % kKStages by cp.async (the 1024 bytes of
// a key as 64 chunks, 16 per thread), masked keys as zero rows; each warp records the valid bits
// of its 8 keys in the stage's mask. Tiles are published in order; a stage is refilled with the
// tile kKStages - 1 ahead once the tile before the published one has left it.
template <class L>
__device__ __forceinline__ void copy_tile(const Cta<L>& c, int i, int tid, const KeySource& k) {
  const int key = tid >> 2;
  const int part = tid & 3;
  const int stage = i % L::kKStages;
  uint8_t* dst = c.base + kKOff + stage * kKBytes;
  if (k.data != nullptr) {
#pragma unroll
    for (int ch = part; ch < kHeadDim / 8; ch += 4) {
      ptx::cp_async_16(ptx::smem_addr(dst + sw128(key, ch * 8, kTileKeys)), k.data + ch * 16);
    }
  } else {
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int ch = part; ch < kHeadDim / 8; ch += 4) {
      *reinterpret_cast<uint4*>(dst + sw128(key, ch * 8, kTileKeys)) = zero;
    }
  }
  // Lanes 4j of warp w hold keys 8w + j: their ballot bits, packed, are the mask's byte w.
  const uint32_t lanes = __ballot_sync(0xffffffffu, part == 0 && k.data != nullptr);
  if ((tid & 31) == 0) {
    uint32_t bits = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) bits |= ((lanes >> (4 * j)) & 1u) << j;
    c.base[L::kValidKOff + stage * 4 + (tid >> 5)] = static_cast<uint8_t>(bits);
  }
}

template <class L>
__device__ void copy_producer(const Tile32Params& a, const Cta<L>& c, int tid,
                              const EarlyIndex& early) {
  constexpr int kAhead = L::kKStages - 1;
  static_assert(kAhead + 1 <= kEarlyTiles);
  int32_t idx[kAhead];
#pragma unroll
  for (int i = 0; i < kAhead; ++i) idx[i] = first_index(a, c, i, tid, early);
#pragma unroll
  for (int i = 0; i < kAhead; ++i) {
    if (i < c.n) copy_tile(c, i, tid, resolve_key(a, c, i, tid, idx[i]));
    ptx::cp_async_commit();
  }
  int32_t next = first_index(a, c, kAhead, tid, early);  // the entry of tile i + kAhead
  for (int i = 0; i < c.n; ++i) {
    const int ahead = i + kAhead;
    const int32_t after = load_index(a, c, ahead + 1, tid);
    ptx::cp_async_wait<kAhead - 1>();  // this thread's copies of tile i have landed
    ptx::fence_proxy_async();          // wgmma reads these rows through the async proxy
    ptx::mbar_arrive(c.k_full(i % L::kKStages));
    if (ahead < c.n) {
      // Stage ahead % kKStages last held tile i - 1.
      if (i >= 1) ptx::mbar_wait(c.k_empty((i - 1) % L::kKStages), ((i - 1) / L::kKStages) & 1);
      copy_tile(c, ahead, tid, resolve_key(a, c, ahead, tid, next));
    }
    ptx::cp_async_commit();
    next = after;
  }
  ptx::cp_async_wait<0>();
}

}  // namespace sparse_swa::detail::sm90
