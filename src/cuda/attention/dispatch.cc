// SPDX-License-Identifier: Apache-2.0
// The CUDA attention's dispatcher: the checks only the device side can make (alignment, where the
// pointers live, a forced kernel that can run), then the route -- the sm_90a kernels
// (sm90_launch.cc) when every segment is an fp8_ds_mla cache, or every segment a bf16 cache, and
// the device runs their sm_90a code; the general SIMT kernel (simt_kernel.cu) for the rest
// (docs/design.md#attention-kernels). Also the workspace and kernel queries and the host-staged
// entry point.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "attention/sm90_plan.h"
#include "backend.h"
#include "cuda/attention/simt_kernel.h"
#include "cuda/attention/sm90_kernels.h"
#include "cuda/attention/sm90_launch.h"
#include "cuda/cuda_utils.h"

namespace sparse_swa::detail {
namespace {

// A forced sm_90a family needs the sm_90a code and caches those kernels read.
Status check_forced_kernel(const SparseAttentionParams& p) {
  if (!sm90::sm90_kernels_loaded()) {
    return invalid_argument(
        "params.kernel: the tensor-core kernels need an sm_90 device; this one runs the general "
        "kernel (leave params.kernel at kAuto)");
  }
  if (!sm90_reads_caches(p)) {
    return invalid_argument(
        "params.kernel: the tensor-core kernels read fp8_ds_mla or bf16 caches, both segments "
        "alike, got ",
        cache_dtype_name(p.swa_cache.dtype), " and ",
        p.extra_indices.rows == 0 ? "no extra segment" : cache_dtype_name(p.extra_cache.dtype));
  }
  return Status::Ok();
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

Status cuda_sparse_attention(const SparseAttentionParams& p, const AttentionOverrides& overrides,
                             void* cuda_stream) {
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
  if (p.kernel != AttentionKernel::kAuto) SPARSE_SWA_RETURN_IF_ERROR(check_forced_kernel(p));
  const auto stream = static_cast<cudaStream_t>(cuda_stream);
  if (sm90_applies(p)) return launch_sm90_attention(p, overrides, stream);
  return launch_simt_attention(p, stream);
}

int64_t cuda_sparse_attention_workspace_bytes(const SparseAttentionParams& p) {
  SmCapacity sms;
  if (!sm90_applies(p) || p.num_tokens <= 0 || p.num_heads < 1 ||
      current_sm_capacity(&sms) != cudaSuccess) {
    return 0;
  }
  return plan_sm90_attention(p, sms, -1).workspace_bytes;
}

AttentionKernel cuda_sparse_attention_kernel(const SparseAttentionParams& p) {
  if (!sm90_applies(p)) return AttentionKernel::kAuto;
  if (p.kernel != AttentionKernel::kAuto) {
    return check_forced_kernel(p).ok() ? p.kernel : AttentionKernel::kAuto;
  }
  SmCapacity sms;
  if (current_sm_capacity(&sms) != cudaSuccess) return AttentionKernel::kAuto;
  const int64_t workspace = p.workspace == nullptr ? 0 : p.workspace_bytes;
  return plan_sm90_attention(p, sms, workspace).family == Sm90Family::kTile32
             ? AttentionKernel::kSm90Tile32
             : AttentionKernel::kSm90Pairs;
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
  SPARSE_SWA_RETURN_IF_ERROR(cuda_sparse_attention(dp, AttentionOverrides{}, nullptr));
  SPARSE_SWA_RETURN_IF_ERROR(download(hp.out, out.get(), q_elems * sizeof(uint16_t), "out"));
  SPARSE_SWA_RETURN_IF_ERROR(download(hp.lse, lse.get(), lse_elems * sizeof(float), "lse"));
  if (hp.bad_index_count != nullptr) {
    SPARSE_SWA_RETURN_IF_ERROR(
        download(hp.bad_index_count, bad.get(), sizeof(int32_t), "bad_index_count"));
  }
  return Status::Ok();
}

}  // namespace sparse_swa::detail
