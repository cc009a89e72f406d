// SPDX-License-Identifier: Apache-2.0
// The general SIMT attention kernel: fp8_e4m3 caches, mixes of cache dtypes, and every cache on
// devices other than sm_90a (docs/design.md#attention-kernels). One CTA per (query token, group
// of up to 16 heads), keys of both segments walked as one list (SWA entries first), 32 at a time:
// resolved to cache addresses (masked when -1, past the length or out of range), decoded to fp32
// in shared memory, scored against every head of the group and folded into one online softmax in
// fp32. No host sync, no allocation: graph-capturable.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/fp8_e4m3.h"
#include "cuda/attention/simt_kernel.h"
#include "cuda/cuda_utils.h"

namespace sparse_swa::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kKeyTile = 32;  // keys per tile; the softmax step gives one key to each lane
constexpr int kDimsPerThread = kHeadDim / kThreads;  // output dims owned by each thread
constexpr int kValuesPerLane = kHeadDim / 32;        // dims of one dot product per lane
constexpr int kMaxGroupHeads = 16;

struct SegmentArgs {
  const int32_t* indices;  // [T, row_stride] slot ids
  const int32_t* lens;     // [T]
  int64_t row_stride;
  int32_t width;
  const uint8_t* cache;  // [num_blocks, page_stride] bytes
  int64_t num_slots;
  int32_t block_size;
  int64_t page_stride;
  CacheDtype dtype;
};

struct AttentionArgs {
  const uint16_t* q;   // [T, H, 512] bf16
  uint16_t* out;       // [T, H, 512] bf16
  float* lse;          // [T, H]
  const float* sinks;  // [H] or nullptr
  int32_t* bad_count;  // [1] or nullptr
  float scale;
  int32_t num_heads;
  int32_t num_groups;    // ceil(H / group heads)
  int32_t num_segments;  // 1 or 2
  SegmentArgs seg[2];
};

// Shared memory of one CTA with G heads (floats, in this order).
constexpr int64_t smem_floats(int group_heads) {
  return int64_t{group_heads} * kHeadDim    // q_s  [G, 512]
         + int64_t{kKeyTile} * kHeadDim     // k_s  [32, 512], 0 for masked keys
         + int64_t{group_heads} * kKeyTile  // p_s  [G, 32] scores, then probabilities
         + 3 * int64_t{group_heads};        // m_s, l_s, c_s [G]: max, sum, rescale factor
}

// Resolves entry `col` of segment `seg` for token t: the key's data and scale addresses, or
// nullptr when the entry is -1 or addresses no slot (< -1 or past the cache; counted once).
__device__ __forceinline__ const uint8_t* resolve_key(const SegmentArgs& seg, int64_t t,
                                                      int32_t col, bool count_bad,
                                                      int32_t* bad_count, const uint8_t** scales) {
  const int32_t idx = seg.indices[t * seg.row_stride + col];
  if (idx == -1) return nullptr;
  if (idx < 0 || idx >= seg.num_slots) {
    if (count_bad && bad_count != nullptr) atomicAdd(bad_count, 1);
    return nullptr;
  }
  const KvSlotOffsets at = kv_slot_offsets(idx, seg.block_size, seg.page_stride, seg.dtype);
  *scales = seg.cache + (at.scales < 0 ? 0 : at.scales);
  return seg.cache + at.data;
}

// Value v (0..511) of a key.
__device__ __forceinline__ float key_value(const uint8_t* data, const uint8_t* scales,
                                           CacheDtype dtype, int v) {
  if (dtype == CacheDtype::kFp8DsMla) {
    if (v < kNopeDim) return fp8::dequantize(data[v], scales[v / kQuantTile]);
    return fp8::bf16_to_float(reinterpret_cast<const uint16_t*>(data + kNopeDim)[v - kNopeDim]);
  }
  if (dtype == CacheDtype::kBf16)
    return fp8::bf16_to_float(reinterpret_cast<const uint16_t*>(data)[v]);
  return fp8::e4m3_to_float(data[v]);
}

