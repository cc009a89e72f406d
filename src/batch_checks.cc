// SPDX-License-Identifier: Apache-2.0
#include "batch_checks.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "common/swa_formulas.h"

namespace sparse_swa::detail {

namespace {

// The smallest and largest query length of a step's requests.
struct QueryLengthRange {
  int32_t min = std::numeric_limits<int32_t>::max();
  int32_t max = 0;
};

// The split, given the range of the query lengths: a decode-only step needs nothing more, else
// one scalar pass finds the first prefill.
StepSplit split_from_range(std::span<const int32_t> qsl, int32_t num_tokens, int32_t theta,
                           QueryLengthRange range) {
  StepSplit s;
  const int32_t num_reqs = static_cast<int32_t>(qsl.size()) - 1;
  s.max_query_len = range.max;
  // Requests before the first one with query_len > theta are decodes (the reference's
  // max_query_len <= theta shortcut gives the same answer).
  int32_t first_prefill = num_reqs;
  if (range.max > theta) {
    range = QueryLengthRange{};
    for (first_prefill = 0; first_prefill < num_reqs; ++first_prefill) {
      const int32_t ql = qsl[first_prefill + 1] - qsl[first_prefill];
      if (ql > theta) break;
      range.min = std::min(range.min, ql);
      range.max = std::max(range.max, ql);
    }
  }
  s.num_decodes = first_prefill;
  s.num_prefills = num_reqs - first_prefill;
  s.num_decode_tokens = first_prefill == num_reqs ? num_tokens : qsl[first_prefill];
  s.num_prefill_tokens = num_tokens - s.num_decode_tokens;
  s.decode_query_len = first_prefill > 0 && range.min == range.max ? range.max : 0;
  return s;
}

// Both passes below are the host's per-request work on every step: 32-bit lanes, no branches,
// and on x86-64 an AVX2 clone chosen at load time when the CPU has it.
// (Not in sanitizer builds, where the clones' load-time resolver runs before the runtime.)
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SPARSE_SWA_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SPARSE_SWA_SANITIZED 1
#endif
#if defined(__x86_64__) && defined(__linux__) && !defined(SPARSE_SWA_SANITIZED)
#define SPARSE_SWA_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SPARSE_SWA_VECTOR_CLONES
#endif

SPARSE_SWA_VECTOR_CLONES
QueryLengthRange query_length_range(const int32_t* qsl, int32_t num_reqs) {
  QueryLengthRange range;
  for (int32_t r = 0; r < num_reqs; ++r) {
    const int32_t ql = qsl[r + 1] - qsl[r];
    range.min = std::min(range.min, ql);
    range.max = std::max(range.max, ql);
  }
  return range;
}

}  // namespace

StepSplit split_decodes_and_prefills(std::span<const int32_t> qsl, int32_t num_tokens,
                                     int32_t theta) {
  const int32_t num_reqs = static_cast<int32_t>(qsl.size()) - 1;
  return split_from_range(qsl, num_tokens, theta, query_length_range(qsl.data(), num_reqs));
}

std::span<const int32_t> host_query_start_loc(const BatchInput& b) {
  return b.query_start_loc_host.empty() ? b.query_start_loc : b.query_start_loc_host;
}
std::span<const int32_t> host_seq_lens(const BatchInput& b) {
  return b.seq_lens_host.empty() ? b.seq_lens : b.seq_lens_host;
}

namespace {

// One branch-free pass that tells whether any per-request rule below can fail: query_start_loc
// starts at 0 and never decreases, seq_len >= query_len, the table covers seq_len. Valid batches
// (the common case) then skip the detailed checks, which exist to word the error. The same pass
// gives the range of the query lengths, for the split.
struct RequestScan {
  bool plainly_valid;
  QueryLengthRange range;  // the query lengths' when plainly_valid
};

SPARSE_SWA_VECTOR_CLONES
RequestScan scan_requests(const int32_t* qsl, const int32_t* seq, int32_t num_reqs,
                          int32_t covered) {
  // Unsigned differences never overflow, and they are the query lengths whenever the other rules
  // hold (qsl starts at 0 and never decreases).
  int32_t bad = 0;
  QueryLengthRange range;
  for (int32_t r = 0; r < num_reqs; ++r) {
    const uint32_t ql = static_cast<uint32_t>(qsl[r + 1]) - static_cast<uint32_t>(qsl[r]);
    bad |= (qsl[r + 1] < qsl[r]) | (seq[r] < 0) | (static_cast<uint32_t>(seq[r]) < ql) |
           (seq[r] > covered);
    range.min = std::min(range.min, static_cast<int32_t>(ql));
    range.max = std::max(range.max, static_cast<int32_t>(ql));
  }
  return {qsl[0] == 0 && bad == 0, range};
}

Status check_query_start_loc(std::span<const int32_t> qsl, std::string_view name) {
  if (qsl[0] != 0) return invalid_argument(name, "[0]: expected 0, got ", qsl[0]);
  for (size_t i = 1; i < qsl.size(); ++i) {
    if (qsl[i] < qsl[i - 1]) {
      return invalid_argument(name, "[", i, "]: expected >= ", name, "[", i - 1, "] = ", qsl[i - 1],
                              " (non-decreasing), got ", qsl[i]);
    }
  }
  return Status::Ok();
}

Status check_seq_lens(std::span<const int32_t> qsl, std::span<const int32_t> seq_lens,
                      std::string_view name) {
  for (size_t r = 0; r < seq_lens.size(); ++r) {
    const int32_t ql = qsl[r + 1] - qsl[r];
    if (seq_lens[r] < ql) {
      return invalid_argument(name, "[", r, "]: expected >= the query length ", ql,
                              " (seq_len counts context + query tokens), got ", seq_lens[r]);
    }
  }
  return Status::Ok();
}

// A host copy (same size as its array, checked) must hold the array's values.
Status check_host_copy(std::span<const int32_t> copy, std::span<const int32_t> array,
                       std::string_view name) {
  const auto [c, a] = std::mismatch(copy.begin(), copy.end(), array.begin());
  if (c == copy.end()) return Status::Ok();
  const size_t i = static_cast<size_t>(c - copy.begin());
  return invalid_argument(name, "_host[", i, "]: expected ", name, "[", i, "] = ", *a,
                          " (the CPU backend reads both; a host copy must equal its array), got ",
                          *c);
}

}  // namespace

Status check_replay_start(const BatchInput& b) {
  // Called once the arrays passed check_batch: qsl non-decreasing, seq_lens >= query lengths.
  for (size_t r = 0; r < b.replay_start.size(); ++r) {
    const int32_t rs = b.replay_start[r];
    const int32_t ql = b.query_start_loc[r + 1] - b.query_start_loc[r];
    const int32_t prefix = b.seq_lens[r] - ql;
    if (rs < 0) {
      return invalid_argument("batch.replay_start[", r,
                              "]: expected >= 0 (the first position with window KV), got ", rs);
    }
    if (rs > prefix) {
      return invalid_argument("batch.replay_start[", r,
                              "]: expected <= the request's prefix seq_lens[", r,
                              "] - query_len = ", b.seq_lens[r], " - ", ql, " = ", prefix,
                              " (replay starts inside the cached context), got ", rs);
    }
  }
  return Status::Ok();
}

Status check_batch_shape(const BuilderConfig& config, const DerivedConfig& derived,
                         const BatchInput& b) {
  const int64_t num_reqs = static_cast<int64_t>(b.seq_lens.size());
  const int64_t num_tokens = static_cast<int64_t>(b.slot_mapping.size());
  if (num_reqs > config.max_num_seqs) {
    return invalid_argument("batch.seq_lens: expected at most max_num_seqs = ", config.max_num_seqs,
                            " requests, got ", num_reqs);
  }
  if (static_cast<int64_t>(b.query_start_loc.size()) != num_reqs + 1) {
    return invalid_argument("batch.query_start_loc: expected num_reqs + 1 = ", num_reqs + 1,
                            " entries (num_reqs = len(seq_lens)), got ", b.query_start_loc.size());
  }
  if (!b.query_start_loc_host.empty() &&
      static_cast<int64_t>(b.query_start_loc_host.size()) != num_reqs + 1) {
    return invalid_argument("batch.query_start_loc_host: expected ", num_reqs + 1, " entries, got ",
                            b.query_start_loc_host.size());
  }
  if (!b.seq_lens_host.empty() && static_cast<int64_t>(b.seq_lens_host.size()) != num_reqs) {
    return invalid_argument("batch.seq_lens_host: expected ", num_reqs, " entries, got ",
                            b.seq_lens_host.size());
  }
  if (num_tokens > config.max_num_batched_tokens) {
    return invalid_argument("batch.slot_mapping: expected at most max_num_batched_tokens = ",
                            config.max_num_batched_tokens, " tokens, got ", num_tokens);
  }
  const auto& bt = b.block_table;
  if (bt.rows < num_reqs) {
    return invalid_argument("batch.block_table: expected at least num_reqs = ", num_reqs,
                            " rows, got ", bt.rows);
  }
  if (bt.cols < 0 || bt.stride < bt.cols) {
    return invalid_argument("batch.block_table: expected 0 <= cols <= stride, got cols ", bt.cols,
                            ", stride ", bt.stride);
  }
  if (num_reqs > 0 && bt.cols > 0 && bt.data == nullptr) {
    return invalid_argument("batch.block_table: null data for ", num_reqs, " requests");
  }
  if (!b.replay_start.empty() && static_cast<int64_t>(b.replay_start.size()) != num_reqs) {
    return invalid_argument("batch.replay_start: expected num_reqs = ", num_reqs,
                            " entries (one per request; empty for no replay), got ",
                            b.replay_start.size());
  }
  if (!b.causal && !derived.is_dspark) {
    return invalid_argument(
        "batch.causal: false (non-causal rows) needs speculative_method "
        "dspark, got ",
        speculative_method_name(config.speculative_method));
  }
  return Status::Ok();
}

Status check_batch(const BuilderConfig& config, const DerivedConfig& derived, const BatchInput& b,
                   bool arrays_on_host, StepSplit* split) {
  SPARSE_SWA_RETURN_IF_ERROR(check_batch_shape(config, derived, b));
  const int64_t num_reqs = static_cast<int64_t>(b.seq_lens.size());
  const int64_t num_tokens = static_cast<int64_t>(b.slot_mapping.size());
  const auto qsl = host_query_start_loc(b);
  const auto seq = host_seq_lens(b);
  const bool has_host_copies = !b.query_start_loc_host.empty();
  const auto& bt = b.block_table;
  // Positions the table covers; compared without a division per request (hot path).
  // Columns past int32 cover every seq_len; capped so that the product cannot overflow.
  const int64_t covered = std::min<int64_t>(bt.cols, INT32_MAX) * config.block_size;
  const RequestScan scan =
      scan_requests(qsl.data(), seq.data(), static_cast<int32_t>(num_reqs),
                    static_cast<int32_t>(std::min<int64_t>(covered, INT32_MAX)));
  const bool plainly_valid = scan.plainly_valid;
  if (!plainly_valid) {
    SPARSE_SWA_RETURN_IF_ERROR(check_query_start_loc(
        qsl, has_host_copies ? "batch.query_start_loc_host" : "batch.query_start_loc"));
  }
  if (qsl[num_reqs] > num_tokens) {
    return invalid_argument("batch.slot_mapping: expected at least query_start_loc[", num_reqs,
                            "] = ", qsl[num_reqs], " tokens, got ", num_tokens);
  }
  if (!plainly_valid) {
    SPARSE_SWA_RETURN_IF_ERROR(check_seq_lens(
        qsl, seq, !b.seq_lens_host.empty() ? "batch.seq_lens_host" : "batch.seq_lens"));
    for (int64_t r = 0; r < num_reqs; ++r) {
      if (seq[r] <= covered) continue;
      const int64_t needed = formulas::ceil_div(seq[r], config.block_size);
      return invalid_argument("batch.block_table[", r, "]: expected at least ceil(seq_lens[", r,
                              "] / block_size) = ceil(", seq[r], " / ", config.block_size,
                              ") = ", needed, " entries, got ", bt.cols);
    }
  }
  if (split != nullptr) {
    const int32_t tokens = static_cast<int32_t>(num_tokens);
    *split = plainly_valid ? split_from_range(qsl, tokens, derived.decode_threshold, scan.range)
                           : split_decodes_and_prefills(qsl, tokens, derived.decode_threshold);
  }
  if (!arrays_on_host) return Status::Ok();
  // CPU backend: the arrays themselves are host memory and are what the rows are built from,
  // while the split and the chunk plan come from the host copies: a copy must equal its array
  // (which the checks above then cover as well).
  if (has_host_copies) {
    SPARSE_SWA_RETURN_IF_ERROR(
        check_host_copy(b.query_start_loc_host, b.query_start_loc, "batch.query_start_loc"));
  }
  if (!b.seq_lens_host.empty()) {
    SPARSE_SWA_RETURN_IF_ERROR(check_host_copy(b.seq_lens_host, b.seq_lens, "batch.seq_lens"));
  }
  SPARSE_SWA_RETURN_IF_ERROR(check_replay_start(b));
  const int32_t num_real = b.query_start_loc[num_reqs];
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t s = b.slot_mapping[t];
    if (s < -1) {
      return invalid_argument("batch.slot_mapping[", t,
                              "]: expected a slot >= 0 or -1 (padding), got ", s);
    }
    if (t >= num_real && s != -1) {
      return invalid_argument("batch.slot_mapping[", t, "]: token ", t,
                              " is CUDA-graph padding (past query_start_loc[", num_reqs,
                              "] = ", num_real, ") and must be -1, got ", s);
    }
  }
  return Status::Ok();
}

