// Sparse MLA attention on the tensor cores for fp8_ds_mla caches (the semantics are
// include/sparse_swa/attention.h's; the CPU reference is src/cpu/attention_cpu.cc).
//
// One CTA = one query token x up to 64 heads x one slice of the token's key list. The keys of
// both segments are one list (SWA entries first), walked in tiles of 32:
//   gather  cp.async copies each valid key's 576 data bytes and 8 scale bytes into a raw stage
//           (two stages: tile i + 2 is in flight while tile i is computed);
//   decode  the raw tile becomes bf16 rows in shared memory (e4m3 * 2^(s - 127) is exact in
//           bf16); masked keys (-1, past the length, out of range) become zero rows;
//   QK      S = Q K^T with m16n8k16 bf16 MMAs, fp32 accumulators: warp (m, d) takes 16 or 32 heads
//           and a 128-dim slice of the 512, and the four slices' partial S are summed through
//           shared memory by every warp that needs the rows;
//   softmax online, in base 2, per head row; masked keys score -inf;
//   PV      O += P V with V = the same bf16 rows; P is split into bf16 hi + lo parts (two MMAs)
//           so the product keeps ~16 bits of P, as the fp32 reference does.
// When tokens x head groups leave SMs idle and the caller gives a workspace, the key list is split
// over several CTAs (the plan depends on shapes only; each CTA finds its tiles from the device
// lens) and a second kernel merges the slices' (O, max, sum). No host sync, no allocation.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>

#include "cuda/attention_ds_mla.cuh"
#include "cuda/mma_ptx.cuh"
#include "sparse_swa/kv_cache.h"

