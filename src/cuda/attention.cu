// SPDX-License-Identifier: Apache-2.0
// CUDA sparse attention: the entry point and the general kernel. On sm_90a devices, calls whose
// segments are all fp8_ds_mla or all bf16 caches go to the tensor-core kernel
// (attention_ds_mla.cu); the rest (fp8_e4m3 caches, mixes of dtypes, every cache on other devices)
// run here (overview in
// docs/design.md#attention-kernels): one CTA per (query token, group of up to 16 heads), keys of
// both segments walked as one list (SWA entries first), 32 at a time: resolved to cache addresses
// (masked when -1, past the length or out of range), decoded to fp32 in shared memory, scored
// against every head of the group and folded into one online softmax in fp32 (SIMT).
// No host sync, no allocation: graph-capturable.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend.h"
#include "common/fp8_e4m3.h"
#include "cuda/attention_ds_mla.cuh"
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

// With `query` false only null pointers are refused (the caller knows the rest is device memory).
Status check_pointer(const void* ptr, const char* name, bool query) {
  if (query) return check_device_pointer(ptr, name);
  if (ptr == nullptr) return invalid_argument(name, ": null device pointer");
  return Status::Ok();
}

Status check_segment_pointers(const ConstIndexView& v, const ConstKvCacheView& c,
                              const char* data_name, const char* lens_name, const char* cache_name,
                              bool query) {
  if (v.width > 0) SPARSE_SWA_RETURN_IF_ERROR(check_pointer(v.data, data_name, query));
  SPARSE_SWA_RETURN_IF_ERROR(check_pointer(v.lens, lens_name, query));
  if (c.num_blocks > 0) SPARSE_SWA_RETURN_IF_ERROR(check_pointer(c.data, cache_name, query));
  return Status::Ok();
}

// Every pointer the kernel may dereference must be device memory: a host pointer would fault.
// `query` asks the driver about each one (the caller does not know where they live).
Status check_pointers(const SparseAttentionParams& p, bool query) {
  SPARSE_SWA_RETURN_IF_ERROR(check_pointer(p.q, "params.q", query));
  SPARSE_SWA_RETURN_IF_ERROR(check_pointer(p.out, "params.out", query));
  SPARSE_SWA_RETURN_IF_ERROR(check_pointer(p.lse, "params.lse", query));
  if (p.sinks != nullptr) SPARSE_SWA_RETURN_IF_ERROR(check_pointer(p.sinks, "params.sinks", query));
  if (p.bad_index_count != nullptr) {
    SPARSE_SWA_RETURN_IF_ERROR(check_pointer(p.bad_index_count, "params.bad_index_count", query));
  }
  if (p.workspace != nullptr && p.workspace_bytes > 0) {
    SPARSE_SWA_RETURN_IF_ERROR(check_pointer(p.workspace, "params.workspace", query));
  }
  SPARSE_SWA_RETURN_IF_ERROR(
      check_segment_pointers(p.swa_indices, p.swa_cache, "params.swa_indices.data",
                             "params.swa_indices.lens", "params.swa_cache.data", query));
  if (p.extra_indices.rows != 0) {
    SPARSE_SWA_RETURN_IF_ERROR(
        check_segment_pointers(p.extra_indices, p.extra_cache, "params.extra_indices.data",
                               "params.extra_indices.lens", "params.extra_cache.data", query));
  }
  return Status::Ok();
}

// The pointers' device, when the caller gave it, must be the current one: the kernel runs there.
Status check_pointers_device(int32_t device) {
  if (device < 0) return Status::Ok();
  int current = 0;
  const cudaError_t err = cudaGetDevice(&current);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return internal_error("sparse_attention: cannot read the current device: ",
                          cudaGetErrorString(err));
  }
  if (current != device) {
    return invalid_argument("params.pointers_device: expected the current device ", current,
                            ", got ", device);
  }
  return Status::Ok();
}

// Allocates `bytes` (at least 1) on the device and copies `src` (may be nullptr) into it.
Status upload(const void* src, size_t bytes, const char* what, DeviceBuffer<uint8_t>* buffer) {
  const Status allocated = buffer->allocate(bytes == 0 ? 1 : bytes);
  if (!allocated.ok()) {
    return unavailable(what, ": allocating ", bytes, " bytes failed: ", allocated.message());
  }
  if (src != nullptr && bytes > 0) {
    const cudaError_t err = cudaMemcpy(buffer->get(), src, bytes, cudaMemcpyHostToDevice);
    if (err != cudaSuccess) {
      return internal_error(what, ": copy to the device failed: ", cudaGetErrorString(err));
    }
  }
  return Status::Ok();
}