Status build_span_csr(std::span<const ImageSpan> spans, std::span<const int32_t> seq_lens,
                      int32_t max_image_tokens, SpanCsr* csr) {
  const int32_t num_reqs = static_cast<int32_t>(seq_lens.size());
  csr->count = 0;
  if (spans.empty()) return Status::Ok();
  if (max_image_tokens == 0) {
    return invalid_argument(
        "batch.image_spans: the config has max_image_tokens = 0 (a text "
        "model), so no image span is accepted; got ",
        spans.size());
  }
  if (static_cast<int64_t>(spans.size()) > csr->capacity) {
    return invalid_argument("batch.image_spans: expected at most ", csr->capacity,
                            " spans (max_num_batched_tokens), got ", spans.size());
  }
  for (size_t i = 0; i < spans.size(); ++i) {
    const ImageSpan& s = spans[i];
    if (s.request < 0 || s.request >= num_reqs) {
      return invalid_argument("batch.image_spans[", i, "].request: expected 0..", num_reqs - 1,
                              " (an existing request), got ", s.request);
    }
    if (s.start < 0 || s.end < s.start) {
      return invalid_argument("batch.image_spans[", i, "]: expected 0 <= start <= end, got [",
                              s.start, ", ", s.end, "]");
    }
    if (s.end >= seq_lens[s.request]) {
      return invalid_argument("batch.image_spans[", i, "]: expected end < seq_lens[", s.request,
                              "] = ", seq_lens[s.request], ", got [", s.start, ", ", s.end, "]");
    }
    const int64_t length = int64_t{s.end} - s.start + 1;
    if (length > max_image_tokens) {
      return invalid_argument("batch.image_spans[", i,
                              "]: expected at most max_image_tokens = ", max_image_tokens,
                              " tokens, got ", length, " ([", s.start, ", ", s.end, "])");
    }
  }
  // Counting sort by request, then by start within a request.
  std::fill(csr->indptr, csr->indptr + num_reqs + 1, 0);
  for (const ImageSpan& s : spans) ++csr->indptr[s.request + 1];
  for (int32_t r = 0; r < num_reqs; ++r) csr->indptr[r + 1] += csr->indptr[r];
  // Scatter span indices into `ends` with indptr as the cursor, then shift indptr back.
  for (size_t i = 0; i < spans.size(); ++i) {
    csr->ends[csr->indptr[spans[i].request]++] = static_cast<int32_t>(i);
  }
  for (int32_t r = num_reqs; r > 0; --r) csr->indptr[r] = csr->indptr[r - 1];
  csr->indptr[0] = 0;
  for (int32_t r = 0; r < num_reqs; ++r) {
    std::sort(csr->ends + csr->indptr[r], csr->ends + csr->indptr[r + 1],
              [&](int32_t a, int32_t b) { return spans[a].start < spans[b].start; });
    for (int32_t k = csr->indptr[r] + 1; k < csr->indptr[r + 1]; ++k) {
      const ImageSpan& prev = spans[csr->ends[k - 1]];
      const ImageSpan& cur = spans[csr->ends[k]];
      if (cur.start <= prev.end) {
        return invalid_argument("batch.image_spans[", csr->ends[k], "]: overlaps span [",
                                prev.start, ", ", prev.end, "] of request ", r, ", got [",
                                cur.start, ", ", cur.end, "]");
      }
    }
  }
  for (size_t k = 0; k < spans.size(); ++k) {
    const ImageSpan& s = spans[csr->ends[k]];
    csr->starts[k] = s.start;
  }
  for (size_t k = 0; k < spans.size(); ++k) csr->ends[k] = spans[csr->ends[k]].end;
  csr->count = static_cast<int32_t>(spans.size());
  return Status::Ok();
}

