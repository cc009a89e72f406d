// SPDX-License-Identifier: Apache-2.0
#include "metadata_invariants.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <set>
#include <sstream>

namespace sparse_swa::fuzz {

namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

template <typename... Parts>
std::string fail(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

// Positions [lo, hi) of one request.
struct Positions {
  int64_t lo = 0;
  int64_t hi = 0;
};

// The KV slot of position p of request r: page p / B of the request's block-table row.
int64_t slot_of(const BatchInput& b, int64_t block_size, int64_t r, int64_t p) {
  const int32_t* row = b.block_table.data + r * b.block_table.stride;
  return int64_t{row[p / block_size]} * block_size + p % block_size;
}

// In-image (left, right) counts of position pos: the span of request r that contains it.
void visibility(const BatchInput& b, int64_t mi, int64_t r, int64_t pos, int64_t* left,
                int64_t* right) {
  *left = 0;
  *right = 0;
  for (const ImageSpan& s : b.image_spans) {
    if (s.request == r && s.start <= pos && pos <= s.end) {
      *left = std::min<int64_t>(pos - s.start, mi - 1);
      *right = std::min<int64_t>(s.end - pos, mi);
    }
  }
}

// One row of a view: lens in [0, width]; invalid -> lens 0 and all -1; valid -> the window's
// slot ids in position order, then -1.
std::string check_row(const char* what, int64_t i, const int32_t* row, int32_t width, int32_t len,
                      bool valid, const BatchInput& b, int64_t block_size, int64_t r,
                      Positions window) {
  if (len < 0 || len > width) {
    return fail(what, " row ", i, ": lens ", len, " outside [0, width ", width, "]");
  }
  int32_t first_empty = len;
  if (!valid) {
    if (len != 0) return fail(what, " row ", i, ": invalid token with lens ", len);
    first_empty = 0;
  } else {
    const int64_t n = window.hi - window.lo;
    if (n != len) {
      return fail(what, " row ", i, ": lens ", len, ", expected the window [", window.lo, ", ",
                  window.hi, ") of request ", r, " (", n, " positions)");
    }
    for (int32_t j = 0; j < len; ++j) {
      const int64_t expected = slot_of(b, block_size, r, window.lo + j);
      if (expected < 0 || expected > kInt32Max) {
        return fail(what, " row ", i, "[", j, "]: the window reads slot ", expected,
                    ", which is not a valid int32 slot (the batch should have been rejected)");
      }
      if (row[j] != expected) {
        return fail(what, " row ", i, "[", j, "]: got ", row[j], ", expected slot ", expected,
                    " of position ", window.lo + j, " of request ", r);
      }
    }
  }
  for (int32_t j = first_empty; j < width; ++j) {
    if (row[j] != -1) {
      return fail(what, " row ", i, "[", j, "]: got ", row[j], " past lens ", len, ", expected -1");
    }
  }
  return "";
}

std::set<std::string> expected_layer_names(const BuilderConfig& c) {
  std::set<std::string> names;
  const std::vector<int32_t> ratios =
      c.compress_ratios.empty() ? std::vector<int32_t>{1} : c.compress_ratios;
  for (int32_t r : ratios) {
    names.insert(r == 1 ? "swaonly" : r == 2 ? "c2a" : r == 4 ? "c4a" : "c128a");
  }
  return names;
}

}  // namespace

std::string check_metadata(const BuilderConfig& config, const BatchInput& b, const SwaMetadata& md,
                           bool after_draft_update) {
  const int64_t num_reqs = static_cast<int64_t>(b.seq_lens.size());
  const int64_t num_tokens = static_cast<int64_t>(b.slot_mapping.size());
  const int64_t w = config.window_size, bs = config.block_size;
  // A builder that does not widen image spans ignores them
  // (docs/semantics.md#image-widening-switch).
  const int64_t mi = config.widen_image_spans ? config.max_image_tokens : 0;
  // k mask slots more for parallel drafting on model runner V1
  // (docs/semantics.md#decode-threshold).
  const int64_t k = config.num_speculative_tokens;
  const int64_t theta = 1 + k + (config.parallel_drafting && !config.model_runner_v2 ? k : 0);
  auto replay = [&](int64_t r) -> int64_t {
    return b.replay_start.empty() ? 0 : b.replay_start[r];
  };
  const auto& qsl = b.query_start_loc;
  auto query_len = [&](int64_t r) { return int64_t{qsl[r + 1]} - qsl[r]; };

  if (md.space != MemorySpace::kHost) return "metadata: expected host views";
  if (md.num_reqs != num_reqs || md.num_tokens != num_tokens) {
    return fail("metadata: ", md.num_reqs, " requests / ", md.num_tokens, " tokens, expected ",
                num_reqs, " / ", num_tokens);
  }
  if (md.causal != b.causal) return "metadata.causal differs from batch.causal";
  if (md.window_size != w || md.max_model_len != config.max_model_len ||
      md.max_num_batched_tokens != config.max_num_batched_tokens) {
    return "metadata: chunk-plan constants differ from the config";
  }

  // Split (docs/semantics.md#decode-and-prefill-split): requests before the first one with
  // query_len > theta are decodes.
  int64_t first_prefill = num_reqs, max_query_len = 0;
  for (int64_t r = 0; r < num_reqs; ++r) {
    max_query_len = std::max(max_query_len, query_len(r));
    if (first_prefill == num_reqs && query_len(r) > theta) first_prefill = r;
  }
  const int64_t td = first_prefill == num_reqs ? num_tokens : qsl[first_prefill];
  const int64_t tp = num_tokens - td;
  if (md.num_decodes != first_prefill || md.num_prefills != num_reqs - first_prefill ||
      md.num_decode_tokens != td || md.num_prefill_tokens != tp) {
    return fail("split: got ", md.num_decodes, "/", md.num_prefills, " requests, ",
                md.num_decode_tokens, "/", md.num_prefill_tokens, " tokens; expected ",
                first_prefill, "/", num_reqs - first_prefill, ", ", td, "/", tp,
                " (theta = ", theta, ")");
  }
  if (md.max_decode_query_len != std::min(max_query_len, theta)) {
    return fail("max_decode_query_len: got ", md.max_decode_query_len, ", expected min(",
                max_query_len, ", ", theta, ")");
  }

  // Token mapping and validity (docs/semantics.md#token-mapping-and-validity).
  if (md.token_to_req_indices.size() != static_cast<size_t>(num_tokens) ||
      md.is_valid_token.size() != static_cast<size_t>(num_tokens)) {
    return "token_to_req_indices / is_valid_token: wrong size";
  }
  // Padding tokens map to request 0; after a draft update the decode ones to the last request.
  std::vector<int64_t> request(num_tokens, 0);
  for (int64_t t = 0; after_draft_update && num_reqs > 0 && t < md.num_decode_tokens; ++t) {
    request[t] = num_reqs - 1;
  }
  for (int64_t r = 0; r < num_reqs; ++r) {
    for (int64_t t = qsl[r]; t < qsl[r + 1]; ++t) request[t] = r;
  }
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (md.token_to_req_indices[t] != request[t]) {
      return fail("token_to_req_indices[", t, "]: got ", md.token_to_req_indices[t], ", expected ",
                  request[t]);
    }
    if ((md.is_valid_token[t] != 0) != (b.slot_mapping[t] >= 0)) {
      return fail("is_valid_token[", t, "]: disagrees with slot_mapping ", b.slot_mapping[t]);
    }
  }

