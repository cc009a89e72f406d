// SPDX-License-Identifier: Apache-2.0
// Checks of the consumers' arguments that the front end (consumers.cc) runs before either backend
// writes anything: shapes, sizes and memory spaces, never the values inside device arrays.
#pragma once

#include <cstdint>
#include <string_view>

#include "sparse_swa/consumers.h"

namespace sparse_swa::detail {

Status check_space(MemorySpace expected, MemorySpace actual, std::string_view name);
// A matrix input: rows/cols/stride sane, data non-null when it has elements, in `space`.
Status check_matrix(const MatrixView<const int32_t>& m, MemorySpace space, std::string_view name);
// An output view: shape sane (no lens check: it is written), at least `rows` x `width`.
Status check_output(const IndexView& out, MemorySpace space, int64_t rows, int64_t width,
                    std::string_view name);
// The metadata's counts, before any arithmetic on them: every count >= 0, num_decode_tokens +
// num_prefill_tokens = num_tokens, num_decodes + num_prefills <= num_reqs (sums in int64), and
// token_to_req_indices / is_valid_token hold >= num_tokens entries.
Status check_metadata_counts(const SwaMetadata& md);
// The metadata and batch of a step agree in sizes and memory space (check_metadata_counts first;
// replay_start empty or >= num_reqs entries).
Status check_step(const ConsumerStep& step);
// The compressed cache of a layer: ratio valid, block size >= 1 and table shape when ratio > 1.
Status check_cache(const CompressedCache& cache, const SwaMetadata& md, std::string_view name);
// The mixed matrix's row (S + P rounded up to 4, computed in int64) fits int32.
Status check_mixed_matrix_width(const SwaMetadata& md, const CompressedTopk& topk);
// Non-causal (DSpark) decode rows hold up to W + query_len entries: a decode view narrower than
// window_size + max_decode_query_len would have truncated them.
Status check_decode_width(const SwaMetadata& md);

}  // namespace sparse_swa::detail