SwaMetadata step_metadata_scalars(const BuilderConfig& config, const DerivedConfig& derived,
                                  const BatchInput& batch, const StepSplit& split,
                                  MemorySpace space) {
  SwaMetadata md;
  md.space = space;
  md.causal = batch.causal;
  md.replay_start_given = !batch.replay_start.empty();
  md.num_reqs = batch.num_reqs();
  md.num_tokens = batch.num_tokens();
  md.num_decodes = split.num_decodes;
  md.num_prefills = split.num_prefills;
  md.num_decode_tokens = split.num_decode_tokens;
  md.num_prefill_tokens = split.num_prefill_tokens;
  md.max_decode_query_len = std::min(split.max_query_len, derived.decode_threshold);
  md.window_size = config.window_size;
  md.max_model_len = config.max_model_len;
  md.max_num_batched_tokens = config.max_num_batched_tokens;
  if (split.num_decode_tokens > 0) md.tile_schedulers = derived.layer_types;
  return md;
}

void fill_prefill_host_plan(const BatchInput& batch, const StepSplit& split, int32_t* seq_lens,
                            int32_t* query_lens) {
  const auto qsl = host_query_start_loc(batch);
  const auto seq = host_seq_lens(batch);
  for (int32_t p = 0; p < split.num_prefills; ++p) {
    const int32_t r = split.num_decodes + p;
    seq_lens[p] = seq[r];
    query_lens[p] = qsl[r + 1] - qsl[r];
  }
}