template <int G>
__global__ void __launch_bounds__(kThreads) sparse_attention_kernel(const AttentionArgs a) {
  extern __shared__ __align__(16) float smem[];
  float* q_s = smem;
  float* k_s = q_s + G * kHeadDim;
  float* p_s = k_s + kKeyTile * kHeadDim;
  float* m_s = p_s + G * kKeyTile;
  float* l_s = m_s + G;
  float* c_s = l_s + G;
  __shared__ const uint8_t* key_data[kKeyTile];  // nullptr = masked
  __shared__ const uint8_t* key_scales[kKeyTile];
  __shared__ CacheDtype key_dtype[kKeyTile];

  const int64_t t = blockIdx.x / a.num_groups;
  const int group = static_cast<int>(blockIdx.x % a.num_groups);
  const int h0 = group * G;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;

  for (int i = tid; i < G * kHeadDim; i += kThreads) {
    const int h = h0 + i / kHeadDim;
    q_s[i] = h < a.num_heads
                 ? fp8::bf16_to_float(a.q[(t * a.num_heads + h) * kHeadDim + i % kHeadDim])
                 : 0.0f;
  }
  if (tid < G) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
  }

  // Valid lengths, clamped to the row width (device lens are data, never trusted).
  int32_t len[2] = {0, 0};
  for (int s = 0; s < a.num_segments; ++s) {
    const SegmentArgs& seg = s == 0 ? a.seg[0] : a.seg[1];
    len[s] = min(max(seg.lens[t], 0), seg.width);
  }
  const int64_t total = int64_t{len[0]} + len[1];

  float acc[G][kDimsPerThread];
#pragma unroll
  for (int h = 0; h < G; ++h) {
#pragma unroll
    for (int i = 0; i < kDimsPerThread; ++i) acc[h][i] = 0.0f;
  }

  for (int64_t tile = 0; tile < total; tile += kKeyTile) {
    __syncthreads();  // the previous tile is done with k_s / p_s (and q_s, m_s, l_s are set)
    if (tid < kKeyTile) {
      const int64_t j = tile + tid;
      const uint8_t* data = nullptr;
      const uint8_t* scales = nullptr;
      CacheDtype dtype = a.seg[0].dtype;
      if (j < len[0]) {
        data = resolve_key(a.seg[0], t, static_cast<int32_t>(j), group == 0, a.bad_count, &scales);
      } else if (j < total) {
        data = resolve_key(a.seg[1], t, static_cast<int32_t>(j - len[0]), group == 0, a.bad_count,
                           &scales);
        dtype = a.seg[1].dtype;
      }
      key_data[tid] = data;
      key_scales[tid] = scales;
      key_dtype[tid] = dtype;
    }
    __syncthreads();

    // Decode: warp w takes keys w, w + 8, ...; masked keys become zero rows.
    for (int k = warp; k < kKeyTile; k += kWarps) {
      float* dst = k_s + k * kHeadDim;
      const uint8_t* data = key_data[k];
      if (data == nullptr) {
        for (int v = lane; v < kHeadDim; v += 32) dst[v] = 0.0f;
        continue;
      }
      const uint8_t* scales = key_scales[k];
      const CacheDtype dtype = key_dtype[k];
      for (int v = lane; v < kHeadDim; v += 32) dst[v] = key_value(data, scales, dtype, v);
    }
    __syncthreads();

    // Scores: the same warp/key split, lanes stride the 512 dims, one reduction per head.
    for (int k = warp; k < kKeyTile; k += kWarps) {
      if (key_data[k] == nullptr) {
        if (lane < G) p_s[lane * kKeyTile + k] = -INFINITY;
        continue;
      }
      float kr[kValuesPerLane];
#pragma unroll
      for (int i = 0; i < kValuesPerLane; ++i) kr[i] = k_s[k * kHeadDim + lane + 32 * i];
#pragma unroll
      for (int h = 0; h < G; ++h) {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < kValuesPerLane; ++i) dot += q_s[h * kHeadDim + lane + 32 * i] * kr[i];
        dot = warp_sum(dot);
        if (lane == 0) p_s[h * kKeyTile + k] = dot * a.scale;
      }
    }
    __syncthreads();

    // Online softmax, one warp per head, one key per lane.
    for (int h = warp; h < G; h += kWarps) {
      const float s = p_s[h * kKeyTile + lane];
      const float m_old = m_s[h];
      const float m_new = fmaxf(m_old, warp_max(s));
      float corr = 1.0f, p = 0.0f;
      if (m_new != -INFINITY) {
        corr = expf(m_old - m_new);  // 0 when m_old is -inf
        p = s == -INFINITY ? 0.0f : expf(s - m_new);
      }
      const float psum = warp_sum(p);
      p_s[h * kKeyTile + lane] = p;
      __syncwarp();  // every lane has read m_s[h] / l_s[h] before lane 0 updates them
      if (lane == 0) {
        l_s[h] = l_s[h] * corr + psum;
        m_s[h] = m_new;
        c_s[h] = corr;
      }
    }
    __syncthreads();

    // out += P V: thread tid owns dims tid and tid + 256 of every head of the group.
