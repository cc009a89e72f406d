// SPDX-License-Identifier: Apache-2.0
// The index consumers' front end: every shape, size and memory-space check, then the backend
// the metadata's memory space picks (the CPU reference in src/cpu/, the CUDA kernels in
// src/cuda/consumers.cu).
#include "sparse_swa/consumers.h"

#include <algorithm>
#include <limits>

#include "backend.h"
#include "common/int_limits.h"
#include "common/swa_formulas.h"
#include "consumer_checks.h"

namespace sparse_swa {

namespace {

constexpr int64_t kPrefillTopkAlignment = 128;  // FlashMLA prefill: topk % B_TOPK == 0

// Rows [first_token, first_token + rows) must be tokens of the step.
Status check_token_rows(const SwaMetadata& md, int32_t first_token, int64_t rows,
                        std::string_view name) {
  SPARSE_SWA_RETURN_IF_ERROR(detail::check_metadata_counts(md));
  if (first_token < 0 || first_token + rows > md.num_tokens) {
    return invalid_argument(name, ": rows for tokens [", first_token, ", ", first_token + rows,
                            ") must lie inside the step's ", md.num_tokens, " tokens");
  }
  return Status::Ok();
}

Status check_topk(const ConsumerStep& step, const CompressedTopk& topk) {
  const SwaMetadata& md = step.md;
  SPARSE_SWA_RETURN_IF_ERROR(detail::check_cache(topk.cache, md, "topk.cache"));
  const bool has_local = topk.decode_local.cols > 0 || topk.decode_local.rows > 0;
  const bool has_global = topk.decode_global.width > 0 || topk.decode_global.rows > 0;
  const bool has_prefill = topk.prefill_local.cols > 0 || topk.prefill_local.rows > 0;
  if (topk.cache.compress_ratio == 1) {
    if (has_local || has_global || has_prefill) {
      return invalid_argument(
          "topk: compress_ratio 1 (SWA-only layer) takes no compressed "
          "top-k, got decode_local/decode_global/prefill_local");
    }
    return Status::Ok();
  }
  if (has_local && has_global) {
    return invalid_argument(
        "topk: expected decode_local (C2A/C4A) or decode_global (C128A), "
        "got both");
  }
  if (md.num_decode_tokens > 0 && !has_local && !has_global) {
    return invalid_argument("topk: ", md.num_decode_tokens, " decode tokens on a compress_ratio ",
                            topk.cache.compress_ratio,
                            " layer need decode_local or decode_global, got neither");
  }
  if (has_local) {
    SPARSE_SWA_RETURN_IF_ERROR(
        detail::check_matrix(topk.decode_local, md.space, "topk.decode_local"));
    if (topk.decode_local.rows < md.num_decode_tokens) {
      return invalid_argument("topk.decode_local.rows: expected >= num_decode_tokens ",
                              md.num_decode_tokens, ", got ", topk.decode_local.rows);
    }
  }
  if (has_global) {
    SPARSE_SWA_RETURN_IF_ERROR(check_index_view(topk.decode_global, "topk.decode_global"));
    SPARSE_SWA_RETURN_IF_ERROR(
        detail::check_space(md.space, topk.decode_global.space, "topk.decode_global"));
    if (topk.decode_global.rows < md.num_decode_tokens) {
      return invalid_argument("topk.decode_global.rows: expected >= num_decode_tokens ",
                              md.num_decode_tokens, ", got ", topk.decode_global.rows);
    }
  }
  if (md.num_prefill_tokens > 0 && topk.prefill_local.cols == 0) {
    return invalid_argument("topk.prefill_local: ", md.num_prefill_tokens,
                            " prefill tokens on a compress_ratio ", topk.cache.compress_ratio,
                            " layer need the prefill top-k, got none");
  }
  if (has_prefill) {
    SPARSE_SWA_RETURN_IF_ERROR(
        detail::check_matrix(topk.prefill_local, md.space, "topk.prefill_local"));
    if (topk.prefill_local.rows < md.num_prefill_tokens) {
      return invalid_argument("topk.prefill_local.rows: expected >= num_prefill_tokens ",
                              md.num_prefill_tokens, ", got ", topk.prefill_local.rows);
    }
  }
  return Status::Ok();
}

// Checks the chunk against the host lens of the metadata and resolves its token range.
StatusOr<detail::CombineChunk> resolve_chunk(const SwaMetadata& md, const ChunkPlanEntry& chunk,
                                             int32_t ratio, int32_t topk) {
  SPARSE_SWA_RETURN_IF_ERROR(detail::check_metadata_counts(md));
  const int32_t rp = md.num_prefills;
  if (static_cast<int32_t>(md.prefill_seq_lens_host.size()) != rp ||
      static_cast<int32_t>(md.prefill_query_lens_host.size()) != rp) {
    return invalid_argument("metadata.prefill_seq_lens_host / prefill_query_lens_host: expected ",
                            rp, " entries (num_prefills), got ", md.prefill_seq_lens_host.size(),
                            " / ", md.prefill_query_lens_host.size());
  }
  if (chunk.start < 0 || chunk.start >= chunk.end || chunk.end > rp) {
    return invalid_argument("chunk: expected 0 <= start < end <= num_prefills ", rp, ", got [",
                            chunk.start, ", ", chunk.end, ")");
  }
  if (chunk.compressed_width < 0 || chunk.total_width < chunk.compressed_width) {
    return invalid_argument("chunk: expected 0 <= compressed_width <= total_width, got N = ",
                            chunk.compressed_width, ", M = ", chunk.total_width);
  }
  if (chunk.total_width > kInt32Max) {
    return invalid_argument("chunk.total_width: expected <= ", kInt32Max, ", got ",
                            chunk.total_width);
  }
  if (chunk.total_width * (chunk.end - chunk.start) > kInt32Max) {
    return invalid_argument("chunk.total_width: ", chunk.end - chunk.start,
                            " requests x M = ", chunk.total_width,
                            " workspace rows overflow int32 indices");
  }
  if (ratio == 1 && topk != 0) {
    return invalid_argument(
        "prefill_local: compress_ratio 1 (SWA-only layer) takes no top-k, "
        "got ",
        topk, " columns");
  }
  if (ratio > 1 && topk == 0) {
    return invalid_argument("prefill_local: a compress_ratio ", ratio,
                            " layer needs the prefill top-k, got none");
  }
  if (md.window_size < 1) {
    return invalid_argument("metadata.window_size: expected >= 1, got ", md.window_size);
  }
  // Host planning arrays: 0 <= ql <= seq, sums in int64 (metadata may be corrupted).
  int64_t first_token = md.num_decode_tokens, rows = 0;
  for (int32_t p = 0; p < chunk.end; ++p) {
    const int64_t seq = md.prefill_seq_lens_host[p], ql = md.prefill_query_lens_host[p];
    if (ql < 0 || ql > seq) {
      return invalid_argument("metadata.prefill_query_lens_host[", p, "]: expected 0..",
                              "prefill_seq_lens_host[", p, "] = ", seq, ", got ", ql);
    }
    if (p < chunk.start) first_token += ql;
  }
  detail::CombineChunk c;
  for (int32_t p = chunk.start; p < chunk.end; ++p) {
    const int64_t seq = md.prefill_seq_lens_host[p], ql = md.prefill_query_lens_host[p];
    const int64_t gather = ql + std::clamp<int64_t>(seq - ql, 0, md.window_size - 1);
    if (chunk.compressed_width + gather > chunk.total_width) {
      return invalid_argument(
          "chunk.total_width: expected >= N + gather_len = ", chunk.compressed_width, " + ", gather,
          " for prefill request ", p, ", got ", chunk.total_width);
    }
    if (topk > 0 && chunk.compressed_width < seq / ratio) {
      return invalid_argument("chunk.compressed_width: expected >= seq_len / ratio = ", seq, " / ",
                              ratio, " for prefill request ", p, ", got ", chunk.compressed_width);
    }
    rows += ql;
  }
  if (first_token + rows > int64_t{md.num_decode_tokens} + md.num_prefill_tokens) {
    return invalid_argument("metadata.prefill_query_lens_host: chunk tokens [", first_token, ", ",
                            first_token + rows, ") pass the ", md.num_prefill_tokens,
                            " prefill tokens");
  }
  c.first_token = static_cast<int32_t>(first_token);  // both fit: bounded by T above
  c.rows = static_cast<int32_t>(rows);
  c.first_request = md.num_decodes + chunk.start;
  c.num_requests = chunk.end - chunk.start;
  c.compressed_width = static_cast<int32_t>(chunk.compressed_width);
  c.total_width = static_cast<int32_t>(chunk.total_width);
  c.ratio = ratio;
  c.topk = topk;
  return c;
}

}  // namespace

Status compressed_topk_to_global(const SwaMetadata& md, int32_t first_token,
                                 MatrixView<const int32_t> local, const CompressedCache& cache,
                                 IndexView out, void* cuda_stream) {
  SPARSE_SWA_RETURN_IF_ERROR(detail::check_matrix(local, md.space, "local_topk"));
  SPARSE_SWA_RETURN_IF_ERROR(check_token_rows(md, first_token, local.rows, "local_topk"));
  SPARSE_SWA_RETURN_IF_ERROR(detail::check_cache(cache, md, "cache"));
  if (cache.compress_ratio == 1) {
    return invalid_argument(
        "cache.compress_ratio: expected 2, 4 or 128 for compressed top-k, "
        "got 1");
  }
  SPARSE_SWA_RETURN_IF_ERROR(detail::check_output(out, md.space, local.rows, local.cols, "out"));
  if (local.rows == 0) return Status::Ok();
  if (md.space == MemorySpace::kDevice) {
    return detail::cuda_compressed_topk_to_global(md, first_token, local, cache, out, cuda_stream);
  }
  return detail::cpu_compressed_topk_to_global(md, first_token, local, cache, out);
}

Status copy_global_topk(const SwaMetadata& md, int32_t first_token, ConstIndexView global,
                        IndexView out, void* cuda_stream) {
  SPARSE_SWA_RETURN_IF_ERROR(check_index_view(global, "global_topk"));
  if (global.rows > 0) {
    SPARSE_SWA_RETURN_IF_ERROR(detail::check_space(md.space, global.space, "global_topk"));
  }
  SPARSE_SWA_RETURN_IF_ERROR(check_token_rows(md, first_token, global.rows, "global_topk"));
  SPARSE_SWA_RETURN_IF_ERROR(detail::check_output(out, md.space, global.rows, global.width, "out"));
  if (global.rows == 0) return Status::Ok();
  if (md.space == MemorySpace::kDevice) {
    return detail::cuda_copy_global_topk(md, first_token, global, out, cuda_stream);
  }
  return detail::cpu_copy_global_topk(md, first_token, global, out);
}

const char* mixed_matrix_form_name(MixedMatrixForm form) {
  return form == MixedMatrixForm::kVerbatim ? "verbatim" : "flashinfer_sm100";
}

StatusOr<MixedMatrixForm> parse_mixed_matrix_form(std::string_view name) {
  for (MixedMatrixForm f : {MixedMatrixForm::kFlashInferSm100, MixedMatrixForm::kVerbatim}) {
    if (name == mixed_matrix_form_name(f)) return f;
  }
  return invalid_argument("form: expected \"flashinfer_sm100\" or \"verbatim\", got '",
                          printable_excerpt(name), "'");
}

Status build_mixed_matrix(const ConsumerStep& step, const CompressedTopk& topk, IndexView out,
                          std::span<int32_t> swa_lens, void* cuda_stream) {
  return build_mixed_matrix(step, topk, MixedMatrixForm::kFlashInferSm100, out, swa_lens,
                            cuda_stream);
}

Status build_mixed_matrix(const ConsumerStep& step, const CompressedTopk& topk,
                          MixedMatrixForm form, IndexView out, std::span<int32_t> swa_lens,
                          void* cuda_stream) {
  const SwaMetadata& md = step.md;
  if (form != MixedMatrixForm::kFlashInferSm100 && form != MixedMatrixForm::kVerbatim) {
    return invalid_argument("form: expected kFlashInferSm100 or kVerbatim, got ",
                            static_cast<int32_t>(form));
  }
  SPARSE_SWA_RETURN_IF_ERROR(detail::check_decode_width(md));  // before lens > width
  SPARSE_SWA_RETURN_IF_ERROR(detail::check_step(step));
  SPARSE_SWA_RETURN_IF_ERROR(check_topk(step, topk));
  SPARSE_SWA_RETURN_IF_ERROR(detail::check_mixed_matrix_width(md, topk));
  const MixedMatrixShape shape = mixed_matrix_shape(md, topk);
  const int32_t num_tokens = md.num_tokens;
  SPARSE_SWA_RETURN_IF_ERROR(
      detail::check_output(out, md.space, num_tokens, shape.row_width, "out"));
  if (out.row_stride % 4 != 0) {
    return invalid_argument("out.row_stride: expected a multiple of 4 (16-byte aligned rows), got ",
                            out.row_stride);
  }
  if (!swa_lens.empty() && static_cast<int64_t>(swa_lens.size()) < num_tokens) {
    return invalid_argument("swa_lens: expected >= ", num_tokens, " entries (num_tokens), got ",
                            swa_lens.size());
  }
  if (num_tokens == 0) return Status::Ok();
  if (md.space == MemorySpace::kDevice) {
    return detail::cuda_build_mixed_matrix(step, topk, shape, form, out, swa_lens, cuda_stream);
  }
  return detail::cpu_build_mixed_matrix(step, topk, shape, form, out, swa_lens);
}

StatusOr<CombinedPrefillShape> combined_prefill_shape(const SwaMetadata& md,
                                                      const ChunkPlanEntry& chunk,
                                                      int32_t prefill_topk) {
  if (prefill_topk < 0) {
    return invalid_argument("prefill_topk: expected >= 0, got ", prefill_topk);
  }
  // The ratio only matters for checks that need the top-k; use the loosest one here.
  auto c = resolve_chunk(md, chunk, prefill_topk > 0 ? 128 : 1, prefill_topk);
  SPARSE_SWA_RETURN_IF_ERROR(c.status());
  const int64_t width =
      formulas::round_up(int64_t{prefill_topk} + md.prefill_swa.width, kPrefillTopkAlignment);
  if (width > kInt32Max) {
    return invalid_argument("prefill_topk: TOP_K ", prefill_topk, " + metadata.prefill_swa.width ",
                            md.prefill_swa.width, " rounded up to ", kPrefillTopkAlignment,
                            " gives rows wider than int32");
  }
  CombinedPrefillShape s;
  s.rows = c->rows;
  s.width = static_cast<int32_t>(width);
  return s;
}

Status build_combined_prefill(const ConsumerStep& step, const ChunkPlanEntry& chunk,
                              int32_t compress_ratio, MatrixView<const int32_t> prefill_local,
                              IndexView out, void* cuda_stream) {
  const SwaMetadata& md = step.md;
  SPARSE_SWA_RETURN_IF_ERROR(detail::check_step(step));
  SPARSE_SWA_RETURN_IF_ERROR(layer_type_for_ratio(compress_ratio, "compress_ratio").status());
  SPARSE_SWA_RETURN_IF_ERROR(detail::check_matrix(prefill_local, md.space, "prefill_local"));
  const int32_t topk = static_cast<int32_t>(prefill_local.cols);
  auto c = resolve_chunk(md, chunk, compress_ratio, topk);
  SPARSE_SWA_RETURN_IF_ERROR(c.status());
  if (topk > 0 && prefill_local.rows < md.num_prefill_tokens) {
    return invalid_argument("prefill_local.rows: expected >= num_prefill_tokens ",
                            md.num_prefill_tokens, ", got ", prefill_local.rows);
  }
  const int64_t width =
      formulas::round_up(int64_t{topk} + md.prefill_swa.width, kPrefillTopkAlignment);
  SPARSE_SWA_RETURN_IF_ERROR(detail::check_output(out, md.space, c->rows, width, "out"));
  if (md.space == MemorySpace::kDevice) {
    return detail::cuda_build_combined_prefill(step, c.value(), prefill_local, out, cuda_stream);
  }
  return detail::cpu_build_combined_prefill(step, c.value(), prefill_local, out);
}

Status check_prefill_topk(const ConsumerStep& step, int32_t compress_ratio,
                          MatrixView<const int32_t> prefill_local) {
  const SwaMetadata& md = step.md;
  SPARSE_SWA_RETURN_IF_ERROR(detail::check_step(step));
  SPARSE_SWA_RETURN_IF_ERROR(layer_type_for_ratio(compress_ratio, "compress_ratio").status());
  if (md.space != MemorySpace::kHost) {
    return invalid_argument("check_prefill_topk: expected host metadata, got device");
  }
  SPARSE_SWA_RETURN_IF_ERROR(detail::check_matrix(prefill_local, md.space, "prefill_local"));
  if (compress_ratio == 1 || prefill_local.cols == 0) return Status::Ok();
  if (prefill_local.rows < md.num_prefill_tokens) {
    return invalid_argument("prefill_local.rows: expected >= num_prefill_tokens ",
                            md.num_prefill_tokens, ", got ", prefill_local.rows);
  }
  return detail::cpu_check_prefill_topk(step, compress_ratio, prefill_local);
}

Status to_ragged(const ConstIndexView& view, const RaggedView& out, void* cuda_stream) {
  SPARSE_SWA_RETURN_IF_ERROR(check_index_view(view, "view"));
  const int64_t capacity = ragged_capacity(view);
  if (capacity > std::numeric_limits<int32_t>::max()) {
    return invalid_argument("view: ", view.rows, " rows x width ", view.width,
                            " overflow the int32 indptr");
  }
  if (out.indptr_size < view.rows + 1) {
    return invalid_argument("out.indptr_size: expected >= rows + 1 = ", view.rows + 1, ", got ",
                            out.indptr_size);
  }
  // Sized from the width, never the window: a DSpark row is wider than W.
  if (out.capacity < capacity) {
    return invalid_argument("out.capacity: expected >= rows x width = ", view.rows, " x ",
                            view.width, " = ", capacity, ", got ", out.capacity);
  }
  if (out.indptr == nullptr || (capacity > 0 && out.values == nullptr)) {
    return invalid_argument("out: null indptr or values pointer");
  }
  if (out.space != view.space) {
    return invalid_argument("out: expected the view's memory space, got the other one");
  }
  if (view.space == MemorySpace::kDevice) {
    return detail::cuda_to_ragged(view, out, cuda_stream);
  }
  return detail::cpu_to_ragged(view, out);
}

}  // namespace sparse_swa
