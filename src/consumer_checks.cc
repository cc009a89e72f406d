// SPDX-License-Identifier: Apache-2.0
// The consumers' shape functions and the checks of shapes and memory spaces their front end
// (consumers.cc) runs before either backend writes anything.
#include "consumer_checks.h"

#include <algorithm>

#include "common/int_limits.h"
#include "common/swa_formulas.h"

namespace sparse_swa {

namespace {

const char* space_name(MemorySpace s) { return s == MemorySpace::kHost ? "host" : "device"; }

// The mixed matrix's widths in int64: S, P and round_up(S + P, 4).
struct MixedWidths {
  int64_t swa = 0, compressed = 0, row = 0;
};
MixedWidths mixed_widths(int64_t swa_width, int64_t prefill_topk, int64_t decode_topk) {
  MixedWidths w;
  w.swa = std::max<int64_t>(swa_width, 0);
  w.compressed = formulas::round_up(std::max<int64_t>({prefill_topk, decode_topk, 0}), 4);
  w.row = formulas::round_up(w.swa + w.compressed, 4);
  return w;
}

int64_t decode_compressed_topk(const CompressedTopk& topk) {
  return topk.decode_global.width > 0 ? topk.decode_global.width : topk.decode_local.cols;
}

}  // namespace

StatusOr<int32_t> compressed_block_size(int32_t attn_block_size, int32_t compress_ratio) {
  SPARSE_SWA_RETURN_IF_ERROR(layer_type_for_ratio(compress_ratio, "compress_ratio").status());
  if (attn_block_size < 1 || attn_block_size % compress_ratio != 0) {
    return invalid_argument("attn_block_size: expected a positive multiple of the compress ratio ",
                            compress_ratio, ", got ", attn_block_size);
  }
  return attn_block_size / compress_ratio;
}

MixedMatrixShape mixed_matrix_shape(int32_t swa_width, int32_t prefill_topk,
                                    int32_t decode_compressed_topk) {
  // Saturated at the largest multiple of 4 in int32: build_mixed_matrix rejects wider rows.
  constexpr int64_t kMaxWidth = kInt32Max / 4 * 4;
  const MixedWidths w = mixed_widths(swa_width, prefill_topk, decode_compressed_topk);
  MixedMatrixShape s;
  s.swa_width = static_cast<int32_t>(w.swa);
  s.compressed_width = static_cast<int32_t>(std::min(w.compressed, kMaxWidth));
  s.row_width = static_cast<int32_t>(std::min(w.row, kMaxWidth));
  return s;
}

MixedMatrixShape mixed_matrix_shape(const SwaMetadata& md, const CompressedTopk& topk) {
  const int64_t decode_topk = decode_compressed_topk(topk);
  return mixed_matrix_shape(
      std::max(md.decode_swa.width, md.prefill_swa.width),
      static_cast<int32_t>(std::clamp<int64_t>(topk.prefill_local.cols, 0, kInt32Max)),
      static_cast<int32_t>(std::clamp<int64_t>(decode_topk, 0, kInt32Max)));
}

int64_t ragged_capacity(const ConstIndexView& view) {
  return std::max<int64_t>(view.rows, 0) * std::max(view.width, 0);
}

}  // namespace sparse_swa

