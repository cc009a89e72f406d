// SPDX-License-Identifier: Apache-2.0
// The producer role of the tensor-core attention kernel (src/cuda/attention_ds_mla.cu), warpgroup
// 0: gathers each tile's keys into shared memory and, for fp8_ds_mla caches, decodes them into the
// bf16 K stages that QK and PV read.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/attention_ds_mla_layout.cuh"
#include "cuda/mma_ptx.cuh"

namespace sparse_swa::detail::ds_mla {

// ---- producer: gather and decode ----

// The index entry of key `key` (= tid / 4) of tile i, or -1 past the tile list or the token's
// total (masked). Loaded one tile before resolve_key needs it, so that its latency hides behind a
// decode instead of stalling the producer.
template <class L>
__device__ __forceinline__ int32_t load_index(const Args& a, const Cta<L>& c, int i, int tid) {
  const int64_t j = int64_t{c.tile0 + i} * kKeys + (tid >> 2);
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
__device__ __forceinline__ EarlyIndex load_early_index(const Args& a, const Cta<L>& c, int tid) {
  const int32_t w0 = a.seg0.width, w1 = a.num_segments > 1 ? a.seg1.width : 0;
  const int32_t all_tiles = static_cast<int32_t>((int64_t{w0} + w1 + kKeys - 1) / kKeys);
  EarlyIndex e;
  e.tile0 = c.split * ((all_tiles + a.splits - 1) / a.splits);
#pragma unroll
  for (int i = 0; i < kEarlyTiles; ++i) {
    const int64_t j = int64_t{e.tile0 + i} * kKeys + (tid >> 2);
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
__device__ __forceinline__ int32_t first_index(const Args& a, const Cta<L>& c, int i, int tid,
                                               const EarlyIndex& e) {
  const int64_t j = int64_t{c.tile0 + i} * kKeys + (tid >> 2);
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
__device__ __forceinline__ KeySource resolve_key(const Args& a, const Cta<L>& c, int i, int tid,
                                                 int32_t idx) {
  KeySource k;
  if (idx == -1) return k;
  const int64_t j = int64_t{c.tile0 + i} * kKeys + (tid >> 2);
  const Segment& s = j < c.len0 ? a.seg0 : a.seg1;
  if (idx >= 0 && static_cast<uint32_t>(idx) < s.num_slots) {
    uint32_t offset;
    const uint8_t* page = slot_page(s, static_cast<uint32_t>(idx), offset);
    if constexpr (L::kBf16) {
      k.data = page + static_cast<int64_t>(offset) * kBf16TokenBytes;
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
  if (part == 0) c.base[L::kValidRawOff + (i % L::kRawStages) * kKeys + key] = k.data != nullptr;
}

// Two e4m3 codes (low byte first) times scale = 2^(s - 127) as a bf16 pair; exact (NaN stays
// NaN). 2^128 (s = 255) is not a float: kHuge keys multiply by scale, then by `twice` (2 for such
// a chunk, else 1), as the CPU does.
template <bool kHuge>
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t two, float scale, float twice) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  float2 f = __half22float2(__half2(h));
  f.x *= scale;
  f.y *= scale;
  if constexpr (kHuge) {
    f.x *= twice;
    f.y *= twice;
  }
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<const uint32_t*>(&b);
}
// 16 e4m3 codes -> 16 bf16 (lo: the first 8).
template <bool kHuge>
__device__ __forceinline__ void decode_chunk(const uint4& v, float scale, float twice, uint4& lo,
                                             uint4& hi) {
  lo.x = e4m3x2_to_bf16x2<kHuge>(v.x, scale, twice);
  lo.y = e4m3x2_to_bf16x2<kHuge>(v.x >> 16, scale, twice);
  lo.z = e4m3x2_to_bf16x2<kHuge>(v.y, scale, twice);
  lo.w = e4m3x2_to_bf16x2<kHuge>(v.y >> 16, scale, twice);
  hi.x = e4m3x2_to_bf16x2<kHuge>(v.z, scale, twice);
  hi.y = e4m3x2_to_bf16x2<kHuge>(v.z >> 16, scale, twice);
  hi.z = e4m3x2_to_bf16x2<kHuge>(v.w, scale, twice);
  hi.w = e4m3x2_to_bf16x2<kHuge>(v.w >> 16, scale, twice);
}

// Scale byte s as the float 2^(s - 127) (s = 0: the subnormal 2^-127). 2^128 (s = 255) is not a
// float: kHuge gives 2^127 and twice = 2 for it (else 1), to be applied after the first multiply.
template <bool kHuge>
__device__ __forceinline__ float scale_from_byte(uint32_t sb, float& twice) {
  const uint32_t bits = sb == 0 ? 0x00400000u : (kHuge && sb == 255 ? 254u << 23 : sb << 23);
  twice = kHuge && sb == 255 ? 2.0f : 1.0f;
  return __uint_as_float(bits);
}

// NoPE chunk r of a thread's share of a key (16 e4m3 codes, scale byte r of the key's scales
// sc) as 16 bf16 (lo: the first 8).
template <bool kHuge>
__device__ __forceinline__ void decode_nope_chunk(const uint4& v, uint2 sc, int r, uint4& lo,
                                                  uint4& hi) {
  const uint32_t sb = ((r < 4 ? sc.x : sc.y) >> (8 * (r & 3))) & 0xffu;
  float twice;
  const float scale = scale_from_byte<kHuge>(sb, twice);
  decode_chunk<kHuge>(v, scale, twice, lo, hi);
}

// A thread's share of a key's NoPE codes held in registers (part p: chunks p + 4 r, r = 0..6,
// scale byte r of sc for the r-th), decoded into a swizzled [rows, 512] bf16 tile.
template <bool kHuge>
__device__ __forceinline__ void store_nope_share(const uint4 (&codes)[kNopeChunks / 4], uint2 sc,
                                                 uint8_t* k, int key, int part, int rows) {
#pragma unroll
  for (int r = 0; r < kNopeChunks / 4; ++r) {
    const int ch = part + 4 * r;
    uint4 lo, hi;
    decode_nope_chunk<kHuge>(codes[r], sc, r, lo, hi);
    *reinterpret_cast<uint4*>(k + sw128(key, ch * 16, rows)) = lo;
    *reinterpret_cast<uint4*>(k + sw128(key, ch * 16 + 8, rows)) = hi;
  }
}

// One thread's seven NoPE chunks of a key (part p: chunks p, p + 4, ..., scale byte r for its
// r-th chunk), with no branch between chunks so that their loads and conversions interleave.
// kHuge: some scale byte of the key is 255.
template <bool kHuge>
__device__ __forceinline__ void decode_nope(const uint8_t* src, uint2 sc, uint8_t* k, int key,
                                            int part, int i, int tid, int ablate) {
  uint32_t sink = 0;
#pragma unroll
  for (int r = 0; r < kNopeChunks / 4; ++r) {
    const int ch = part + 4 * r;
    uint4 v;
    if (kDecodeAblations && (ablate & kAblateDecodeReads)) {
      const uint32_t x = (static_cast<uint32_t>(tid) * 0x9e3779b9u) ^ (i * 0x01010101u) ^ r;
      v = make_uint4(x & 0x3f3f3f3fu, (x >> 1) & 0x3f3f3f3fu, (x >> 2) & 0x3f3f3f3fu,
                     (x >> 3) & 0x3f3f3f3fu);
    } else {
      v = *reinterpret_cast<const uint4*>(src + ch * 16);
    }
    uint4 lo, hi;
    decode_nope_chunk<kHuge>(v, sc, r, lo, hi);
    if (kDecodeAblations && (ablate & kAblateDecodeStores)) {
      sink ^= lo.x ^ lo.y ^ lo.z ^ lo.w ^ hi.x ^ hi.y ^ hi.z ^ hi.w;
    } else {
      *reinterpret_cast<uint4*>(k + sw128(key, ch * 16, kKeys)) = lo;
      *reinterpret_cast<uint4*>(k + sw128(key, ch * 16 + 8, kKeys)) = hi;
    }
  }
  // Keeps the conversions of a store-less ablation alive (never true for real codes).
  if (kDecodeAblations && sink == 0x7fc17fc1u) *reinterpret_cast<uint32_t*>(k) = sink;
}

// True when one of the key's seven scale bytes is 255 (byte 7 is padding): a 255 byte is a zero
// byte of the complement.
__device__ __forceinline__ bool has_huge_scale(uint2 sc) {
  const uint32_t x = ~sc.x, y = ~(sc.y & 0x00ffffffu);
  return ((((x - 0x01010101u) & ~x) | ((y - 0x01010101u) & ~y)) & 0x80808080u) != 0;
}

// Raw stage i % L::kRawStages -> K stage, swizzled bf16; invalid keys become zero rows. 128
// threads, 4 per key: part p decodes NoPE chunks p, p + 4, ... (scale byte r for its r-th chunk)
// and RoPE chunks 28 + p, 32 + p. No divergence inside a warp but masked keys, every loop unrolled.
template <class L>
__device__ __forceinline__ void decode_tile(const Cta<L>& c, int i, int stage, int tid,
                                            int ablate) {
  const int key = tid >> 2;
  const int part = tid & 3;
  const uint8_t* raw = c.base + L::kRawOff + (i % L::kRawStages) * kRawStage;
  const uint8_t* src = raw + key * kDsMlaTokenBytes;
  uint8_t* k = c.base + kKOff + stage * kKBytes;
  const bool ok = c.base[L::kValidRawOff + (i % L::kRawStages) * kKeys + key] != 0;
  if (ok) {
    const uint2 sc = *reinterpret_cast<const uint2*>(raw + kRawScales + key * kDsMlaScaleBytes);
    if (!has_huge_scale(sc)) {
      decode_nope<false>(src, sc, k, key, part, i, tid, ablate);
    } else {
      decode_nope<true>(src, sc, k, key, part, i, tid, ablate);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int ch = kNopeChunks + part + 4 * r;
      *reinterpret_cast<uint4*>(k + sw128(key, kNopeDim + (ch - kNopeChunks) * 8, kKeys)) =
          *reinterpret_cast<const uint4*>(src + ch * 16);
    }
  } else {
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int r = 0; r < kNopeChunks / 4; ++r) {
      const int ch = part + 4 * r;
      *reinterpret_cast<uint4*>(k + sw128(key, ch * 16, kKeys)) = zero;
      *reinterpret_cast<uint4*>(k + sw128(key, ch * 16 + 8, kKeys)) = zero;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      *reinterpret_cast<uint4*>(k + sw128(key, kNopeDim + (part + 4 * r) * 8, kKeys)) = zero;
    }
  }
  if (tid < 32) {  // warp 0: the stage's valid-key mask, bit k for key k
    const uint32_t mask = __ballot_sync(
        0xffffffffu, c.base[L::kValidRawOff + (i % L::kRawStages) * kKeys + tid] != 0);
    if (tid == 0) *reinterpret_cast<uint32_t*>(c.base + L::kValidKOff + stage * 4) = mask;
  }
}

template <class L>
__device__ void decode_producer(const Args& a, const Cta<L>& c, int tid, const EarlyIndex& early) {
  RoleClock clk(a, 0);  // slots: landed wait, stage wait, decode, gather
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
    const int32_t after = (a.ablate & kAblateGather) ? -1 : load_index(a, c, ahead + 1, tid);
    ptx::cp_async_wait<L::kRawStages - 2>();
    ptx::named_barrier(1, 128);  // every producer thread's copies of tile i have landed
    clk.lap(0);
    if (i >= L::kKStages) ptx::mbar_wait(c.k_empty(stage), ((i / L::kKStages) - 1) & 1);
    clk.lap(1);
    if (!(a.ablate & kAblateDecode)) decode_tile(c, i, stage, tid, a.ablate);
    ptx::fence_proxy_async();  // wgmma reads these rows through the async proxy
    ptx::mbar_arrive(c.k_full(stage));
    clk.lap(2);
    ptx::named_barrier(1, 128);  // raw stage i % L::kRawStages is free again
    if (ahead < c.n && !(a.ablate & kAblateGather)) {
      gather_tile(c, ahead, tid, resolve_key(a, c, ahead, tid, next));
    }
    ptx::cp_async_commit();
    next = after;
    clk.lap(3);
  }
  ptx::cp_async_wait<0>();
  clk.store(c.n);
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
      ptx::cp_async_16(ptx::smem_addr(dst + sw128(key, ch * 8, kKeys)), k.data + ch * 16);
    }
  } else {
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int ch = part; ch < kHeadDim / 8; ch += 4) {
      *reinterpret_cast<uint4*>(dst + sw128(key, ch * 8, kKeys)) = zero;
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
__device__ void copy_producer(const Args& a, const Cta<L>& c, int tid, const EarlyIndex& early) {
  RoleClock clk(a, 0);  // slots: landed wait, stage wait, -, copy
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
    clk.lap(0);
    ptx::fence_proxy_async();  // wgmma reads these rows through the async proxy
    ptx::mbar_arrive(c.k_full(i % L::kKStages));
    if (ahead < c.n) {
      // Stage ahead % kKStages last held tile i - 1.
      if (i >= 1) ptx::mbar_wait(c.k_empty((i - 1) % L::kKStages), ((i - 1) / L::kKStages) & 1);
      clk.lap(1);
      copy_tile(c, ahead, tid, resolve_key(a, c, ahead, tid, next));
    }
    ptx::cp_async_commit();
    next = after;
    clk.lap(3);
  }
  ptx::cp_async_wait<0>();
  clk.store(c.n);
}

}  // namespace sparse_swa::detail::ds_mla
