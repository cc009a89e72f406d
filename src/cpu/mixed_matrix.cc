// The FlashInfer SM100 mixed matrix [T, S + P]: SWA section then compressed section.
#include <algorithm>
#include <vector>

#include "cpu/consumers_internal.h"

namespace sparse_swa {

namespace {

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

}  // namespace

Status build_mixed_matrix(const ConsumerStep& step, const CompressedTopk& topk, IndexView out,
                          std::span<int32_t> swa_lens, void* cuda_stream) {
  const SwaMetadata& md = step.md;
  SPARSE_SWA_RETURN_IF_ERROR(detail::check_decode_width(md));  // before lens > width
  SPARSE_SWA_RETURN_IF_ERROR(detail::check_step(step));
  SPARSE_SWA_RETURN_IF_ERROR(check_topk(step, topk));
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
#if SPARSE_SWA_HAS_CUDA
    return detail::cuda_build_mixed_matrix(step, topk, shape, out, swa_lens, cuda_stream);
#else
    return unavailable("build_mixed_matrix: device views need the CUDA backend");
#endif
  }
  (void)cuda_stream;

  const int32_t td = md.num_decode_tokens;
  const int32_t s = shape.swa_width;
  const int32_t ratio = topk.cache.compress_ratio;
  const bool with_image = md.has_image();
  // Checks first, so that nothing is written on error; keeps the prefill windows.
  std::vector<detail::TokenWindow> windows(num_tokens);
  for (int32_t t = 0; t < num_tokens; ++t) {
    if (!md.is_valid_token[t]) continue;
    if (t < td) {
      const int32_t r = md.token_to_req_indices[t];
      if (r < 0 || r >= md.num_reqs) {
        return invalid_argument("metadata.token_to_req_indices[", t, "]: expected 0..",
                                md.num_reqs - 1, ", got ", r);
      }
      continue;
    }
    auto tw = detail::host_token_window(step, t, with_image);
    SPARSE_SWA_RETURN_IF_ERROR(tw.status());
    if (tw->window.size() > s) {
      return invalid_argument("token ", t, ": its SWA window holds ", tw->window.size(),
                              " entries, more than the mixed matrix SWA width ", s);
    }
    windows[t] = tw.value();
  }

  for (int32_t t = 0; t < num_tokens; ++t) {
    int32_t* row = out.row(t);
    std::fill(row, row + out.width, -1);
    int32_t swa_count = 0, compressed_count = 0;
    if (!md.is_valid_token[t]) {
      out.lens[t] = 0;  // padded rows: all -1, lens 0
      if (!swa_lens.empty()) swa_lens[t] = 0;
      continue;
    }
    int32_t* compressed = row + s;
    if (t < td) {
      const int32_t r = md.token_to_req_indices[t];
      std::copy(md.decode_swa.row(t), md.decode_swa.row(t) + md.decode_swa.width, row);
      swa_count = md.decode_swa.lens[t];
      if (topk.decode_local.cols > 0) {
        for (int64_t j = 0; j < topk.decode_local.cols; ++j) {
          compressed[j] = detail::host_global_slot(topk.cache, r, topk.decode_local.row(t)[j]);
          compressed_count += compressed[j] >= 0;
        }
      } else if (topk.decode_global.width > 0) {
        compressed_count = topk.decode_global.lens[t];
        std::copy(topk.decode_global.row(t), topk.decode_global.row(t) + compressed_count,
                  compressed);
      }
    } else {
      const detail::TokenWindow& tw = windows[t];
      const int32_t* bt = step.batch.block_table.row(tw.request);
      swa_count = tw.window.size();
      for (int32_t j = 0; j < swa_count; ++j) {
        row[j] = static_cast<int32_t>(formulas::slot_id(bt, step.block_size, tw.window.start + j));
      }
      if (ratio > 1) {
        // The reference counts min((pos + 1) / ratio, TOP_K) whatever the entries hold.
        compressed_count = std::min<int64_t>((tw.pos + 1) / ratio, topk.prefill_local.cols);
        const int32_t* local = topk.prefill_local.row(t - td);
        for (int32_t j = 0; j < compressed_count; ++j) {
          compressed[j] = detail::host_global_slot(topk.cache, tw.request, local[j]);
        }
      }
    }
    out.lens[t] = s + compressed_count;
    if (!swa_lens.empty()) swa_lens[t] = swa_count;
  }
  return Status::Ok();
}

}  // namespace sparse_swa