namespace sparse_swa::detail {
namespace {

constexpr int kKeys = 32;             // keys per tile
constexpr int kPitch = kHeadDim + 8;  // bf16 per shared row: 1040 bytes, ldmatrix conflict-free
constexpr int kSlices = 4;            // dim slices of the QK and PV work
constexpr int kSliceDims = kHeadDim / kSlices;
constexpr int kRedPitch = kKeys + 8;            // floats per row of a partial-S slice
constexpr int kChunks = kDsMlaTokenBytes / 16;  // 36 sixteen-byte pieces per key: 28 e4m3, 8 bf16
constexpr int kNopeChunks = kNopeDim / 16;
constexpr int kRawScales = kKeys * kDsMlaTokenBytes;  // scale bytes' offset in a raw stage
constexpr int kRawStage = kRawScales + kKeys * kDsMlaScaleBytes;  // 18688 bytes
constexpr int kValidSlots = 4;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct Segment {
  const int32_t* indices;  // [T, row_stride] slot ids
  const int32_t* lens;     // [T]
  int64_t row_stride;
  int32_t width;
  uint32_t num_slots;  // clamped to 2^31: an int32 slot id >= it is out of range either way
  uint32_t block_size;
  const uint8_t* cache;  // [num_blocks, page_stride] bytes
  int64_t page_stride;
};

struct Args {
  const uint16_t* q;   // [T, H, 512] bf16
  uint16_t* out;       // [T, H, 512] bf16
  float* lse;          // [T, H] natural log
  const float* sinks;  // [H] or nullptr
  int32_t* bad_count;  // [1] or nullptr
  float* partial_o;    // [splits, T, H, 512] fp32, unnormalised; only when splits > 1
  float2* partial_ml;  // [splits, T, H] (running max in log2 units, sum of exp2)
  float scale_log2;    // softmax_scale * log2(e)
  int64_t num_tokens;
  int32_t num_heads;
  int32_t groups;
  int32_t splits;
  int32_t num_segments;
  Segment seg0, seg1;
};

// Heads per CTA = 16 * MT; warps = 4 dim slices x head-warps, each warp MW m-tiles of 16 heads.
template <int MT>
struct Config {
  static constexpr int kHeads = 16 * MT;
  static constexpr int kWarpTiles = MT == 4 ? 2 : 1;
  static constexpr int kHeadWarps = MT / kWarpTiles;
  static constexpr int kThreads = 32 * kSlices * kHeadWarps;
  static constexpr int kThreadsPerKey = kThreads / kKeys;
  static constexpr size_t kSmem = size_t{kHeads} * kPitch * 2                 // q_s
                                  + size_t{2} * kKeys * kPitch * 2            // k_s, two stages
                                  + size_t{kSlices} * kHeads * kRedPitch * 4  // partial S
                                  + size_t{2} * kRawStage                     // raw stages
                                  + kValidSlots * kKeys;                      // key valid flags
};

__device__ __forceinline__ int32_t clamp_len(const int32_t* lens, int64_t t, int32_t width) {
  return min(max(lens[t], 0), width);
}

// Starts the copies of keys [key0, key0 + 32) of token t's list into a raw stage and records
// which keys are valid. Entries < -1 or >= num_slots are counted (once: group 0 only).
template <int kThreadsPerKey>
__device__ __forceinline__ void gather_tile(const Args& a, int64_t t, int32_t len0, int64_t total,
                                            int64_t key0, uint8_t* raw, uint8_t* valid,
                                            bool count_bad) {
  const int key = threadIdx.x / kThreadsPerKey;
  const int part = threadIdx.x % kThreadsPerKey;
  const int64_t j = key0 + key;
  bool ok = false;
  const uint8_t* src = nullptr;
  const uint8_t* scales = nullptr;
  if (j < total) {
    const bool swa = j < len0;
    const Segment& s = swa ? a.seg0 : a.seg1;
    const int32_t idx = s.indices[t * s.row_stride + (swa ? j : j - len0)];
    if (idx >= 0 && static_cast<uint32_t>(idx) < s.num_slots) {
      const uint32_t block = static_cast<uint32_t>(idx) / s.block_size;
      const uint32_t offset = static_cast<uint32_t>(idx) - block * s.block_size;
      const uint8_t* page = s.cache + static_cast<int64_t>(block) * s.page_stride;
      src = page + static_cast<int64_t>(offset) * kDsMlaTokenBytes;
      scales = page + static_cast<int64_t>(s.block_size) * kDsMlaTokenBytes +
               static_cast<int64_t>(offset) * kDsMlaScaleBytes;
      ok = true;
    } else if (idx != -1 && part == 0 && count_bad && a.bad_count != nullptr) {
      atomicAdd(a.bad_count, 1);
    }
  }
  if (ok) {
    const uint32_t dst = ptx::smem_addr(raw + key * kDsMlaTokenBytes);
    for (int c = part; c < kChunks; c += kThreadsPerKey)
      ptx::cp_async_16(dst + c * 16, src + c * 16);
    if (part == 0)
      ptx::cp_async_8(ptx::smem_addr(raw + kRawScales + key * kDsMlaScaleBytes), scales);
  }
  if (part == 0) valid[key] = ok;
}

// Two e4m3 codes (low byte first) times 2^(s - 127) as a bf16 pair; exact (NaN stays NaN).
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t two, float scale, bool huge) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  float2 f = __half22float2(__half2(h));
  f.x *= scale;
  f.y *= scale;
  if (huge) {  // s = 255: 2^128 is not a float; scale by 2^127, then by 2, as the CPU does
    f.x *= 2.0f;
    f.y *= 2.0f;
  }
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// Raw stage -> bf16 rows [32, kPitch]; invalid keys become zero rows.
template <int kThreads>
__device__ __forceinline__ void decode_tile(const uint8_t* raw, const uint8_t* valid,
                                            uint16_t* k_s) {
  for (int item = threadIdx.x; item < kKeys * kChunks; item += kThreads) {
    const int key = item / kChunks;
    const int c = item - key * kChunks;
    uint16_t* row = k_s + key * kPitch;
    const uint8_t* src = raw + key * kDsMlaTokenBytes + c * 16;
    if (c < kNopeChunks) {
      uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
      if (valid[key]) {
        const uint4 v = *reinterpret_cast<const uint4*>(src);
        const uint32_t s = raw[kRawScales + key * kDsMlaScaleBytes + c / 4];
        const bool huge = s == 255;
        // 2^(s - 127) from the exponent bits (s = 0: the subnormal 2^-127).
        const float scale = __uint_as_float(s == 0 ? 0x00400000u : (huge ? 254u : s) << 23);
        lo.x = e4m3x2_to_bf16x2(v.x, scale, huge);
        lo.y = e4m3x2_to_bf16x2(v.x >> 16, scale, huge);
        lo.z = e4m3x2_to_bf16x2(v.y, scale, huge);
        lo.w = e4m3x2_to_bf16x2(v.y >> 16, scale, huge);
        hi.x = e4m3x2_to_bf16x2(v.z, scale, huge);
        hi.y = e4m3x2_to_bf16x2(v.z >> 16, scale, huge);
        hi.z = e4m3x2_to_bf16x2(v.w, scale, huge);
        hi.w = e4m3x2_to_bf16x2(v.w >> 16, scale, huge);
      }
      *reinterpret_cast<uint4*>(row + c * 16) = lo;
      *reinterpret_cast<uint4*>(row + c * 16 + 8) = hi;
    } else {
      const uint4 v = valid[key] ? *reinterpret_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(row + kNopeDim + (c - kNopeChunks) * 8) = v;
    }
  }
}

__device__ __forceinline__ uint32_t pack_bf16(float x, float y) {
  const __nv_bfloat162 b = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&b);
}
__device__ __forceinline__ float2 unpack_bf16(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

template <int MT>
__global__ void __launch_bounds__(Config<MT>::kThreads, 1)
    ds_mla_attention_kernel(const __grid_constant__ Args a) {
  using C = Config<MT>;
  constexpr int MW = C::kWarpTiles;
  constexpr int kDimTiles = kSliceDims / 8;  // n-tiles of 8 output dims per warp
  extern __shared__ __align__(128) uint8_t smem[];
  uint16_t* q_s = reinterpret_cast<uint16_t*>(smem);                // [kHeads, kPitch]
  uint16_t* k_s = q_s + C::kHeads * kPitch;                         // [2][32, kPitch]
  float* red = reinterpret_cast<float*>(k_s + 2 * kKeys * kPitch);  // [4][kHeads, kRedPitch]
  uint8_t* raw = reinterpret_cast<uint8_t*>(red + kSlices * C::kHeads * kRedPitch);  // [2][stage]
  uint8_t* valid = raw + 2 * kRawStage;                                              // [4][32]

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int split = static_cast<int>(blockIdx.x % a.splits);
  const int64_t tg = blockIdx.x / a.splits;
  const int group = static_cast<int>(tg % a.groups);
  const int64_t t = tg / a.groups;
  const int h0 = group * C::kHeads;

  // Q rows of the group; heads past H are zero rows (their outputs are never stored).
  for (int i = tid; i < C::kHeads * (kHeadDim / 8); i += C::kThreads) {
    const int h = i / (kHeadDim / 8);
    const int c = i % (kHeadDim / 8);
    uint16_t* dst = q_s + h * kPitch + c * 8;
    if (h0 + h < a.num_heads) {
      ptx::cp_async_16(ptx::smem_addr(dst), a.q + (t * a.num_heads + h0 + h) * kHeadDim + c * 8);
    } else {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
  }

  // Device lens are data: clamped to the row widths.
  const int32_t len0 = clamp_len(a.seg0.lens, t, a.seg0.width);
  const int32_t len1 = a.num_segments > 1 ? clamp_len(a.seg1.lens, t, a.seg1.width) : 0;
  const int64_t total = int64_t{len0} + len1;
  const int32_t all_tiles = static_cast<int32_t>((total + kKeys - 1) / kKeys);
  const int32_t per_split = (all_tiles + a.splits - 1) / a.splits;
  const int32_t tile0 = split * per_split;
  const int32_t n = max(0, min(all_tiles, tile0 + per_split) - tile0);
  const bool count_bad = group == 0;
  auto gather = [&](int i) {
    gather_tile<C::kThreadsPerKey>(a, t, len0, total, int64_t{tile0 + i} * kKeys,
                                   raw + (i & 1) * kRawStage, valid + (i % kValidSlots) * kKeys,
                                   count_bad);
  };

  if (n > 0) gather(0);
  ptx::cp_async_commit();
  if (n > 1) gather(1);
  ptx::cp_async_commit();
  ptx::cp_async_wait<1>();
  __syncthreads();
  if (n > 0) decode_tile<C::kThreads>(raw, valid, k_s);

  const int mh = warp % C::kHeadWarps;
  const int ds = warp / C::kHeadWarps;
  const int row0 = mh * MW * 16;  // the warp's first head row in the group
  const int d0 = ds * kSliceDims;

  float o[MW][kDimTiles][4];
  float m_run[MW][2], l_run[MW][2];
#pragma unroll
  for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
    for (int nt = 0; nt < kDimTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mi][nt][e] = 0.0f;
    }
    m_run[mi][0] = m_run[mi][1] = -INFINITY;
    l_run[mi][0] = l_run[mi][1] = 0.0f;
  }

  for (int i = 0; i < n; ++i) {
    ptx::cp_async_wait<0>();
    __syncthreads();  // tile i + 1 landed; every warp is done with tile i - 1
    if (i + 1 < n) {
      decode_tile<C::kThreads>(raw + ((i + 1) & 1) * kRawStage,
                               valid + ((i + 1) % kValidSlots) * kKeys,
                               k_s + ((i + 1) & 1) * kKeys * kPitch);
    }
    if (i + 2 < n) gather(i + 2);
    ptx::cp_async_commit();

    const uint16_t* kt = k_s + (i & 1) * kKeys * kPitch;
    const uint8_t* vt = valid + (i % kValidSlots) * kKeys;

    // Partial S over this warp's 128 dims: [MW * 16 heads, 32 keys].
    float s[MW][4][4];
#pragma unroll
    for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mi][nt][e] = 0.0f;
      }
    }