Status download(void* dst, const void* src, size_t bytes, const char* what) {
  const cudaError_t err = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
  if (err != cudaSuccess) {
    return internal_error(what, ": copy to the host failed: ", cudaGetErrorString(err));
  }
  return Status::Ok();
}

// Uploads one host index view; returns the device view.
Status upload_indices(const ConstIndexView& v, DeviceBuffer<uint8_t>* data,
                      DeviceBuffer<uint8_t>* lens, ConstIndexView* out) {
  const size_t elements =
      v.rows > 0 ? static_cast<size_t>((v.rows - 1) * v.row_stride + v.width) : 0;
  SPARSE_SWA_RETURN_IF_ERROR(upload(v.data, elements * sizeof(int32_t), "indices", data));
  SPARSE_SWA_RETURN_IF_ERROR(upload(v.lens, v.rows * sizeof(int32_t), "lens", lens));
  *out = v;
  out->data = reinterpret_cast<const int32_t*>(data->get());
  out->lens = reinterpret_cast<const int32_t*>(lens->get());
  out->space = MemorySpace::kDevice;
  return Status::Ok();
}

Status upload_cache(const ConstKvCacheView& c, DeviceBuffer<uint8_t>* data, ConstKvCacheView* out) {
  SPARSE_SWA_RETURN_IF_ERROR(upload(c.data, c.num_blocks * c.page_stride_bytes, "cache", data));
  *out = c;
  out->data = data->get();
  out->space = MemorySpace::kDevice;
  return Status::Ok();
}

}  // namespace

Status cuda_sparse_attention(const SparseAttentionParams& p, void* cuda_stream) {
  if (p.num_tokens == 0) return Status::Ok();
  SPARSE_SWA_RETURN_IF_ERROR(check_cuda_device());
  if (p.workspace_bytes < 0) {
    return invalid_argument("params.workspace_bytes: expected >= 0, got ", p.workspace_bytes);
  }
  // The kernels move q, out and the workspace in 16-byte pieces and the rest as 4-byte words: a
  // misaligned pointer would fault on the device, so it is an error here.
  const struct {
    const void* ptr;
    uintptr_t align;
    const char* name;
  } aligned[] = {{p.q, 16, "params.q"},
                 {p.out, 16, "params.out"},
                 {p.workspace, 16, "params.workspace"},
                 {p.lse, 4, "params.lse"},
                 {p.sinks, 4, "params.sinks"},
                 {p.bad_index_count, 4, "params.bad_index_count"},
                 {p.swa_indices.data, 4, "params.swa_indices.data"},
                 {p.swa_indices.lens, 4, "params.swa_indices.lens"},
                 {p.extra_indices.data, 4, "params.extra_indices.data"},
                 {p.extra_indices.lens, 4, "params.extra_indices.lens"}};
  for (const auto& x : aligned) {
    if (reinterpret_cast<uintptr_t>(x.ptr) % x.align != 0) {
      return invalid_argument(x.name, ": expected a ", x.align, "-byte aligned address, got ",
                              x.ptr);
    }
  }
  SPARSE_SWA_RETURN_IF_ERROR(check_pointers_device(p.pointers_device));
  // Capture must record kernels only: no driver queries then.
  const bool query = p.pointers_device < 0 && !stream_capturing(cuda_stream);
  SPARSE_SWA_RETURN_IF_ERROR(check_pointers(p, query));
  if (p.kernel != AttentionKernel::kAuto) SPARSE_SWA_RETURN_IF_ERROR(check_forced_ds_mla_kernel(p));
  if (ds_mla_attention_applies(p)) {
    return launch_ds_mla_attention(p, static_cast<cudaStream_t>(cuda_stream));
  }
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
  const auto stream = static_cast<cudaStream_t>(cuda_stream);
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

int64_t cuda_sparse_attention_workspace_bytes(const SparseAttentionParams& p) {
  if (!ds_mla_attention_applies(p) || p.num_tokens <= 0 || p.num_heads < 1) return 0;
  int device = 0, num_sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return plan_ds_mla_attention(p, SmCapacity::of_device(device, num_sms), -1).workspace_bytes;
}

AttentionKernel cuda_sparse_attention_kernel(const SparseAttentionParams& p) {
  if (!ds_mla_attention_applies(p)) return AttentionKernel::kAuto;
  if (p.kernel != AttentionKernel::kAuto) {
    return check_forced_ds_mla_kernel(p).ok() ? p.kernel : AttentionKernel::kAuto;
  }
  int device = 0, num_sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return AttentionKernel::kAuto;
  }
  const int64_t workspace = p.workspace == nullptr ? 0 : p.workspace_bytes;
  return plan_ds_mla_attention(p, SmCapacity::of_device(device, num_sms), workspace).prefill
             ? AttentionKernel::kPrefill
             : AttentionKernel::kDecode;
}

