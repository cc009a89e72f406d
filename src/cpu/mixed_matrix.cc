// SPDX-License-Identifier: Apache-2.0
// The FlashInfer SM100 mixed matrix [T, S + P], CPU: SWA section then compressed section.
#include <algorithm>
#include <vector>

#include "backend.h"
#include "cpu/consumer_rows.h"

namespace sparse_swa::detail {

Status cpu_build_mixed_matrix(const ConsumerStep& step, const CompressedTopk& topk,
                              const MixedMatrixShape& shape, IndexView out,
                              std::span<int32_t> swa_lens) {
  const SwaMetadata& md = step.md;
  const int32_t num_tokens = md.num_tokens;
  const int32_t td = md.num_decode_tokens;
  const int32_t s = shape.swa_width;
  const int32_t ratio = topk.cache.compress_ratio;
  const bool with_image = md.has_image();
  // Checks first, so that nothing is written on error; keeps the prefill windows.
  std::vector<TokenWindow> windows(num_tokens);
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
    int32_t* compressed = row + s;
    if (t < td) {
      const int32_t r = md.token_to_req_indices[t];
      std::copy(md.decode_swa.row(t), md.decode_swa.row(t) + md.decode_swa.width, row);
      swa_count = md.decode_swa.lens[t];
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
        for (int32_t j = 0; j < compressed_count; ++j) {
          compressed[j] = host_global_slot(topk.cache, tw.request, local[j]);
        }
      }
    }
    out.lens[t] = s + compressed_count;
    if (!swa_lens.empty()) swa_lens[t] = swa_count;
  }
  return Status::Ok();
}

}  // namespace sparse_swa::detail