#pragma unroll
    for (int kk = 0; kk < kSliceDims / 16; ++kk) {
      const int d = d0 + kk * 16;
      uint32_t qa[MW][4];
#pragma unroll
      for (int mi = 0; mi < MW; ++mi) {
        ptx::ldmatrix_x4(qa[mi], ptx::smem_addr(q_s + (row0 + mi * 16 + (lane & 15)) * kPitch + d +
                                                (lane >> 4) * 8));
      }
      uint32_t kb[2][4];
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        ptx::ldmatrix_x4(kb[np],
                         ptx::smem_addr(kt + (np * 16 + (lane & 7) + (lane >> 4) * 8) * kPitch + d +
                                        ((lane >> 3) & 1) * 8));
      }
#pragma unroll
      for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          ptx::mma_bf16_16816(s[mi][nt], qa[mi], kb[nt >> 1][(nt & 1) * 2],
                              kb[nt >> 1][(nt & 1) * 2 + 1]);
        }
      }
    }
    {
      float* w = red + ds * C::kHeads * kRedPitch;
#pragma unroll
      for (int mi = 0; mi < MW; ++mi) {
        const int r = row0 + mi * 16 + (lane >> 2);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int c = nt * 8 + 2 * (lane & 3);
          *reinterpret_cast<float2*>(w + r * kRedPitch + c) =
              make_float2(s[mi][nt][0], s[mi][nt][1]);
          *reinterpret_cast<float2*>(w + (r + 8) * kRedPitch + c) =
              make_float2(s[mi][nt][2], s[mi][nt][3]);
        }
      }
    }
    __syncthreads();  // every slice's partial S is in shared memory

    // Full S (the four slices summed in a fixed order, so every warp of a head row agrees),
    // scaled to log2 units; masked keys -inf.
