// SPDX-License-Identifier: Apache-2.0
// fp8_ds_mla keys to bf16 on the device, exactly (e4m3 x 2^(s - 127) is a bf16 value), as the
// CPU reference decodes them: the tile32 and pair kernels' producers and the decoded-keys pass.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/attention/sm90_common.cuh"
#include "sparse_swa/kv_cache.h"

namespace sparse_swa::detail::sm90 {

constexpr int kNopeChunks = kNopeDim / 16;  // 28 sixteen-byte pieces of e4m3 codes per key

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

// True when one of the key's seven scale bytes is 255 (byte 7 is padding): a 255 byte is a zero
// byte of the complement.
__device__ __forceinline__ bool has_huge_scale(uint2 sc) {
  const uint32_t x = ~sc.x, y = ~(sc.y & 0x00ffffffu);
  return ((((x - 0x01010101u) & ~x) | ((y - 0x01010101u) & ~y)) & 0x80808080u) != 0;
}

}  // namespace sparse_swa::detail::sm90
