// SPDX-License-Identifier: Apache-2.0
// The FlashInfer SM100 mixed matrix [T, S + P], CPU: SWA section then compressed section, with
// non-causal decode rows re-laid (common/mixed_relayout.h) or copied, as the form says.
#include <algorithm>
#include <vector>

#include "backend.h"
#include "common/mixed_relayout.h"
#include "cpu/consumer_rows.h"

namespace sparse_swa::detail {

namespace {

// The relayout of non-causal decode token t, or an error naming what breaks it: the token
// outside its request, a row that is not the builder's non-causal row, or one needing more than
// the s SWA columns (a block longer than the row allows).
StatusOr<formulas::RelaidRow> host_relaid_row(const ConsumerStep& step, int32_t t, int32_t r,
                                              int32_t s) {
  const SwaMetadata& md = step.md;
  const int64_t qs = step.batch.query_start_loc[r], qe = step.batch.query_start_loc[r + 1];
  if (t < qs || t >= qe) {
    return invalid_argument("token ", t, ": maps to request ", r,
                            " but batch.query_start_loc gives that request tokens [", qs, ", ", qe,
                            ")");
  }
  const int64_t ql = qe - qs, ctx = int64_t{step.batch.seq_lens[r]} - ql;
  if (ctx < 0) {
    return invalid_argument("batch.seq_lens[", r, "]: expected >= query length ", ql, ", got ",
                            step.batch.seq_lens[r]);
  }
  const formulas::RelaidRow row = formulas::relaid_row(ctx, ql, t - qs, md.window_size);
  if (md.decode_swa.lens[t] != row.row_entries()) {
    return invalid_argument("metadata.decode_swa.lens[", t,
                            "]: expected the non-causal row's min(prefix, window_size) + "
                            "query_len = min(",
                            ctx, ", ", md.window_size, ") + ", ql, " = ", row.row_entries(),
                            ", got ", md.decode_swa.lens[t]);
  }
  const int64_t cs = row.compressed_start(md.window_size);
  if (cs > s) {
    return invalid_argument("metadata.decode_swa.width: the relaid non-causal row of token ", t,
                            " (request ", r, ", query_len ", ql, ", prefix ", ctx,
                            ") needs window_size + spill = ", md.window_size, " + ", row.spill_len,
                            " = ", cs, " SWA columns, expected <= the mixed matrix's S = ", s,
                            ", got ", cs);
  }
  return row;
}

}  // namespace

Status cpu_build_mixed_matrix(const ConsumerStep& step, const CompressedTopk& topk,
                              const MixedMatrixShape& shape, MixedMatrixForm form, IndexView out,
                              std::span<int32_t> swa_lens) {
  const SwaMetadata& md = step.md;
  const int32_t num_tokens = md.num_tokens;
  const int32_t td = md.num_decode_tokens;
  const int32_t s = shape.swa_width;
  const int32_t w = md.window_size;
  const int32_t ratio = topk.cache.compress_ratio;
  const bool with_image = md.has_image();
  const bool relaid = form == MixedMatrixForm::kFlashInferSm100 && !md.causal;
  // Checks first, so that nothing is written on error; keeps the prefill windows and relayouts.
  std::vector<TokenWindow> windows(num_tokens);
  std::vector<formulas::RelaidRow> relayouts(relaid ? td : 0);
  for (int32_t t = 0; t < num_tokens; ++t) {
    if (!md.is_valid_token[t]) continue;
    if (t < td) {
      const int32_t r = md.token_to_req_indices[t];
      if (r < 0 || r >= md.num_reqs) {
        return invalid_argument("metadata.token_to_req_indices[", t, "]: expected 0..",
                                md.num_reqs - 1, ", got ", r);
      }
      if (relaid) {
        auto row = host_relaid_row(step, t, r, s);
        SPARSE_SWA_RETURN_IF_ERROR(row.status());
        relayouts[t] = row.value();
      }
      continue;
    }
    auto tw = host_token_window(step, t, with_image);
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
    int32_t compressed_start = s;  // cs <= s (checked)
    if (t < td) {
      const int32_t r = md.token_to_req_indices[t];
      const int32_t* src = md.decode_swa.row(t);
      swa_count = md.decode_swa.lens[t];
      if (relaid) {
        const formulas::RelaidRow& rr = relayouts[t];
        compressed_start = static_cast<int32_t>(rr.compressed_start(w));
        for (int32_t j = 0; j < compressed_start; ++j) {
          const int64_t from = formulas::relaid_source(j, w, rr);
          row[j] = from < 0 ? -1 : src[from];
        }
      } else {
        std::copy(src, src + md.decode_swa.width, row);
      }
      int32_t* compressed = row + compressed_start;
      if (topk.decode_local.cols > 0) {
        for (int64_t j = 0; j < topk.decode_local.cols; ++j) {
          compressed[j] = host_global_slot(topk.cache, r, topk.decode_local.row(t)[j]);
          compressed_count += compressed[j] >= 0;
        }
      } else if (topk.decode_global.width > 0) {
        compressed_count = topk.decode_global.lens[t];
        std::copy(topk.decode_global.row(t), topk.decode_global.row(t) + compressed_count,
                  compressed);
      }
    } else {
      const TokenWindow& tw = windows[t];
      const int32_t* bt = step.batch.block_table.row(tw.request);
      swa_count = tw.window.size();
      for (int32_t j = 0; j < swa_count; ++j) {
        row[j] = static_cast<int32_t>(formulas::slot_id(bt, step.block_size, tw.window.start + j));
      }
      if (ratio > 1) {
        // The reference counts min((pos + 1) / ratio, TOP_K) whatever the entries hold.
        compressed_count = std::min<int64_t>((tw.pos + 1) / ratio, topk.prefill_local.cols);
        const int32_t* local = topk.prefill_local.row(t - td);
        int32_t* compressed = row + s;
        for (int32_t j = 0; j < compressed_count; ++j) {
          compressed[j] = host_global_slot(topk.cache, tw.request, local[j]);
        }
      }
    }
    out.lens[t] = compressed_start + compressed_count;
    if (!swa_lens.empty()) swa_lens[t] = swa_count;
  }
  return Status::Ok();
}

}  // namespace sparse_swa::detail