#pragma unroll
    for (int mi = 0; mi < MW; ++mi) {
      const int r = row0 + mi * 16 + (lane >> 2);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int c = nt * 8 + 2 * (lane & 3);
        float2 lo = make_float2(0.0f, 0.0f), hi = lo;
#pragma unroll
        for (int sl = 0; sl < kSlices; ++sl) {
          const float* rs = red + sl * C::kHeads * kRedPitch;
          const float2 x = *reinterpret_cast<const float2*>(rs + r * kRedPitch + c);
          const float2 y = *reinterpret_cast<const float2*>(rs + (r + 8) * kRedPitch + c);
          lo.x += x.x;
          lo.y += x.y;
          hi.x += y.x;
          hi.y += y.y;
        }
        const bool v0 = vt[c] != 0, v1 = vt[c + 1] != 0;
        s[mi][nt][0] = v0 ? lo.x * a.scale_log2 : -INFINITY;
        s[mi][nt][1] = v1 ? lo.y * a.scale_log2 : -INFINITY;
        s[mi][nt][2] = v0 ? hi.x * a.scale_log2 : -INFINITY;
        s[mi][nt][3] = v1 ? hi.y * a.scale_log2 : -INFINITY;
      }
    }

    // Online softmax per head row (a row's 32 keys live in the 4 lanes of a quad).