namespace sparse_swa::detail {

Status check_space(MemorySpace expected, MemorySpace actual, std::string_view name) {
  if (expected != actual) {
    return invalid_argument(name, ": expected ", space_name(expected),
                            " memory (the metadata's space), got ", space_name(actual));
  }
  return Status::Ok();
}

Status check_matrix(const MatrixView<const int32_t>& m, MemorySpace space, std::string_view name) {
  if (m.rows < 0 || m.cols < 0) {
    return invalid_argument(name, ": expected rows, cols >= 0, got ", m.rows, " x ", m.cols);
  }
  if (m.cols > kInt32Max) return invalid_argument(name, ".cols: expected <= ", kInt32Max);
  if (m.stride < m.cols) {
    return invalid_argument(name, ".stride: expected >= cols ", m.cols, ", got ", m.stride);
  }
  if (m.rows > 0 && m.cols > 0) {
    if (m.data == nullptr) {
      return invalid_argument(name, ": ", m.rows, " x ", m.cols, " matrix with a null pointer");
    }
    SPARSE_SWA_RETURN_IF_ERROR(check_space(space, m.space, name));
  }
  return Status::Ok();
}

Status check_output(const IndexView& out, MemorySpace space, int64_t rows, int64_t width,
                    std::string_view name) {
  if (out.width < width) {
    return invalid_argument(name, ".width: expected >= ", width, " (the matrix needs ", rows, " x ",
                            width, "), got ", out.width);
  }
  if (out.rows < rows) {
    return invalid_argument(name, ".rows: expected >= ", rows, " (the matrix needs ", rows, " x ",
                            width, "), got ", out.rows);
  }
  if (out.row_stride < out.width) {
    return invalid_argument(name, ".row_stride: expected >= width ", out.width, ", got ",
                            out.row_stride);
  }
  if (rows > 0 && (out.data == nullptr || out.lens == nullptr)) {
    return invalid_argument(name, ": ", rows, " rows to write but a null data or lens pointer");
  }
  if (rows > 0) SPARSE_SWA_RETURN_IF_ERROR(check_space(space, out.space, name));
  return Status::Ok();
}

Status check_metadata_counts(const SwaMetadata& md) {
  if (md.num_reqs < 0 || md.num_tokens < 0) {
    return invalid_argument("metadata: expected num_reqs, num_tokens >= 0, got ", md.num_reqs, ", ",
                            md.num_tokens);
  }
  // Every token is a decode or a prefill token (the split covers padding too): the consumers
  // index prefill inputs by t - num_decode_tokens for every t >= num_decode_tokens.
  if (md.num_decode_tokens < 0 || md.num_prefill_tokens < 0 ||
      int64_t{md.num_decode_tokens} + md.num_prefill_tokens != md.num_tokens) {
    return invalid_argument(
        "metadata: expected num_decode_tokens + num_prefill_tokens = num_tokens ", md.num_tokens,
        ", got ", md.num_decode_tokens, " + ", md.num_prefill_tokens);
  }
  if (md.num_decodes < 0 || md.num_prefills < 0 ||
      int64_t{md.num_decodes} + md.num_prefills > md.num_reqs) {
    return invalid_argument("metadata: expected 0 <= num_decodes + num_prefills <= num_reqs ",
                            md.num_reqs, ", got ", md.num_decodes, " + ", md.num_prefills);
  }
  if (static_cast<int64_t>(md.token_to_req_indices.size()) < md.num_tokens ||
      static_cast<int64_t>(md.is_valid_token.size()) < md.num_tokens) {
    return invalid_argument("metadata.token_to_req_indices / is_valid_token: expected >= ",
                            md.num_tokens, " entries (num_tokens), got ",
                            md.token_to_req_indices.size(), " / ", md.is_valid_token.size());
  }
  return Status::Ok();
}

Status check_step(const ConsumerStep& step) {
  const SwaMetadata& md = step.md;
  const BatchInput& b = step.batch;
  const int64_t t = md.num_tokens;
  if (step.block_size < 1) {
    return invalid_argument("step.block_size: expected >= 1, got ", step.block_size);
  }
  if (md.window_size < 1) {
    return invalid_argument("metadata.window_size: expected >= 1, got ", md.window_size);
  }
  SPARSE_SWA_RETURN_IF_ERROR(check_metadata_counts(md));
  if (b.num_reqs() != md.num_reqs ||
      b.query_start_loc.size() != static_cast<size_t>(md.num_reqs) + 1) {
    return invalid_argument("batch: expected the metadata's ", md.num_reqs, " requests (",
                            int64_t{md.num_reqs} + 1, " query_start_loc entries), got ",
                            b.num_reqs(), " seq_lens and ", b.query_start_loc.size(),
                            " query_start_loc");
  }
  if (md.has_image() && (static_cast<int64_t>(md.left_visible.size()) < t ||
                         static_cast<int64_t>(md.right_visible.size()) < t)) {
    return invalid_argument("metadata.left_visible / right_visible: expected >= ", t,
                            " entries, got ", md.left_visible.size(), " / ",
                            md.right_visible.size());
  }
  // Bounded replay: one start per request, or none (no replay); the values are checked where a
  // window is recomputed (CPU: an error, GPU: the row masked).
  if (!md.replay_start.empty() && static_cast<int64_t>(md.replay_start.size()) < md.num_reqs) {
    return invalid_argument("metadata.replay_start: expected >= num_reqs ", md.num_reqs,
                            " entries (or none: no replay), got ", md.replay_start.size());
  }
  if (static_cast<int32_t>(md.prefill_gather_lens.size()) < md.num_prefills) {
    return invalid_argument("metadata.prefill_gather_lens: expected >= ", md.num_prefills,
                            " entries (num_prefills), got ", md.prefill_gather_lens.size());
  }
  SPARSE_SWA_RETURN_IF_ERROR(check_index_view(md.decode_swa, "metadata.decode_swa"));
  SPARSE_SWA_RETURN_IF_ERROR(check_index_view(md.prefill_swa, "metadata.prefill_swa"));
  if (md.decode_swa.rows < md.num_decode_tokens) {
    return invalid_argument("metadata.decode_swa.rows: expected >= num_decode_tokens ",
                            md.num_decode_tokens, ", got ", md.decode_swa.rows);
  }
  if (md.prefill_swa.rows < md.num_prefill_tokens) {
    return invalid_argument("metadata.prefill_swa.rows: expected >= num_prefill_tokens ",
                            md.num_prefill_tokens, ", got ", md.prefill_swa.rows);
  }
  if (md.num_decode_tokens > 0) {
    SPARSE_SWA_RETURN_IF_ERROR(check_space(md.space, md.decode_swa.space, "metadata.decode_swa"));
  }
  if (md.num_prefill_tokens > 0) {
    SPARSE_SWA_RETURN_IF_ERROR(check_space(md.space, md.prefill_swa.space, "metadata.prefill_swa"));
  }
  SPARSE_SWA_RETURN_IF_ERROR(check_matrix(b.block_table, md.space, "batch.block_table"));
  if (md.num_reqs > 0 && b.block_table.rows < md.num_reqs) {
    return invalid_argument("batch.block_table.rows: expected >= num_reqs ", md.num_reqs, ", got ",
                            b.block_table.rows);
  }
  return Status::Ok();
}

Status check_cache(const CompressedCache& cache, const SwaMetadata& md, std::string_view name) {
  SPARSE_SWA_RETURN_IF_ERROR(
      layer_type_for_ratio(cache.compress_ratio, str_cat(name, ".compress_ratio")).status());
  if (cache.compress_ratio == 1) return Status::Ok();
  if (cache.block_size < 1) {
    return invalid_argument(name, ".block_size: expected >= 1 (attn_block_size / ratio), got ",
                            cache.block_size);
  }
  SPARSE_SWA_RETURN_IF_ERROR(
      check_matrix(cache.block_table, md.space, str_cat(name, ".block_table")));
  if (md.num_reqs > 0 && cache.block_table.rows < md.num_reqs) {
    return invalid_argument(name, ".block_table.rows: expected >= num_reqs ", md.num_reqs, ", got ",
                            cache.block_table.rows);
  }
  return Status::Ok();
}

Status check_mixed_matrix_width(const SwaMetadata& md, const CompressedTopk& topk) {
  const int64_t swa = std::max(md.decode_swa.width, md.prefill_swa.width);
  const MixedWidths w = mixed_widths(swa, topk.prefill_local.cols, decode_compressed_topk(topk));
  if (w.row > kInt32Max) {
    return invalid_argument("mixed matrix: row_width round_up(S ", w.swa, " + P ", w.compressed,
                            ", 4) = ", w.row, " overflows int32");
  }
  return Status::Ok();
}

Status check_decode_width(const SwaMetadata& md) {
  if (md.causal || md.num_decode_tokens == 0) return Status::Ok();
  const int64_t needed = int64_t{md.window_size} + std::max(md.max_decode_query_len, 1);
  if (md.decode_swa.width < needed) {
    return invalid_argument(
        "metadata.decode_swa.width: non-causal (DSpark) rows hold up to "
        "window_size + query_len entries, expected >= ",
        md.window_size, " + ", std::max(md.max_decode_query_len, 1), " = ", needed, ", got ",
        md.decode_swa.width);
  }
  return Status::Ok();
}

}  // namespace sparse_swa::detail
