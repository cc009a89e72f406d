// SPDX-License-Identifier: Apache-2.0
// The reference's greedy prefill workspace chunk plan (host only).
#include <algorithm>
#include <limits>

#include "common/int_limits.h"
#include "common/swa_formulas.h"
#include "sparse_swa/metadata.h"

namespace sparse_swa {

StatusOr<std::vector<ChunkPlanEntry>> prefill_chunk_plan(const SwaMetadata& md,
                                                         int64_t compress_ratio, int64_t chunk_size,
                                                         std::optional<bool> has_compressed) {
  SPARSE_SWA_RETURN_IF_ERROR(
      layer_type_for_ratio(compress_ratio, "chunk_plan.compress_ratio").status());
  if (chunk_size < 1) {
    return invalid_argument("chunk_plan.chunk_size: expected >= 1, got ", chunk_size);
  }
  std::vector<ChunkPlanEntry> plan;
  const int32_t n = md.num_prefills;
  if (n == 0) return plan;
  if (static_cast<int32_t>(md.prefill_seq_lens_host.size()) != n ||
      static_cast<int32_t>(md.prefill_query_lens_host.size()) != n) {
    return invalid_argument("metadata.prefill_seq_lens_host: expected ", n,
                            " entries (num_prefills), got ", md.prefill_seq_lens_host.size());
  }
  // The plan's constants as a builder config bounds them: the budget below stays positive and
  // its sum cannot overflow.
  if (md.window_size < 1) {
    return invalid_argument("metadata.window_size: expected >= 1, got ", md.window_size);
  }
  if (md.max_model_len < 0 || md.max_model_len > kInt32Max) {
    return invalid_argument("metadata.max_model_len: expected 0..", kInt32Max, ", got ",
                            md.max_model_len);
  }
  if (md.max_num_batched_tokens < 0) {
    return invalid_argument("metadata.max_num_batched_tokens: expected >= 0, got ",
                            md.max_num_batched_tokens);
  }
  for (int32_t p = 0; p < n; ++p) {
    const int64_t seq = md.prefill_seq_lens_host[p], ql = md.prefill_query_lens_host[p];
    if (ql < 0 || ql > seq) {
      return invalid_argument("metadata.prefill_query_lens_host[", p, "]: expected 0..",
                              "prefill_seq_lens_host[", p, "] = ", seq, ", got ", ql);
    }
  }
  const bool compressed = has_compressed.value_or(compress_ratio > 1);
  const int64_t window = md.window_size;
  // Worst case per request: every compressed entry plus max_num_batched_tokens + W - 1 tokens.
  const int64_t per_request =
      (compressed ? formulas::ceil_div(md.max_model_len, compress_ratio) : 0) + window +
      md.max_num_batched_tokens;
  // Saturating: a chunk size so large that the budget passes int64 means "no limit".
  const int64_t area = chunk_size > std::numeric_limits<int64_t>::max() / per_request
                           ? std::numeric_limits<int64_t>::max()
                           : chunk_size * per_request;
  auto gather = [&](int32_t i) -> int64_t {
    const int64_t ql = md.prefill_query_lens_host[i];
    const int64_t prefix = md.prefill_seq_lens_host[i] - ql;
    return ql + std::clamp<int64_t>(prefix, 0, window - 1);
  };
  auto comp = [&](int32_t i) -> int64_t {
    return compressed ? md.prefill_seq_lens_host[i] / compress_ratio : 0;
  };
  int32_t start = 0;
  while (start < n) {
    int64_t max_comp = comp(start), max_gather = gather(start);
    int32_t end = start + 1;
    while (end < n) {
      const int64_t c = std::max(max_comp, comp(end));
      const int64_t g = std::max(max_gather, gather(end));
      // (end - start + 1) * (c + g) > area, without overflowing.
      if (c + g > 0 && end - start + 1 > area / (c + g)) break;
      max_comp = c;
      max_gather = g;
      ++end;
    }
    plan.push_back({start, end, max_comp, max_comp + max_gather});
    start = end;
  }
  return plan;
}

}  // namespace sparse_swa