Status check_draft_update_target(const SwaMetadata* md, const DraftUpdateRecord& last,
                                 MemorySpace space, const BatchInput& batch) {
  if (md == nullptr) {
    return invalid_argument("metadata: expected the last build's metadata, got null");
  }
  if (last.decode_rows == nullptr || md->decode_swa.data != last.decode_rows ||
      md->decode_swa.lens != last.decode_lens || md->space != space) {
    return invalid_argument("metadata.decode_swa: expected views from this builder's last build()");
  }
  if (md->num_decode_tokens != last.num_decode_tokens ||
      md->decode_swa.rows != last.num_decode_tokens) {
    return invalid_argument("metadata.num_decode_tokens: expected the last build's ",
                            last.num_decode_tokens, " (decode_swa.rows alike), got ",
                            md->num_decode_tokens, " (decode_swa.rows ", md->decode_swa.rows, ")");
  }
  if (md->decode_swa.width != last.decode_width || md->decode_swa.row_stride != last.decode_width) {
    return invalid_argument("metadata.decode_swa.width: expected the last build's ",
                            last.decode_width, " (row_stride alike), got ", md->decode_swa.width,
                            " (row_stride ", md->decode_swa.row_stride, ")");
  }
  if (batch.num_reqs() != last.num_reqs || batch.num_tokens() != last.num_tokens) {
    return invalid_argument("batch: expected the shape of the last build (", last.num_reqs,
                            " requests, ", last.num_tokens, " tokens), got ", batch.num_reqs(),
                            " requests, ", batch.num_tokens(), " tokens");
  }
  return Status::Ok();
}