#pragma unroll
    for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          mx = fmaxf(mx, fmaxf(s[mi][nt][2 * half], s[mi][nt][2 * half + 1]));
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_run[mi][half], mx);
        const bool none = m_new == -INFINITY;
        const float corr = none ? 1.0f : exp2f(m_run[mi][half] - m_new);
        m_run[mi][half] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float p = none ? 0.0f : exp2f(s[mi][nt][2 * half + e] - m_new);
            s[mi][nt][2 * half + e] = p;
            sum += p;
          }
        }
        l_run[mi][half] = l_run[mi][half] * corr + sum;
#pragma unroll
        for (int nt = 0; nt < kDimTiles; ++nt) {
          o[mi][nt][2 * half] *= corr;
          o[mi][nt][2 * half + 1] *= corr;
        }
      }
    }

    // O[:, slice] += P V[tile, slice], 16 keys at a time. P enters as A fragments (the
    // accumulator layout of two n-tiles is one k16 A tile), split into bf16 hi + lo.
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      uint32_t ph[MW][4], pl[MW][4];
#pragma unroll
      for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int nt = 2 * kk + (r >> 1);
          const int half = r & 1;
          const float x = s[mi][nt][2 * half], y = s[mi][nt][2 * half + 1];
          ph[mi][r] = pack_bf16(x, y);
          const float2 h = unpack_bf16(ph[mi][r]);
          pl[mi][r] = pack_bf16(x - h.x, y - h.y);
        }
      }
#pragma unroll
      for (int np = 0; np < kDimTiles / 2; ++np) {
        uint32_t vb[4];
        ptx::ldmatrix_x4_trans(
            vb, ptx::smem_addr(kt + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kPitch + d0 +
                               np * 16 + (lane >> 4) * 8));
#pragma unroll
        for (int mi = 0; mi < MW; ++mi) {
          ptx::mma_bf16_16816(o[mi][2 * np], ph[mi], vb[0], vb[1]);
          ptx::mma_bf16_16816(o[mi][2 * np], pl[mi], vb[0], vb[1]);
          ptx::mma_bf16_16816(o[mi][2 * np + 1], ph[mi], vb[2], vb[3]);
          ptx::mma_bf16_16816(o[mi][2 * np + 1], pl[mi], vb[2], vb[3]);
        }
      }
    }
  }

  // Epilogue: the finished rows, or this slice's unnormalised (O, max, sum) for the merge.
#pragma unroll
  for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float l = l_run[mi][half];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int head = h0 + row0 + mi * 16 + (lane >> 2) + half * 8;
      if (head >= a.num_heads) continue;
      const float m = m_run[mi][half];
      const int64_t row = t * a.num_heads + head;
      if (a.splits == 1) {
        float lse = INFINITY, factor = 0.0f;  // no valid key: out 0, lse +inf
        if (m != -INFINITY) {
          lse = (m + log2f(l)) * kLn2;
          factor = 1.0f / l;
          if (a.sinks != nullptr) factor /= 1.0f + expf(a.sinks[head] - lse);
        }
        uint16_t* y = a.out + row * kHeadDim + d0 + 2 * (lane & 3);
#pragma unroll
        for (int nt = 0; nt < kDimTiles; ++nt) {
          *reinterpret_cast<uint32_t*>(y + nt * 8) =
              pack_bf16(o[mi][nt][2 * half] * factor, o[mi][nt][2 * half + 1] * factor);
        }
        if (ds == 0 && (lane & 3) == 0) a.lse[row] = lse;
      } else {
        const int64_t prow = split * a.num_tokens * a.num_heads + row;
        float* y = a.partial_o + prow * kHeadDim + d0 + 2 * (lane & 3);
#pragma unroll
        for (int nt = 0; nt < kDimTiles; ++nt) {
          *reinterpret_cast<float2*>(y + nt * 8) =
              make_float2(o[mi][nt][2 * half], o[mi][nt][2 * half + 1]);
        }
        if (ds == 0 && (lane & 3) == 0) a.partial_ml[prow] = make_float2(m, l);
      }
    }
  }
}

