// SPDX-License-Identifier: Apache-2.0
// sparse_attention's front end: shape, pointer and memory-space checks, then the backend (the
// CPU reference in src/cpu/attention_reference.cc, the CUDA dispatcher in
// src/cuda/attention/dispatch.cc).
#include "sparse_swa/attention.h"

#include <cmath>
#include <limits>

#include "attention/overrides.h"
#include "backend.h"

namespace sparse_swa {

namespace {

const char* space_name(MemorySpace s) { return s == MemorySpace::kHost ? "host" : "device"; }

Status check_segment(const ConstIndexView& indices, const ConstKvCacheView& cache,
                     std::string_view indices_name, std::string_view cache_name, int64_t num_tokens,
                     MemorySpace space) {
  if (indices.space != space) {
    return invalid_argument(indices_name, ".space: expected ", space_name(space), ", got ",
                            space_name(indices.space));
  }
  if (cache.space != space) {
    return invalid_argument(cache_name, ".space: expected ", space_name(space), ", got ",
                            space_name(cache.space));
  }
  if (indices.rows != num_tokens) {
    return invalid_argument(indices_name, ".rows: expected num_tokens ", num_tokens, ", got ",
                            indices.rows);
  }
  SPARSE_SWA_RETURN_IF_ERROR(check_index_view(indices, indices_name));
  return check_kv_cache_view(cache, cache_name);
}

// Sizes, views, head count, scale and memory spaces (`space` is where every view must live);
// host views also get their lens checked. `need_outputs` = false skips the out / lse pointers
// (the double reference writes elsewhere).
Status check_attention_shapes(const SparseAttentionParams& p, MemorySpace space,
                              bool need_outputs = true) {
  if (p.num_tokens < 0) {
    return invalid_argument("params.num_tokens: expected >= 0, got ", p.num_tokens);
  }
  if (p.num_heads < 1 || p.num_heads > kMaxAttentionHeads) {
    return invalid_argument("params.num_heads: expected 1..", kMaxAttentionHeads, ", got ",
                            p.num_heads);
  }
  if (!std::isfinite(p.softmax_scale)) {
    return invalid_argument("params.softmax_scale: expected a finite value, got ", p.softmax_scale);
  }
  if (p.kernel != AttentionKernel::kAuto && p.kernel != AttentionKernel::kSm90Tile32 &&
      p.kernel != AttentionKernel::kSm90Pairs) {
    return invalid_argument(
        "params.kernel: expected kAuto (0), kSm90Tile32 (1) or kSm90Pairs (2), got ",
        static_cast<int32_t>(p.kernel));
  }
  if (p.query_group_size < 1 || p.query_group_size > kMaxQueryGroup) {
    return invalid_argument("params.query_group_size: expected 1..", kMaxQueryGroup, ", got ",
                            p.query_group_size);
  }
  if (p.num_tokens > std::numeric_limits<int64_t>::max() / (int64_t{p.num_heads} * kHeadDim)) {
    return invalid_argument("params.num_tokens: ", p.num_tokens, " tokens * ", p.num_heads,
                            " heads * ", kHeadDim, " values overflows int64");
  }
  if (p.num_tokens > 0) {
    if (p.q == nullptr) return invalid_argument("params.q: null with ", p.num_tokens, " tokens");
    if (need_outputs && p.out == nullptr) {
      return invalid_argument("params.out: null with ", p.num_tokens, " tokens");
    }
    if (need_outputs && p.lse == nullptr) {
      return invalid_argument("params.lse: null with ", p.num_tokens, " tokens");
    }
  }
  SPARSE_SWA_RETURN_IF_ERROR(check_segment(p.swa_indices, p.swa_cache, "params.swa_indices",
                                           "params.swa_cache", p.num_tokens, space));
  if (p.extra_indices.rows != 0) {
    SPARSE_SWA_RETURN_IF_ERROR(check_segment(p.extra_indices, p.extra_cache, "params.extra_indices",
                                             "params.extra_cache", p.num_tokens, space));
  }
  return Status::Ok();
}

}  // namespace

Status sparse_attention_reference(const SparseAttentionParams& params, double* out, double* lse) {
  if (params.num_tokens > 0 && (out == nullptr || lse == nullptr)) {
    return invalid_argument("out / lse: null reference outputs with ", params.num_tokens,
                            " tokens");
  }
  SPARSE_SWA_RETURN_IF_ERROR(
      check_attention_shapes(params, MemorySpace::kHost, /*need_outputs=*/false));
  return detail::cpu_sparse_attention_reference(params, out, lse);
}

Status sparse_attention(const SparseAttentionParams& params, void* cuda_stream) {
  return detail::sparse_attention_with(params, detail::AttentionOverrides{}, cuda_stream);
}

Status detail::sparse_attention_with(const SparseAttentionParams& params,
                                     const AttentionOverrides& overrides, void* cuda_stream) {
  const MemorySpace space = params.swa_indices.space;
  SPARSE_SWA_RETURN_IF_ERROR(check_attention_shapes(params, space));
  if (space == MemorySpace::kDevice) {
    return detail::cuda_sparse_attention(params, overrides, cuda_stream);
  }
  return detail::cpu_sparse_attention(params);
}

int64_t sparse_attention_workspace_bytes(const SparseAttentionParams& params) {
  return detail::cuda_sparse_attention_workspace_bytes(params);
}

AttentionKernel sparse_attention_kernel(const SparseAttentionParams& params) {
  return detail::cuda_sparse_attention_kernel(params);
}

const char* attention_kernel_name(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::kSm90Tile32:
      return "sm90_tile32";
    case AttentionKernel::kSm90Pairs:
      return "sm90_pairs";
    default:
      return "auto";
  }
}

StatusOr<AttentionKernel> parse_attention_kernel(std::string_view name) {
  for (AttentionKernel k :
       {AttentionKernel::kAuto, AttentionKernel::kSm90Tile32, AttentionKernel::kSm90Pairs}) {
    if (name == attention_kernel_name(k)) return k;
  }
  return invalid_argument("kernel: expected \"auto\", \"sm90_tile32\" or \"sm90_pairs\", got '",
                          printable_excerpt(name), "'");
}

int64_t sparse_attention_max_workspace_bytes() {
  return detail::cuda_sparse_attention_max_workspace_bytes();
}

StatusOr<std::unique_ptr<AttentionWorkspace>> AttentionWorkspace::create(void* cuda_stream) {
  if (!detail::cuda_device_usable()) {
    return unavailable("attention workspace: no usable CUDA device");
  }
  if (detail::cuda_stream_capturing(cuda_stream)) {
    return unavailable("attention workspace: the stream is capturing a CUDA graph");
  }
  std::unique_ptr<AttentionWorkspace> w(new AttentionWorkspace());
  w->bytes_ = sparse_attention_max_workspace_bytes();
  if (w->bytes_ > 0) {
    SPARSE_SWA_RETURN_IF_ERROR(
        detail::cuda_device_alloc(&w->data_, static_cast<size_t>(w->bytes_)));
  }
  return w;
}

AttentionWorkspace::~AttentionWorkspace() {
  if (data_ != nullptr) detail::cuda_device_free(data_);
}

Status sparse_attention_cuda_from_host(const SparseAttentionParams& host_params) {
  SPARSE_SWA_RETURN_IF_ERROR(check_attention_shapes(host_params, MemorySpace::kHost));
  return detail::cuda_sparse_attention_from_host(host_params);
}

}  // namespace sparse_swa