#pragma unroll
    for (int h = 0; h < G; ++h) {
#pragma unroll
      for (int i = 0; i < kDimsPerThread; ++i) acc[h][i] *= c_s[h];
    }
    const int num_keys = static_cast<int>(min(int64_t{kKeyTile}, total - tile));
    for (int k = 0; k < num_keys; ++k) {
      float kv[kDimsPerThread];
#pragma unroll
      for (int i = 0; i < kDimsPerThread; ++i) kv[i] = k_s[k * kHeadDim + tid + kThreads * i];
#pragma unroll
      for (int h = 0; h < G; ++h) {
        const float p = p_s[h * kKeyTile + k];
#pragma unroll
        for (int i = 0; i < kDimsPerThread; ++i) acc[h][i] += p * kv[i];
      }
    }
  }
  __syncthreads();

#pragma unroll
  for (int h = 0; h < G; ++h) {
    const int head = h0 + h;
    if (head >= a.num_heads) break;
    const float m = m_s[h];
    const float l = l_s[h];
    float lse = INFINITY, factor = 0.0f;  // no valid key: out 0, lse +inf
    if (m != -INFINITY) {
      lse = m + logf(l);
      factor = 1.0f / l;
      if (a.sinks != nullptr) factor /= 1.0f + expf(a.sinks[head] - lse);
    }
    uint16_t* o = a.out + (t * a.num_heads + head) * kHeadDim;
#pragma unroll
    for (int i = 0; i < kDimsPerThread; ++i) {
      o[tid + kThreads * i] = fp8::float_to_bf16(acc[h][i] * factor);
    }
    if (tid == 0) a.lse[t * a.num_heads + head] = lse;
  }
}

SegmentArgs segment_args(const ConstIndexView& v, const ConstKvCacheView& c) {
  return {v.data,
          v.lens,
          v.row_stride,
          v.width,
          static_cast<const uint8_t*>(c.data),
          c.num_slots(),
          c.block_size,
          c.page_stride_bytes,
          c.dtype};
}

template <int G>
Status launch(const AttentionArgs& args, int64_t num_tokens, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(smem_floats(G)) * sizeof(float);
  const cudaError_t err =
      cudaFuncSetAttribute(sparse_attention_kernel<G>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem));
  if (err != cudaSuccess) {
    cudaGetLastError();
    return internal_error("sparse_attention: cannot reserve ", smem,
                          " bytes of shared memory: ", cudaGetErrorString(err));
  }
  const int64_t blocks = num_tokens * args.num_groups;
  sparse_attention_kernel<G><<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(args);
  return check_launch("sparse_attention");
}

}  // namespace

Status launch_simt_attention(const SparseAttentionParams& p, cudaStream_t stream) {
  const bool has_extra = p.extra_indices.rows != 0;

  // Heads per CTA: the smallest power of two covering H, at most 16.
  int group_heads = 1;
  while (group_heads < p.num_heads && group_heads < kMaxGroupHeads) group_heads *= 2;
  AttentionArgs args{};
  args.q = p.q;
  args.out = p.out;
  args.lse = p.lse;
  args.sinks = p.sinks;
  args.bad_count = p.bad_index_count;
  args.scale = p.softmax_scale;
  args.num_heads = p.num_heads;
  args.num_groups = (p.num_heads + group_heads - 1) / group_heads;
  args.num_segments = has_extra ? 2 : 1;
  args.seg[0] = segment_args(p.swa_indices, p.swa_cache);
  args.seg[1] = has_extra ? segment_args(p.extra_indices, p.extra_cache) : args.seg[0];
  if (p.num_tokens > int64_t{0x7fffffff} / args.num_groups) {
    return invalid_argument("params.num_tokens: expected at most ",
                            int64_t{0x7fffffff} / args.num_groups, " tokens at ", p.num_heads,
                            " heads (one CTA per token and head group), got ", p.num_tokens);
  }
  switch (group_heads) {
    case 1:
      return launch<1>(args, p.num_tokens, stream);
    case 2:
      return launch<2>(args, p.num_tokens, stream);
    case 4:
      return launch<4>(args, p.num_tokens, stream);
    case 8:
      return launch<8>(args, p.num_tokens, stream);
    default:
      return launch<16>(args, p.num_tokens, stream);
  }
}

}  // namespace sparse_swa::detail