// Merges the splits of one (token, head) per warp: weights 2^(m_s - M), then the same finish as
// the unsplit kernel.
constexpr int kMergeWarps = 8;
__global__ void __launch_bounds__(32 * kMergeWarps)
    ds_mla_merge_kernel(const __grid_constant__ Args a) {
  const int64_t rows = a.num_tokens * a.num_heads;
  const int64_t row = int64_t{blockIdx.x} * kMergeWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  float m = -INFINITY;
  for (int s = 0; s < a.splits; ++s) m = fmaxf(m, a.partial_ml[s * rows + row].x);
  float4 acc[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) acc[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float l = 0.0f;
  if (m != -INFINITY) {
    for (int s = 0; s < a.splits; ++s) {
      const float2 ml = a.partial_ml[s * rows + row];
      const float w = exp2f(ml.x - m);  // an empty split has max -inf: weight 0
      if (w == 0.0f) continue;
      l += w * ml.y;
      const float4* po = reinterpret_cast<const float4*>(a.partial_o + (s * rows + row) * kHeadDim);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float4 v = po[lane + 32 * k];
        acc[k].x += w * v.x;
        acc[k].y += w * v.y;
        acc[k].z += w * v.z;
        acc[k].w += w * v.w;
      }
    }
  }
  float lse = INFINITY, factor = 0.0f;
  if (m != -INFINITY) {
    lse = (m + log2f(l)) * kLn2;
    factor = 1.0f / l;
    const int head = static_cast<int>(row % a.num_heads);
    if (a.sinks != nullptr) factor /= 1.0f + expf(a.sinks[head] - lse);
  }
  uint16_t* y = a.out + row * kHeadDim;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint2 v = make_uint2(pack_bf16(acc[k].x * factor, acc[k].y * factor),
                               pack_bf16(acc[k].z * factor, acc[k].w * factor));
    *reinterpret_cast<uint2*>(y + (lane + 32 * k) * 4) = v;
  }
  if (lane == 0) a.lse[row] = lse;
}

Segment segment(const ConstIndexView& v, const ConstKvCacheView& c) {
  const int64_t slots = c.num_slots();
  return {v.data,
          v.lens,
          v.row_stride,
          v.width,
          static_cast<uint32_t>(std::min<int64_t>(slots, int64_t{1} << 31)),
          static_cast<uint32_t>(c.block_size),
          static_cast<const uint8_t*>(c.data),
          c.page_stride_bytes};
}

constexpr int64_t kPartialRowBytes = kHeadDim * sizeof(float) + sizeof(float2);

int group_heads_for(int num_heads) { return num_heads <= 16 ? 16 : (num_heads <= 32 ? 32 : 64); }

template <int MT>
Status launch_kernel(const Args& a, cudaStream_t stream) {
  static std::once_flag once;
  static cudaError_t attr_err = cudaSuccess;
  std::call_once(once, [] {
    attr_err = cudaFuncSetAttribute(ds_mla_attention_kernel<MT>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(Config<MT>::kSmem));
  });
  if (attr_err != cudaSuccess) {
    return internal_error("sparse_attention: cannot reserve ", Config<MT>::kSmem,
                          " bytes of shared memory per CTA: ", cudaGetErrorString(attr_err));
  }
  const int64_t blocks = a.num_tokens * a.groups * a.splits;
  ds_mla_attention_kernel<MT>
      <<<static_cast<unsigned>(blocks), Config<MT>::kThreads, Config<MT>::kSmem, stream>>>(a);
  return Status::Ok();
}

}  // namespace