Status check_draft_update_batch(const BuilderConfig& config, const DerivedConfig& derived,
                                const BatchInput& b, bool arrays_on_host) {
  SPARSE_SWA_RETURN_IF_ERROR(check_batch_shape(config, derived, b));
  if (!arrays_on_host) return Status::Ok();
  BatchInput arrays = b;
  arrays.query_start_loc_host = {};
  arrays.seq_lens_host = {};
  return check_batch(config, derived, arrays, /*arrays_on_host=*/true);
}

void OwnedBuffers::add(const void* data, size_t bytes, const char* name) {
  if (data == nullptr || bytes == 0) return;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  ranges_.push_back({begin, begin + bytes, name});
}

void OwnedBuffers::seal() {
  std::sort(ranges_.begin(), ranges_.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
}

const char* OwnedBuffers::overlapping(const void* data, size_t bytes) const {
  if (data == nullptr || bytes == 0) return nullptr;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t end = bytes > UINTPTR_MAX - begin ? UINTPTR_MAX : begin + bytes;
  // The first range ending past `begin` is the only one that can start before `end`.
  const auto it = std::upper_bound(ranges_.begin(), ranges_.end(), begin,
                                   [](uintptr_t at, const Range& r) { return at < r.end; });
  return it != ranges_.end() && it->begin < end ? it->name : nullptr;
}

namespace {

// Bytes from block_table.data to the end of row num_reqs - 1 (what the builder reads), saturated.
size_t block_table_extent(const MatrixView<const int32_t>& bt, int64_t num_reqs) {
  const int64_t rows = std::min(bt.rows, num_reqs);
  if (rows <= 0 || bt.cols <= 0) return 0;
  constexpr uint64_t kLimit = SIZE_MAX / sizeof(int32_t);
  const uint64_t cols = static_cast<uint64_t>(bt.cols);
  const uint64_t stride = static_cast<uint64_t>(std::max(bt.stride, bt.cols));
  const uint64_t rest = static_cast<uint64_t>(rows - 1);
  if (cols > kLimit || (rest != 0 && stride > (kLimit - cols) / rest)) return SIZE_MAX;
  return (rest * stride + cols) * sizeof(int32_t);
}

}  // namespace

Status check_batch_outside(const BatchInput& b, const OwnedBuffers& owned) {
  auto outside = [&](const char* field, const void* data, size_t bytes) {
    const char* name = owned.overlapping(data, bytes);
    if (name == nullptr) return Status::Ok();
    return invalid_argument(field,
                            ": expected memory outside the builder's own buffers, got an array "
                            "overlapping its ",
                            name, " (an output of a build; pass a copy)");
  };
  SPARSE_SWA_RETURN_IF_ERROR(
      outside("batch.query_start_loc", b.query_start_loc.data(), b.query_start_loc.size_bytes()));
  SPARSE_SWA_RETURN_IF_ERROR(outside("batch.seq_lens", b.seq_lens.data(), b.seq_lens.size_bytes()));
  SPARSE_SWA_RETURN_IF_ERROR(outside("batch.block_table", b.block_table.data,
                                     block_table_extent(b.block_table, b.seq_lens.size())));
  SPARSE_SWA_RETURN_IF_ERROR(
      outside("batch.slot_mapping", b.slot_mapping.data(), b.slot_mapping.size_bytes()));
  SPARSE_SWA_RETURN_IF_ERROR(outside("batch.query_start_loc_host", b.query_start_loc_host.data(),
                                     b.query_start_loc_host.size_bytes()));
  SPARSE_SWA_RETURN_IF_ERROR(
      outside("batch.seq_lens_host", b.seq_lens_host.data(), b.seq_lens_host.size_bytes()));
  SPARSE_SWA_RETURN_IF_ERROR(
      outside("batch.replay_start", b.replay_start.data(), b.replay_start.size_bytes()));
  return outside("batch.image_spans", b.image_spans.data(), b.image_spans.size_bytes());
}

}  // namespace sparse_swa::detail