  // Shapes: causal decode rows are W wide; non-causal rows hold min(prefix, W) + ql <= W + theta.
  const ConstIndexView& dec = md.decode_swa;
  const ConstIndexView& pre = md.prefill_swa;
  if (dec.rows != td || dec.window != w || dec.row_stride < dec.width || dec.space != md.space) {
    return fail("decode_swa: rows ", dec.rows, " window ", dec.window, " stride ", dec.row_stride,
                ", expected rows ", td, " window ", w);
  }
  if (b.causal ? dec.width != w : dec.width < w + theta) {
    return fail(
        "decode_swa.width: got ", dec.width, " for a ",
        b.causal ? "causal step, expected W = " : "non-causal step, expected >= W + theta = ",
        b.causal ? w : w + theta);
  }
  if (pre.rows != tp || (tp > 0 && pre.width != w + mi) || pre.row_stride < pre.width) {
    return fail("prefill_swa: rows ", pre.rows, " width ", pre.width, ", expected rows ", tp,
                " width W + Mi = ", w + mi);
  }
  const bool image = mi > 0 && tp > 0 && !b.image_spans.empty();
  if (md.has_image() != image) return fail("has_image: got ", md.has_image(), ", expected ", image);
  if (image && (md.left_visible.size() != static_cast<size_t>(num_tokens) ||
                md.right_visible.size() != static_cast<size_t>(num_tokens))) {
    return "left_visible / right_visible: wrong size";
  }