bool ds_mla_attention_applies(const SparseAttentionParams& p) {
  if (p.swa_cache.dtype != CacheDtype::kFp8DsMla) return false;
  return p.extra_indices.rows == 0 || p.extra_cache.dtype == CacheDtype::kFp8DsMla;
}

DsMlaPlan plan_ds_mla_attention(const SparseAttentionParams& p, int num_sms,
                                int64_t workspace_bytes) {
  DsMlaPlan plan;
  plan.group_heads = group_heads_for(p.num_heads);
  plan.groups = (p.num_heads + plan.group_heads - 1) / plan.group_heads;
  const int64_t ctas = p.num_tokens * plan.groups;
  const int64_t max_keys =
      int64_t{p.swa_indices.width} + (p.extra_indices.rows != 0 ? p.extra_indices.width : 0);
  const int64_t max_tiles = (max_keys + kKeys - 1) / kKeys;
  if (ctas == 0 || ctas >= num_sms) return plan;
  // Fill the SMs once, with at least two tiles per slice (a slice's fixed cost is a gather
  // latency and a merge row).
  int64_t splits = std::min<int64_t>(num_sms / ctas, std::max<int64_t>(1, max_tiles / 2));
  const int64_t row_bytes = p.num_tokens * p.num_heads * kPartialRowBytes;
  if (workspace_bytes >= 0) splits = std::min(splits, workspace_bytes / row_bytes);
  if (splits <= 1) return plan;
  plan.splits = static_cast<int32_t>(splits);
  plan.workspace_bytes = splits * row_bytes;
  return plan;
}

Status launch_ds_mla_attention(const SparseAttentionParams& p, cudaStream_t stream) {
  int device = 0, num_sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return internal_error("sparse_attention: cannot read the device's SM count: ",
                          cudaGetErrorString(err));
  }
  const DsMlaPlan plan =
      plan_ds_mla_attention(p, num_sms, p.workspace == nullptr ? 0 : p.workspace_bytes);
  Args a{};
  a.q = p.q;
  a.out = p.out;
  a.lse = p.lse;
  a.sinks = p.sinks;
  a.bad_count = p.bad_index_count;
  a.scale_log2 = p.softmax_scale * kLog2e;
  a.num_tokens = p.num_tokens;
  a.num_heads = p.num_heads;
  a.groups = plan.groups;
  a.splits = plan.splits;
  a.num_segments = p.extra_indices.rows != 0 ? 2 : 1;
  a.seg0 = segment(p.swa_indices, p.swa_cache);
  a.seg1 = a.num_segments > 1 ? segment(p.extra_indices, p.extra_cache) : a.seg0;
  if (plan.splits > 1) {
    // [splits, T, H, 512] fp32, then [splits, T, H] (max, sum); both 16-byte aligned.
    a.partial_o = static_cast<float*>(p.workspace);
    a.partial_ml = reinterpret_cast<float2*>(a.partial_o + int64_t{plan.splits} * p.num_tokens *
                                                               p.num_heads * kHeadDim);
  }
  const int64_t blocks = p.num_tokens * plan.groups * plan.splits;
  if (blocks > 0x7fffffff) {
    return invalid_argument("params.num_tokens: expected at most ",
                            0x7fffffff / (int64_t{plan.groups} * plan.splits), " tokens at ",
                            p.num_heads, " heads, got ", p.num_tokens);
  }
  SPARSE_SWA_RETURN_IF_ERROR(plan.group_heads == 16   ? launch_kernel<1>(a, stream)
                             : plan.group_heads == 32 ? launch_kernel<2>(a, stream)
                                                      : launch_kernel<4>(a, stream));
  if (plan.splits > 1) {
    const int64_t rows = p.num_tokens * p.num_heads;
    ds_mla_merge_kernel<<<static_cast<unsigned>((rows + kMergeWarps - 1) / kMergeWarps),
                          32 * kMergeWarps, 0, stream>>>(a);
  }
  err = cudaGetLastError();
  if (err != cudaSuccess) {
    return internal_error("sparse_attention: kernel launch failed: ", cudaGetErrorString(err));
  }
  return Status::Ok();
}

}  // namespace sparse_swa::detail
