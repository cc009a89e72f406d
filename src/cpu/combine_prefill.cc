// SPDX-License-Identifier: Apache-2.0
// FlashMLA sparse prefill, CPU: workspace-relative rows (compressed top-k then SWA) of one chunk.
#include <algorithm>
#include <vector>

#include "backend.h"
#include "cpu/consumer_rows.h"

namespace sparse_swa::detail {

namespace {

// The position-derived part of a row, checked against the chunk (host arrays).
struct CombineRow {
  int32_t b = 0;  // request index inside the chunk
  int32_t pos = 0;
  int32_t seq_len = 0;
  int32_t gather_start = 0;       // first gathered position
  formulas::Window window{0, 0};  // from max(swa start, replay_start), clamped to the gathered
                                  // range [gather_start, seq_len)
};

StatusOr<CombineRow> combine_row(const ConsumerStep& step, const CombineChunk& c, int32_t t) {
  const SwaMetadata& md = step.md;
  // The rows index the gathered workspace, never a page: no block-table check (as on the GPU).
  auto tw = host_token_window(step, t, md.has_image(), /*check_blocks=*/false);
  SPARSE_SWA_RETURN_IF_ERROR(tw.status());
  CombineRow row;
  row.b = tw->request - c.first_request;
  if (row.b < 0 || row.b >= c.num_requests) {
    return invalid_argument("token ", t, ": maps to request ", tw->request,
                            ", outside the chunk's requests [", c.first_request, ", ",
                            c.first_request + c.num_requests, ")");
  }
  row.pos = tw->pos;
  row.seq_len = step.batch.seq_lens[tw->request];
  const int32_t gather = md.prefill_gather_lens[tw->request - md.num_decodes];
  if (gather < 0 || gather > row.seq_len || c.compressed_width + int64_t{gather} > c.total_width) {
    return invalid_argument("metadata.prefill_gather_lens[", tw->request - md.num_decodes,
                            "]: expected 0..min(seq_len ", row.seq_len, ", M - N ",
                            c.total_width - c.compressed_width, "), got ", gather);
  }
  row.gather_start = row.seq_len - gather;
  row.window.start = std::max(tw->window.start, row.gather_start);
  row.window.end = std::max(std::min(tw->window.end, row.seq_len), row.window.start);
  return row;
}

}  // namespace

Status cpu_build_combined_prefill(const ConsumerStep& step, const CombineChunk& c,
                                  MatrixView<const int32_t> prefill_local, IndexView out) {
  const SwaMetadata& md = step.md;
  const int32_t compress_ratio = c.ratio;
  const int32_t topk = c.topk;
  std::vector<CombineRow> rows(c.rows);
  for (int32_t i = 0; i < c.rows; ++i) {  // checks first: nothing is written on error
    const int32_t t = c.first_token + i;
    if (!md.is_valid_token[t]) continue;
    auto row = combine_row(step, c, t);
    SPARSE_SWA_RETURN_IF_ERROR(row.status());
    rows[i] = row.value();
  }
  const int32_t n = c.compressed_width, m = c.total_width;
  for (int32_t i = 0; i < c.rows; ++i) {
    const int32_t t = c.first_token + i;
    int32_t* out_row = out.row(i);
    std::fill(out_row, out_row + out.width, -1);
    if (!md.is_valid_token[t]) {
      out.lens[i] = 0;
      continue;
    }
    const CombineRow& r = rows[i];
    const int32_t base = m * r.b;
    const int32_t topk_len = compress_ratio > 1 ? std::min((r.pos + 1) / compress_ratio, topk) : 0;
    const int32_t* local = topk > 0 ? prefill_local.row(t - md.num_decode_tokens) : nullptr;
    const int32_t compressed_entries = r.seq_len / compress_ratio;  // gathered for this request
    for (int32_t j = 0; j < topk_len; ++j) {
      // Masked, not rejected: the kernel cannot report it, and FlashMLA skips -1.
      const int32_t l = local[j];
      out_row[j] = l >= 0 && l < compressed_entries ? base + l : -1;
    }
    const int32_t swa_len = r.window.size();
    for (int32_t j = 0; j < swa_len; ++j) {
      out_row[topk_len + j] = base + n + (r.window.start - r.gather_start) + j;
    }
    out.lens[i] = topk_len + swa_len;
  }
  return Status::Ok();
}

Status cpu_check_prefill_topk(const ConsumerStep& step, int32_t compress_ratio,
                              MatrixView<const int32_t> prefill_local) {
  const SwaMetadata& md = step.md;
  const int32_t td = md.num_decode_tokens;
  for (int32_t p = 0; p < md.num_prefill_tokens; ++p) {
    const int32_t t = td + p;
    if (!md.is_valid_token[t]) continue;
    auto tw = host_token_window(step, t, false, /*check_blocks=*/false);
    SPARSE_SWA_RETURN_IF_ERROR(tw.status());
    const int64_t topk_len = std::min<int64_t>((tw->pos + 1) / compress_ratio, prefill_local.cols);
    const int32_t entries = step.batch.seq_lens[tw->request] / compress_ratio;
    for (int64_t j = 0; j < topk_len; ++j) {
      const int32_t l = prefill_local.row(p)[j];
      if (l < 0 || l >= entries) {
        return invalid_argument("prefill_local[", p, "][", j, "] (token ", t, ", position ",
                                tw->pos, "): expected a local compressed index in [0, ", entries,
                                ") inside the first topk_len = ", topk_len, " entries, got ", l);
      }
    }
  }
  return Status::Ok();
}

}  // namespace sparse_swa::detail
