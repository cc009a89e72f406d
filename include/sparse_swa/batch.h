// SPDX-License-Identifier: Apache-2.0
// One step's batch, as the engine's scheduler hands it over (decode requests first).
#pragma once

#include <cstdint>
#include <span>

#include "sparse_swa/index_view.h"

namespace sparse_swa {

// An image span of one request: absolute positions [start, end], inclusive, inside
// [0, seq_len). Spans of one request must not overlap; each is at most max_image_tokens long.
struct ImageSpan {
  int32_t request = 0;
  int32_t start = 0;
  int32_t end = 0;
};

// The arrays live in the builder backend's memory space (host for the CPU backend, device for
// the CUDA backend). The CUDA backend also needs host copies of query_start_loc and seq_lens for
// the decode/prefill split and the chunk plan, as the reference does. The CPU backend needs none
// (an empty span is "not given"); one given must equal its array element by element, since the
// split would come from the copy and the rows from the array. Image spans are always host
// memory.
struct BatchInput {
  std::span<const int32_t> query_start_loc;  // [num_reqs + 1], 0 first, non-decreasing
  std::span<const int32_t> seq_lens;         // [num_reqs], context + query tokens after this step
  MatrixView<const int32_t> block_table;     // [>= num_reqs, max_blocks] physical page ids
  std::span<const int64_t> slot_mapping;     // [num_tokens] KV write slot, -1 = padding
  bool causal = true;                        // false: DSpark non-causal draft rows
  std::span<const ImageSpan> image_spans;    // any order; host memory
  // SWA bounded replay: [num_reqs], the first position of each request whose window KV exists
  // (0 <= replay_start[r] <= the request's prefix seq_lens[r] - query_len). Causal rows start
  // no earlier and prefill gather lengths shrink to match; DSpark non-causal rows ignore it.
  // Empty = all zeros (docs/semantics.md#bounded-replay).
  std::span<const int32_t> replay_start;

  std::span<const int32_t> query_start_loc_host;  // CUDA backend: host copy, [num_reqs + 1]
  std::span<const int32_t> seq_lens_host;         // CUDA backend: host copy, [num_reqs]

  int32_t num_reqs() const { return static_cast<int32_t>(seq_lens.size()); }
  // T: query_start_loc[num_reqs] real tokens plus trailing CUDA-graph padding.
  int32_t num_tokens() const { return static_cast<int32_t>(slot_mapping.size()); }
};

}  // namespace sparse_swa