int64_t cuda_sparse_attention_max_workspace_bytes() {
  // The widest split the planner makes: one token of one full head group over enough key tiles
  // to give every SM a slice (more tokens or groups only leave fewer SMs per row; past one wave,
  // the last wave's tokens x groups x slices are at most the SMs too).
  SparseAttentionParams p;
  p.num_tokens = 1;
  p.num_heads = kMaxAttentionHeads;
  p.swa_indices.rows = 1;
  p.swa_indices.width = INT32_MAX / 2;
  int64_t most = 0;
  for (int32_t heads = 1; heads <= kMaxAttentionHeads; heads *= 2) {
    p.num_heads = heads;
    most = std::max(most, cuda_sparse_attention_workspace_bytes(p));
  }
  return most;
}

Status cuda_sparse_attention_from_host(const SparseAttentionParams& hp) {
  if (hp.num_tokens == 0) return Status::Ok();
  SPARSE_SWA_RETURN_IF_ERROR(check_cuda_device());
  const size_t q_elems = static_cast<size_t>(hp.num_tokens) * hp.num_heads * kHeadDim;
  const size_t lse_elems = static_cast<size_t>(hp.num_tokens) * hp.num_heads;
  SparseAttentionParams dp = hp;
  dp.pointers_device = -1;  // the copies below are on the current device; let it check them
  DeviceBuffer<uint8_t> q, out, lse, sinks, bad, swa_idx, swa_lens, swa_cache, ex_idx, ex_lens,
      ex_cache;
  SPARSE_SWA_RETURN_IF_ERROR(upload(hp.q, q_elems * sizeof(uint16_t), "q", &q));
  SPARSE_SWA_RETURN_IF_ERROR(upload(nullptr, q_elems * sizeof(uint16_t), "out", &out));
  SPARSE_SWA_RETURN_IF_ERROR(upload(nullptr, lse_elems * sizeof(float), "lse", &lse));
  dp.q = reinterpret_cast<const uint16_t*>(q.get());
  dp.out = reinterpret_cast<uint16_t*>(out.get());
  dp.lse = reinterpret_cast<float*>(lse.get());
  if (hp.sinks != nullptr) {
    SPARSE_SWA_RETURN_IF_ERROR(upload(hp.sinks, hp.num_heads * sizeof(float), "sinks", &sinks));
    dp.sinks = reinterpret_cast<const float*>(sinks.get());
  }
  if (hp.bad_index_count != nullptr) {
    SPARSE_SWA_RETURN_IF_ERROR(
        upload(hp.bad_index_count, sizeof(int32_t), "bad_index_count", &bad));
    dp.bad_index_count = reinterpret_cast<int32_t*>(bad.get());
  }
  SPARSE_SWA_RETURN_IF_ERROR(upload_indices(hp.swa_indices, &swa_idx, &swa_lens, &dp.swa_indices));
  SPARSE_SWA_RETURN_IF_ERROR(upload_cache(hp.swa_cache, &swa_cache, &dp.swa_cache));
  if (hp.extra_indices.rows != 0) {
    SPARSE_SWA_RETURN_IF_ERROR(
        upload_indices(hp.extra_indices, &ex_idx, &ex_lens, &dp.extra_indices));
    SPARSE_SWA_RETURN_IF_ERROR(upload_cache(hp.extra_cache, &ex_cache, &dp.extra_cache));
  }
  SPARSE_SWA_RETURN_IF_ERROR(cuda_sparse_attention(dp, nullptr));
  SPARSE_SWA_RETURN_IF_ERROR(download(hp.out, out.get(), q_elems * sizeof(uint16_t), "out"));
  SPARSE_SWA_RETURN_IF_ERROR(download(hp.lse, lse.get(), lse_elems * sizeof(float), "lse"));
  if (hp.bad_index_count != nullptr) {
    SPARSE_SWA_RETURN_IF_ERROR(
        download(hp.bad_index_count, bad.get(), sizeof(int32_t), "bad_index_count"));
  }
  return Status::Ok();
}

}  // namespace sparse_swa::detail