  // Rows (docs/semantics.md#causal-rows, #dspark-non-causal-rows).
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t r = request[t];
    const bool valid = b.slot_mapping[t] >= 0;
    const int64_t ql = num_reqs > 0 ? query_len(r) : 0;
    const int64_t prefix = num_reqs > 0 ? b.seq_lens[r] - ql : 0;
    const int64_t pos = num_reqs > 0 ? prefix + (t - qsl[r]) : 0;
    int64_t left = 0, right = 0;
    if (image && t >= td) visibility(b, mi, r, pos, &left, &right);
    if (image && (md.left_visible[t] != left || md.right_visible[t] != right)) {
      return fail("left/right_visible[", t, "]: got ", md.left_visible[t], "/", md.right_visible[t],
                  ", expected ", left, "/", right);
    }
    Positions window;  // read only for valid tokens, which always belong to a request
    if (valid && t < td && !b.causal) {
      window = {std::max<int64_t>(prefix - w, 0), b.seq_lens[r]};  // ignores replay_start
    } else if (valid) {
      window = {std::max({std::min(pos - (w - 1), pos - left), int64_t{0}, replay(r)}),
                pos + right + 1};
    }
    if (valid && (window.hi > b.seq_lens[r] || window.lo < 0)) {
      return fail("token ", t, ": window [", window.lo, ", ", window.hi,
                  ") is outside the request (the batch should have been rejected)");
    }
    std::string err = t < td ? check_row("decode_swa", t, dec.row(t), dec.width, dec.lens[t], valid,
                                         b, bs, r, window)
                             : check_row("prefill_swa", t - td, pre.row(t - td), pre.width,
                                         pre.lens[t - td], valid, b, bs, r, window);
    if (!err.empty()) return err;
  }

  // Gather lens (docs/semantics.md#gather-lengths) and the host copies of the chunk planner.
  const int64_t rp = num_reqs - first_prefill;
  if (md.prefill_gather_lens.size() != static_cast<size_t>(rp) ||
      md.prefill_seq_lens_host.size() != static_cast<size_t>(rp) ||
      md.prefill_query_lens_host.size() != static_cast<size_t>(rp)) {
    return "prefill_gather_lens / prefill_*_host: wrong size";
  }
  for (int64_t p = 0; p < rp; ++p) {
    const int64_t r = first_prefill + p;
    const int64_t ql = query_len(r);
    const int64_t visible = std::max<int64_t>(b.seq_lens[r] - ql - replay(r), 0);
    const int64_t expected = ql + std::min<int64_t>(visible, w - 1);
    if (md.prefill_gather_lens[p] != expected || md.prefill_seq_lens_host[p] != b.seq_lens[r] ||
        md.prefill_query_lens_host[p] != ql) {
      return fail("prefill request ", p, ": gather len ", md.prefill_gather_lens[p], ", expected ",
                  expected);
    }
  }

  // replay_start (docs/semantics.md#bounded-replay): the batch's, or zeros.
  if (md.replay_start.size() != static_cast<size_t>(num_reqs) ||
      md.replay_start_given != !b.replay_start.empty()) {
    return "replay_start: wrong size or presence";
  }
  for (int64_t r = 0; r < num_reqs; ++r) {
    if (md.replay_start[r] != replay(r))
      return fail("replay_start[", r, "]: got ", md.replay_start[r]);
  }
  // FlashInfer decode lens (docs/semantics.md#flashinfer-decode-lens).
  const bool fi = config.flashinfer_decode_lens && !b.causal && td > 0;
  if (md.has_flashinfer_decode_lens() != fi) return "flashinfer decode lens: wrong presence";
  for (int64_t t = 0; fi && t < td; ++t) {
    const int64_t seq = num_reqs > 0 ? b.seq_lens[request[t]] : 0;
    if (md.flashinfer_decode_topk_lens[t] != std::max<int64_t>(dec.lens[t], w) ||
        md.flashinfer_decode_seq_lens[t] != seq) {
      return fail("flashinfer decode lens of token ", t);
    }
  }

  // Tile schedulers (docs/semantics.md#step-scalars): the config's layer types when there are
  // decode tokens.
  const std::vector<std::string> names = md.tile_schedulers.sorted_names();
  const std::set<std::string> expected =
      td > 0 ? expected_layer_names(config) : std::set<std::string>{};
  if (std::set<std::string>(names.begin(), names.end()) != expected ||
      names.size() != expected.size()) {
    return "tile_schedulers: wrong layer types";
  }
  return "";
}

