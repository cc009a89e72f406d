// SPDX-License-Identifier: Apache-2.0
// The per-step SWA metadata: the reference's DeepseekSparseSWAMetadata fields as views into
// the builder's persistent buffers. Valid until the builder's next build(). What each field means:
// docs/semantics.md#output-fields.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "sparse_swa/config.h"
#include "sparse_swa/index_view.h"

namespace sparse_swa {

// One chunk of the prefill workspace plan: prefill requests [start, end), the compressed region
// width N and the per-request workspace row count M = N + max gather length.
struct ChunkPlanEntry {
  int32_t start = 0;
  int32_t end = 0;
  int64_t compressed_width = 0;
  int64_t total_width = 0;
  bool operator==(const ChunkPlanEntry&) const = default;
};

struct SwaMetadata {
  MemorySpace space = MemorySpace::kHost;  // where the views below point (host spans excepted)
  bool causal = true;

  int32_t num_reqs = 0;
  int32_t num_tokens = 0;  // T, padding included
  int32_t num_decodes = 0;
  int32_t num_prefills = 0;
  int32_t num_decode_tokens = 0;   // Td
  int32_t num_prefill_tokens = 0;  // Tp
  int32_t max_decode_query_len = 1;

  // [T], padding tokens map to request 0 (a draft update maps them to num_reqs - 1)
  std::span<const int32_t> token_to_req_indices;
  std::span<const uint8_t> is_valid_token;  // [T], 1 where slot_mapping >= 0

  // [Td, decode_swa.width]: causal rows (width W) or DSpark non-causal rows (width Wn).
  ConstIndexView decode_swa;
  // [Tp, W + Mi]; rows == 0 when there are no prefill tokens.
  ConstIndexView prefill_swa;

  // In-image visibility, [T] indexed by absolute token (decode rows 0); empty unless the image
  // path ran (vision config, prefill tokens and at least one span in the batch).
  std::span<const int32_t> left_visible;
  std::span<const int32_t> right_visible;

  // [Rp]: ql + min(max(prefix - replay_start, 0), W - 1)
  std::span<const int32_t> prefill_gather_lens;
  std::span<const int32_t> prefill_seq_lens_host;    // [Rp] host
  std::span<const int32_t> prefill_query_lens_host;  // [Rp] host

  // [num_reqs]: the batch's replay_start, or zeros when it gave none (a copy in a persistent
  // buffer of the builder); replay_start_given tells which.
  std::span<const int32_t> replay_start;
  bool replay_start_given = false;

  // config.flashinfer_decode_lens and a non-causal step with Td > 0, else empty: [Td] each,
  // max(decode_swa.lens[t], W) and seq_lens[token_to_req_indices[t]].
  std::span<const int32_t> flashinfer_decode_topk_lens;
  std::span<const int32_t> flashinfer_decode_seq_lens;

  LayerTypeSet tile_schedulers;  // layer types needing a FlashMLA plan; empty when Td == 0

  // Constants of the chunk plan.
  int32_t window_size = 0;
  int64_t max_model_len = 0;
  int32_t max_num_batched_tokens = 0;

  int32_t decode_swa_width() const { return decode_swa.width; }
  bool has_prefill() const { return num_prefill_tokens > 0; }
  bool has_image() const { return !left_visible.empty(); }
  bool has_flashinfer_decode_lens() const { return !flashinfer_decode_topk_lens.empty(); }
};

// The reference's greedy workspace chunk plan over the prefill requests (host only).
// has_compressed defaults to compress_ratio > 1. Errors: ratio outside {1, 2, 4, 128},
// chunk_size < 1; host lens no builder would have written (not num_prefills entries, a query
// length outside 0..seq_len) or plan constants outside window_size >= 1, max_model_len
// 0..INT32_MAX, max_num_batched_tokens >= 0.
StatusOr<std::vector<ChunkPlanEntry>> prefill_chunk_plan(
    const SwaMetadata& md, int64_t compress_ratio, int64_t chunk_size,
    std::optional<bool> has_compressed = std::nullopt);

}  // namespace sparse_swa
