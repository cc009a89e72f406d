// SPDX-License-Identifier: Apache-2.0
// Scalar conversions of the KV cache formats, shared by the CPU codec and the CUDA kernels so
// that both produce the same bits: OCP fp8 e4m3 (saturating, round-to-nearest-even), bf16
// (round-to-nearest-even) and the UE8M0 power-of-two scale bytes of fp8_ds_mla.
// Everything here is integer bit manipulation or exactly rounded IEEE float operations, never a
// library log2/exp whose last bit may differ between host and device.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SPARSE_SWA_FP8_HD __host__ __device__ __forceinline__
#else
#define SPARSE_SWA_FP8_HD inline
#endif

namespace sparse_swa::fp8 {

inline constexpr float kE4m3Max = 448.0f;   // largest finite OCP e4m3 value
inline constexpr float kAmaxFloor = 1e-4f;  // tile amax floor: an all-zero tile gets e = -22

SPARSE_SWA_FP8_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

SPARSE_SWA_FP8_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

// 2^k for k in [-126, 127], exact.
SPARSE_SWA_FP8_HD float pow2_normal(int k) {
  return bits_float(static_cast<uint32_t>(k + 127) << 23);
}

// x * 2^k for any k in [-254, 254], exactly as one IEEE multiply would round it (two exact steps
// when 2^k itself is not a normal float).
SPARSE_SWA_FP8_HD float scale_pow2(float x, int k) {
  if (k > 127) return (x * pow2_normal(127)) * pow2_normal(k - 127);
  if (k < -126) return (x * pow2_normal(-126)) * pow2_normal(k + 126);
  return x * pow2_normal(k);
}

// ---- bf16 ----

SPARSE_SWA_FP8_HD uint16_t float_to_bf16(float x) {
  uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}

SPARSE_SWA_FP8_HD float bf16_to_float(uint16_t b) {
  return bits_float(static_cast<uint32_t>(b) << 16);
}

// ---- fp8 e4m3 (OCP "fn": no infinities, S.1111.111 is NaN, max 448) ----

// Round to nearest even, saturating to +-448 (inf included); NaN -> 0x7f with the sign kept.
SPARSE_SWA_FP8_HD uint8_t float_to_e4m3(float x) {
  const uint32_t u = float_bits(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7f;   // NaN
  if (a >= 0x43e00000u) return sign | 0x7e;  // |x| >= 448 (inf included): saturate
  if (a < 0x3c800000u) {
    // Below 2^-6, the smallest normal: subnormal steps of 2^-9 (a result of 8 is 2^-6, which
    // encodes correctly as exponent 1, mantissa 0). x * 512 is exact; rint rounds ties to even.
    const float steps = bits_float(a) * 512.0f;
    return sign | static_cast<uint8_t>(rintf(steps));
  }
  // Normal: keep 3 of the 23 mantissa bits, ties to even; a carry bumps the exponent.
  const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
  const uint32_t exponent = (r >> 23) - 120u;  // fp32 bias 127 -> e4m3 bias 7
  const uint32_t mantissa = (r >> 20) & 7u;
  return sign | static_cast<uint8_t>((exponent << 3) | mantissa);
}

// Built from bits (sign included) so that NaN codes give the same float on host and device.
SPARSE_SWA_FP8_HD float e4m3_to_float(uint8_t b) {
  const uint32_t exponent = (b >> 3) & 15u;
  const uint32_t mantissa = b & 7u;
  uint32_t bits;
  if (exponent == 15u && mantissa == 7u) {
    bits = 0x7fc00000u;
  } else if (exponent == 0u) {
    bits = float_bits(static_cast<float>(mantissa) * (1.0f / 512.0f));  // exact
  } else {
    bits = ((exponent + 120u) << 23) | (mantissa << 20);
  }
  return bits_float(bits | (static_cast<uint32_t>(b & 0x80u) << 24));
}

// ---- UE8M0 scales of fp8_ds_mla ----

// The tile amax: max(|x|, 1e-4) over the tile. NaN inputs never win a comparison, so the result
// does not depend on the order the values are visited in.
SPARSE_SWA_FP8_HD float amax_step(float amax, float x) {
  const float a = x < 0.0f ? -x : x;
  return a > amax ? a : amax;
}

// e = ceil(log2(amax / 448)) computed exactly from the bits of the (IEEE-rounded) quotient,
// clamped to [-127, 128] so that the stored byte e + 127 fits 0..255. amax >= 1e-4 keeps the
// quotient a normal float; an infinite amax gives 128.
SPARSE_SWA_FP8_HD int scale_exponent(float amax) {
  const uint32_t u = float_bits(amax / kE4m3Max);
  const int biased = static_cast<int>((u >> 23) & 0xffu);
  if (biased == 0xff) return 128;
  const int e = (u & 0x7fffffu) == 0 ? biased - 127 : biased - 126;
  return e < -127 ? -127 : (e > 128 ? 128 : e);
}

SPARSE_SWA_FP8_HD uint8_t scale_byte(int exponent) { return static_cast<uint8_t>(exponent + 127); }

SPARSE_SWA_FP8_HD bool is_nan(float x) { return (float_bits(x) & 0x7fffffffu) > 0x7f800000u; }

// q = saturate_e4m3(x / 2^e). NaN never goes through arithmetic: a GPU multiply returns the
// canonical NaN, the CPU keeps the payload and sign, and the codes must not differ.
// A finite x keeps a finite decode: near FLT_MAX, rounding up (or saturating to 448) can push
// e4m3(q) * 2^e past the float range, so such a code steps down to the next smaller magnitude.
SPARSE_SWA_FP8_HD uint8_t quantize(float x, int exponent) {
  if (is_nan(x)) return float_to_e4m3(x);
  uint8_t q = float_to_e4m3(scale_pow2(x, -exponent));
  const bool finite = (float_bits(x) & 0x7fffffffu) < 0x7f800000u;
  while (finite && (q & 0x7f) != 0 &&
         (float_bits(scale_pow2(e4m3_to_float(q), exponent)) & 0x7fffffffu) == 0x7f800000u) {
    --q;  // same sign, next smaller magnitude
  }
  return q;
}

// x = e4m3(q) * 2^(s - 127). Exact for every finite product (an e4m3 value has 4 significant
// bits and 2^-136 is above the smallest float subnormal); s = 255 overflows to inf.
// A NaN code decodes to e4m3_to_float's NaN on both sides (no arithmetic on it).
SPARSE_SWA_FP8_HD float dequantize(uint8_t q, uint8_t scale) {
  const float v = e4m3_to_float(q);
  if (is_nan(v)) return v;
  return scale_pow2(v, static_cast<int>(scale) - 127);
}

}  // namespace sparse_swa::fp8