std::string check_chunk_plan(const SwaMetadata& md, int64_t ratio, int64_t chunk_size,
                             bool has_compressed, const std::vector<ChunkPlanEntry>& plan) {
  const int64_t n = md.num_prefills;
  if (n == 0) return plan.empty() ? "" : "chunk plan: entries without prefill requests";
  const int64_t w = md.window_size;
  // 128-bit: the budget is a product of caller-chosen values.
  const __int128 area = static_cast<__int128>(chunk_size) *
                        ((has_compressed ? (md.max_model_len + ratio - 1) / ratio : 0) + w +
                         md.max_num_batched_tokens);
  std::vector<int64_t> comp(n), gather(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t seq = md.prefill_seq_lens_host[i], ql = md.prefill_query_lens_host[i];
    comp[i] = has_compressed ? seq / ratio : 0;
    gather[i] = ql + std::clamp<int64_t>(seq - ql, 0, w - 1);
  }
  int64_t start = 0;
  for (size_t k = 0; k < plan.size(); ++k) {
    const ChunkPlanEntry& e = plan[k];
    if (e.start != start || e.end <= e.start || e.end > n) {
      return fail("chunk plan[", k, "]: [", e.start, ", ", e.end, ") does not continue at ", start,
                  " inside ", n, " prefill requests");
    }
    int64_t max_comp = 0, max_gather = 0;
    for (int64_t i = e.start; i < e.end; ++i) {
      max_comp = std::max(max_comp, comp[i]);
      max_gather = std::max(max_gather, gather[i]);
    }
    if (e.compressed_width != max_comp || e.total_width != max_comp + max_gather) {
      return fail("chunk plan[", k, "]: N, M = ", e.compressed_width, ", ", e.total_width,
                  ", expected ", max_comp, ", ", max_comp + max_gather);
    }
    const int64_t count = e.end - e.start;
    if (count > 1 && static_cast<__int128>(count) * (max_comp + max_gather) > area) {
      return fail("chunk plan[", k, "]: ", count, " requests exceed the area budget");
    }
    if (e.end < n) {
      const int64_t next = std::max(max_comp, comp[e.end]) + std::max(max_gather, gather[e.end]);
      if (static_cast<__int128>(count + 1) * next <= area) {
        return fail("chunk plan[", k, "]: request ", e.end, " still fits the area budget");
      }
    }
    start = e.end;
  }
  if (start != n) return fail("chunk plan: covers ", start, " of ", n, " prefill requests");
  return "";
}

MetadataCopy copy_metadata(const SwaMetadata& md) {
  MetadataCopy c;
  auto& v = c.ints;
  v = {md.causal,           md.num_reqs,          md.num_tokens,         md.num_decodes,
       md.num_prefills,     md.num_decode_tokens, md.num_prefill_tokens, md.max_decode_query_len,
       md.decode_swa.width, md.prefill_swa.width, md.has_image()};
  auto add_view = [&](const ConstIndexView& view) {
    for (int64_t i = 0; i < view.rows; ++i) {
      v.insert(v.end(), view.row(i), view.row(i) + view.width);
      v.push_back(view.lens[i]);
    }
  };
  add_view(md.decode_swa);
  add_view(md.prefill_swa);
  v.insert(v.end(), md.token_to_req_indices.begin(), md.token_to_req_indices.end());
  v.insert(v.end(), md.is_valid_token.begin(), md.is_valid_token.end());
  v.insert(v.end(), md.left_visible.begin(), md.left_visible.end());
  v.insert(v.end(), md.right_visible.begin(), md.right_visible.end());
  v.insert(v.end(), md.prefill_gather_lens.begin(), md.prefill_gather_lens.end());
  for (const std::string& name : md.tile_schedulers.sorted_names()) v.push_back(name.size());
  return c;
}

}  // namespace sparse_swa::fuzz
