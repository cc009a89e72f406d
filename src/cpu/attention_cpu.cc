// Shape checks, the backend dispatcher and the CPU reference of the sparse attention (double
// accumulation over keys decoded with the reference codec).
#include <cmath>
#include <limits>
#include <vector>

#include "common/fp8_e4m3.h"
#include "cuda/attention_launch.cuh"
#include "sparse_swa/attention.h"

namespace sparse_swa {
namespace detail {
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

}  // namespace

Status check_attention_shapes(const SparseAttentionParams& p, MemorySpace space,
                              bool need_outputs) {
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

}  // namespace detail

namespace {

struct Segment {
  const ConstIndexView* indices;
  const ConstKvCacheView* cache;
  const char* name;
};

int num_segments(const SparseAttentionParams& p) { return p.extra_indices.rows != 0 ? 2 : 1; }

Segment segment(const SparseAttentionParams& p, int s) {
  if (s == 0) return {&p.swa_indices, &p.swa_cache, "params.swa_indices"};
  return {&p.extra_indices, &p.extra_cache, "params.extra_indices"};
}

// Host: every entry inside a row's length is -1 (a hole) or addresses a real slot.
Status check_host_entries(const SparseAttentionParams& p) {
  for (int s = 0; s < num_segments(p); ++s) {
    const Segment seg = segment(p, s);
    const int64_t num_slots = seg.cache->num_slots();
    for (int64_t t = 0; t < p.num_tokens; ++t) {
      const int32_t* row = seg.indices->row(t);
      for (int32_t j = 0; j < seg.indices->lens[t]; ++j) {
        if (row[j] < -1) {
          return invalid_argument(seg.name, "[", t, "][", j, "]: slot ", row[j],
                                  " is below -1 (expected -1 for a hole or a slot in [0, ",
                                  num_slots, "))");
        }
        if (row[j] >= num_slots) {
          return invalid_argument(seg.name, "[", t, "][", j, "]: slot ", row[j],
                                  " is outside the cache (num_blocks * block_size = ", num_slots,
                                  ")");
        }
      }
    }
  }
  return Status::Ok();
}

// Token t of the reference: out [H, 512] and lse [H] in double. `keys` is scratch.
void reference_token(const SparseAttentionParams& p, int64_t t, std::vector<float>* keys,
                     std::vector<int64_t>* slots, double* out, double* lse) {
  // Gather and decode the valid keys of both segments, SWA first.
  keys->clear();
  int64_t num_keys = 0;
  for (int s = 0; s < num_segments(p); ++s) {
    const Segment seg = segment(p, s);
    slots->clear();
    const int32_t* row = seg.indices->row(t);
    for (int32_t j = 0; j < seg.indices->lens[t]; ++j) {
      if (row[j] >= 0) slots->push_back(row[j]);
    }
    keys->resize((num_keys + slots->size()) * kHeadDim);
    MatrixView<float> dst{keys->data() + num_keys * kHeadDim, static_cast<int64_t>(slots->size()),
                          kHeadDim, kHeadDim, MemorySpace::kHost};
    // Shapes and slots were checked by the caller; decoding cannot fail here.
    (void)decode_kv_rows(*seg.cache, *slots, dst);
    num_keys += static_cast<int64_t>(slots->size());
  }

  const double scale = p.softmax_scale;
  std::vector<double> q(kHeadDim), score(num_keys);
  for (int32_t h = 0; h < p.num_heads; ++h) {
    double* o = out + static_cast<int64_t>(h) * kHeadDim;
    std::fill(o, o + kHeadDim, 0.0);
    if (num_keys == 0) {
      lse[h] = std::numeric_limits<double>::infinity();
      continue;
    }
    const uint16_t* qh = p.q + (t * p.num_heads + h) * kHeadDim;
    for (int d = 0; d < kHeadDim; ++d) q[d] = fp8::bf16_to_float(qh[d]);
    double max_score = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < num_keys; ++i) {
      const float* k = keys->data() + i * kHeadDim;
      double dot = 0.0;
      for (int d = 0; d < kHeadDim; ++d) dot += q[d] * static_cast<double>(k[d]);
      score[i] = scale * dot;
      max_score = std::max(max_score, score[i]);
    }
    double sum = 0.0;
    for (int64_t i = 0; i < num_keys; ++i) {
      const double w = std::exp(score[i] - max_score);
      sum += w;
      const float* k = keys->data() + i * kHeadDim;
      for (int d = 0; d < kHeadDim; ++d) o[d] += w * static_cast<double>(k[d]);
    }
    lse[h] = max_score + std::log(sum);
    double factor = 1.0 / sum;
    if (p.sinks != nullptr) factor /= 1.0 + std::exp(static_cast<double>(p.sinks[h]) - lse[h]);
    for (int d = 0; d < kHeadDim; ++d) o[d] *= factor;
  }
}

Status run_reference(const SparseAttentionParams& p, double* out, double* lse) {
  SPARSE_SWA_RETURN_IF_ERROR(
      detail::check_attention_shapes(p, MemorySpace::kHost, /*need_outputs=*/false));
  SPARSE_SWA_RETURN_IF_ERROR(check_host_entries(p));
  std::vector<float> keys;
  std::vector<int64_t> slots;
  const int64_t head_values = int64_t{p.num_heads} * kHeadDim;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    reference_token(p, t, &keys, &slots, out + t * head_values, lse + t * p.num_heads);
  }
  return Status::Ok();
}

