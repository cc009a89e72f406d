// SPDX-License-Identifier: Apache-2.0
// The CPU reference of the sparse attention: double accumulation over keys decoded with the
// reference codec (the semantics are include/sparse_swa/attention.h's).
#include <cmath>
#include <limits>
#include <vector>

#include "backend.h"
#include "common/fp8_e4m3.h"

namespace sparse_swa::detail {

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
    (void)cpu_decode_kv_rows(*seg.cache, *slots, dst);
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

}  // namespace

Status cpu_sparse_attention_reference(const SparseAttentionParams& p, double* out, double* lse) {
  SPARSE_SWA_RETURN_IF_ERROR(check_host_entries(p));
  std::vector<float> keys;
  std::vector<int64_t> slots;
  const int64_t head_values = int64_t{p.num_heads} * kHeadDim;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    reference_token(p, t, &keys, &slots, out + t * head_values, lse + t * p.num_heads);
  }
  return Status::Ok();
}

// Token by token in double, then rounded into the caller's bf16 / fp32 outputs.
Status cpu_sparse_attention(const SparseAttentionParams& params) {
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

}  // namespace sparse_swa::detail
