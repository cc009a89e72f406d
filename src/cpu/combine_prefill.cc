// FlashMLA sparse prefill: workspace-relative rows (compressed top-k then SWA) of one chunk.
#include <algorithm>
#include <limits>
#include <vector>

#include "common/int_limits.h"
#include "cpu/consumers_internal.h"

namespace sparse_swa {

namespace {

constexpr int64_t kPrefillTopkAlignment = 128;  // FlashMLA prefill: topk % B_TOPK == 0

// Checks the chunk against the host lens of the metadata and resolves its token range.
StatusOr<detail::CombineChunk> resolve_chunk(const SwaMetadata& md, const ChunkPlanEntry& chunk,
                                             int32_t ratio, int32_t topk) {
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

// The position-derived part of a row, checked against the chunk (host arrays).
struct CombineRow {
  int32_t b = 0;  // request index inside the chunk
  int32_t pos = 0;
  int32_t seq_len = 0;
  int32_t gather_start = 0;       // first gathered position
  formulas::Window window{0, 0};  // clamped to [gather_start, seq_len)
};

StatusOr<CombineRow> combine_row(const ConsumerStep& step, const detail::CombineChunk& c,
                                 int32_t t) {
  const SwaMetadata& md = step.md;
  auto tw = detail::host_token_window(step, t, md.has_image());
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

StatusOr<CombinedPrefillShape> combined_prefill_shape(const SwaMetadata& md,
                                                      const ChunkPlanEntry& chunk,
                                                      int32_t prefill_topk) {
  if (prefill_topk < 0) {
    return invalid_argument("prefill_topk: expected >= 0, got ", prefill_topk);
  }
  // The ratio only matters for checks that need the top-k; use the loosest one here.
  auto c = resolve_chunk(md, chunk, prefill_topk > 0 ? 128 : 1, prefill_topk);
  SPARSE_SWA_RETURN_IF_ERROR(c.status());
  CombinedPrefillShape s;
  s.rows = c->rows;
  s.width = static_cast<int32_t>(
      formulas::round_up(int64_t{prefill_topk} + md.prefill_swa.width, kPrefillTopkAlignment));
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
#if SPARSE_SWA_HAS_CUDA
    return detail::cuda_build_combined_prefill(step, c.value(), prefill_local, out, cuda_stream);
#else
    return unavailable("build_combined_prefill: device views need the CUDA backend");
#endif
  }
  (void)cuda_stream;

  std::vector<CombineRow> rows(c->rows);
  for (int32_t i = 0; i < c->rows; ++i) {  // checks first: nothing is written on error
    const int32_t t = c->first_token + i;
    if (!md.is_valid_token[t]) continue;
    auto row = combine_row(step, c.value(), t);
    SPARSE_SWA_RETURN_IF_ERROR(row.status());
    rows[i] = row.value();
  }
  const int32_t n = c->compressed_width, m = c->total_width;
  for (int32_t i = 0; i < c->rows; ++i) {
    const int32_t t = c->first_token + i;
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
  const int32_t td = md.num_decode_tokens;
  for (int32_t p = 0; p < md.num_prefill_tokens; ++p) {
    const int32_t t = td + p;
    if (!md.is_valid_token[t]) continue;
    auto tw = detail::host_token_window(step, t, false);
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

}  // namespace sparse_swa