// Round to nearest even bf16 straight from double (going through float first could land on a
// bf16 tie that the double value is not on).
uint16_t double_to_bf16(double d) {
  const float f = static_cast<float>(d);
  uint32_t u = fp8::float_bits(f);
  if ((u & 0xffffu) == 0x8000u && std::isfinite(d) && static_cast<double>(f) != d) {
    const bool larger_magnitude = (d > static_cast<double>(f)) == (f > 0.0f);
    u = larger_magnitude ? u + 0x8000u : u & 0xffff0000u;
  }
  return fp8::float_to_bf16(fp8::bits_float(u));
}

#if !SPARSE_SWA_HAS_CUDA
Status no_cuda_build() {
  return unavailable(
      "backend cuda: this build of sparse_swa has no CUDA backend (configure with a CUDA "
      "toolkit and SPARSE_SWA_CUDA=ON)");
}
#endif

}  // namespace

Status sparse_attention_reference(const SparseAttentionParams& params, double* out, double* lse) {
  if (params.num_tokens > 0 && (out == nullptr || lse == nullptr)) {
    return invalid_argument("out / lse: null reference outputs with ", params.num_tokens,
                            " tokens");
  }
  return run_reference(params, out, lse);
}

Status sparse_attention(const SparseAttentionParams& params, Backend backend, void* cuda_stream) {
  if (backend == Backend::kCuda) {
    SPARSE_SWA_RETURN_IF_ERROR(detail::check_attention_shapes(params, MemorySpace::kDevice));
#if SPARSE_SWA_HAS_CUDA
    return detail::cuda_sparse_attention(params, cuda_stream);
#else
    (void)cuda_stream;
    return no_cuda_build();
#endif
  }
  // CPU: run token by token in double, then round into the caller's bf16 / fp32 outputs.
  SPARSE_SWA_RETURN_IF_ERROR(detail::check_attention_shapes(params, MemorySpace::kHost));
  SPARSE_SWA_RETURN_IF_ERROR(check_host_entries(params));
  std::vector<float> keys;
  std::vector<int64_t> slots;
  const int64_t head_values = int64_t{params.num_heads} * kHeadDim;
  std::vector<double> out(head_values), lse(params.num_heads);
  for (int64_t t = 0; t < params.num_tokens; ++t) {
    reference_token(params, t, &keys, &slots, out.data(), lse.data());
    for (int64_t i = 0; i < head_values; ++i) {
      params.out[t * head_values + i] = double_to_bf16(out[i]);
    }
    for (int32_t h = 0; h < params.num_heads; ++h) {
      params.lse[t * params.num_heads + h] = static_cast<float>(lse[h]);
    }
  }
  return Status::Ok();
}

int64_t sparse_attention_workspace_bytes(const SparseAttentionParams& params) {
#if SPARSE_SWA_HAS_CUDA
  return detail::cuda_sparse_attention_workspace_bytes(params);
#else
  (void)params;
  return 0;
#endif
}

Status sparse_attention_cuda_from_host(const SparseAttentionParams& host_params) {
  SPARSE_SWA_RETURN_IF_ERROR(detail::check_attention_shapes(host_params, MemorySpace::kHost));
#if SPARSE_SWA_HAS_CUDA
  return detail::cuda_sparse_attention_from_host(host_params);
#else
  return no_cuda_build();
#endif
}

}  // namespace sparse_swa
