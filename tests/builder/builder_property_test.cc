// SPDX-License-Identifier: Apache-2.0
// Randomized property tests over thousands of seeded batches from RandomBatch (every mode).
// The expectations are recomputed here from the definitions of docs/semantics.md (split to
// step scalars), not with the library's formulas: a linear scan for a token's request, causal
// windows written as [max(min(pos - (W - 1), pos - left), 0, replay_start), pos + right + 1),
// slot ids from the TestBatch's pages. The generator draws replay_start in about a third of the
// batches and frees the pages wholly below it, so a row reaching below replay_start fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "sparse_swa/metadata_builder.h"
#include "support/metadata_snapshot.h"
#include "support/status_matchers.h"
#include "testing/random_batch.h"
#include "testing/test_batch.h"

namespace sparse_swa {
namespace {

using testing::BatchMode;
using testing::RandomBatch;
using testing::RandomCase;
using testing::TestBatch;

constexpr int kNumCases = 4000;

int64_t round_up_64(int64_t x) { return (x + 63) / 64 * 64; }

// The step as the definitions describe it, computed without the library.
struct Model {
  int32_t window = 0, theta = 1, max_image_tokens = 0, prefill_width = 0;
  int32_t num_reqs = 0, num_tokens = 0;
  int32_t num_decodes = 0, num_prefills = 0, num_decode_tokens = 0, num_prefill_tokens = 0;
  int32_t max_decode_query_len = 0;
  bool image_path = false;
  std::vector<int32_t> owner;   // [T]
  std::vector<int32_t> replay;  // [R], zeros when the batch gives none

  Model(const BuilderConfig& c, const TestBatch& b) {
    window = c.window_size;
    // k mask slots more for parallel drafting on model runner V1
    // (docs/semantics.md#decode-threshold).
    const int32_t k = c.num_speculative_tokens;
    theta = 1 + k + (c.parallel_drafting && !c.model_runner_v2 ? k : 0);
    const bool widens = c.widen_image_spans && c.max_image_tokens > 0;
    max_image_tokens = c.max_image_tokens;
    prefill_width = window + (widens ? max_image_tokens : 0);
    replay = b.replay_start.empty() ? std::vector<int32_t>(b.num_reqs(), 0) : b.replay_start;
    num_reqs = b.num_reqs();
    num_tokens = b.num_tokens();
    // Split: requests before the first one with q > theta are decodes
    // (docs/semantics.md#decode-and-prefill-split).
    int32_t first_prefill = num_reqs;
    int32_t max_ql = 0;
    for (int32_t r = 0; r < num_reqs; ++r) {
      max_ql = std::max(max_ql, b.query_len(r));
      if (b.query_len(r) > theta && first_prefill == num_reqs) first_prefill = r;
    }
    num_decodes = first_prefill;
    num_prefills = num_reqs - first_prefill;
    num_decode_tokens = first_prefill < num_reqs ? b.query_start_loc[first_prefill] : num_tokens;
    num_prefill_tokens = num_tokens - num_decode_tokens;
    max_decode_query_len = std::min(max_ql, theta);
    image_path = widens && num_prefill_tokens > 0 && !b.image_spans.empty();
    owner.assign(num_tokens, 0);  // padding tokens map to request 0
    for (int32_t r = 0; r < num_reqs; ++r)
      for (int32_t t = b.query_start_loc[r]; t < b.query_start_loc[r + 1]; ++t) owner[t] = r;
  }

  int32_t position(const TestBatch& b, int32_t t) const {
    const int32_t r = owner[t];
    return b.prefix_len(r) + (t - b.query_start_loc[r]);
  }

  // In-image visibility of prefill token t (docs/semantics.md#image-spans).
  std::pair<int32_t, int32_t> visibility(const TestBatch& b, int32_t t) const {
    if (!image_path || t < num_decode_tokens) return {0, 0};
    const int32_t pos = position(b, t);
    for (const ImageSpan& s : b.image_spans) {
      if (s.request == owner[t] && s.start <= pos && pos <= s.end) {
        return {std::min(pos - s.start, max_image_tokens - 1),
                std::min(s.end - pos, max_image_tokens)};
      }
    }
    return {0, 0};
  }
};

std::vector<std::string> expected_layer_types(const BuilderConfig& c) {
  static const std::map<int32_t, std::string> kNames = {
      {1, "swaonly"}, {2, "c2a"}, {4, "c4a"}, {128, "c128a"}};
  std::vector<std::string> names;
  if (c.compress_ratios.empty()) names.push_back("swaonly");
  for (int32_t r : c.compress_ratios) names.push_back(kNames.at(r));
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

// Checks one row: entries [0, n) are the slots of positions start, start + 1, ... and the
// rest of the width is -1. Returns a description of the first violation.
std::string check_row(const TestBatch& b, int32_t r, const int32_t* row, int32_t width, int32_t len,
                      int32_t start, int32_t n) {
  std::ostringstream os;
  if (len != n) {
    os << "lens " << len << ", expected " << n;
    return os.str();
  }
  if (len < 0 || len > width) {
    os << "lens " << len << " outside [0, width " << width << "]";
    return os.str();
  }
  for (int32_t j = 0; j < width; ++j) {
    const int64_t want = j < n ? b.slot(r, start + j) : -1;
    if (row[j] != want) {
      os << "entry " << j << " = " << row[j] << ", expected " << want
         << (j < n ? " (slot of position " + std::to_string(start + j) + ")" : " (-1 tail)");
      return os.str();
    }
  }
  return "";
}

// flashinfer_decode_topk_lens / _seq_lens (docs/semantics.md#flashinfer-decode-lens): present
// exactly on non-causal steps with decode tokens of a config that asks, max(lens, W) and the
// seq_len of the request `owner` gives each token.
std::string check_flashinfer_lens(const BuilderConfig& c, const TestBatch& b,
                                  const std::vector<int32_t>& owner, const SwaMetadata& md) {
  const int32_t td = md.num_decode_tokens;
  const bool expected = c.flashinfer_decode_lens && !b.causal && td > 0;
  if (md.has_flashinfer_decode_lens() != expected) return "flashinfer lens presence";
  if (!expected) return md.flashinfer_decode_seq_lens.empty() ? "" : "flashinfer seq_lens";
  if (static_cast<int32_t>(md.flashinfer_decode_topk_lens.size()) != td ||
      static_cast<int32_t>(md.flashinfer_decode_seq_lens.size()) != td)
    return "flashinfer lens size";
  for (int32_t t = 0; t < td; ++t) {
    if (md.flashinfer_decode_topk_lens[t] != std::max(md.decode_swa.lens[t], c.window_size))
      return "flashinfer_decode_topk_lens[" + std::to_string(t) + "]";
    const int32_t seq = b.num_reqs() > 0 ? b.seq_lens[owner[t]] : 0;
    if (md.flashinfer_decode_seq_lens[t] != seq)
      return "flashinfer_decode_seq_lens[" + std::to_string(t) + "]";
  }
  return "";
}

std::string check_against_definitions(const RandomCase& c, const SwaMetadata& md) {
  const TestBatch& b = c.batch;
  const Model m(c.config, b);
  const int32_t w = m.window;
  std::ostringstream os;
  auto fail = [&os](auto&&... parts) {
    (os << ... << parts);
    return os.str();
  };

  // Split, scalars and mapping.
  if (md.num_decodes != m.num_decodes || md.num_prefills != m.num_prefills ||
      md.num_decode_tokens != m.num_decode_tokens ||
      md.num_prefill_tokens != m.num_prefill_tokens || md.num_tokens != m.num_tokens ||
      md.num_reqs != m.num_reqs) {
    return fail("split (", md.num_decodes, ",", md.num_prefills, ",", md.num_decode_tokens, ",",
                md.num_prefill_tokens, "), expected (", m.num_decodes, ",", m.num_prefills, ",",
                m.num_decode_tokens, ",", m.num_prefill_tokens, ")");
  }
  if (md.max_decode_query_len != m.max_decode_query_len)
    return fail("max_decode_query_len ", md.max_decode_query_len);
  if (static_cast<int32_t>(md.token_to_req_indices.size()) != m.num_tokens)
    return fail("token_to_req size ", md.token_to_req_indices.size());
  for (int32_t t = 0; t < m.num_tokens; ++t) {
    if (md.token_to_req_indices[t] != m.owner[t])
      return fail("token_to_req[", t, "] = ", md.token_to_req_indices[t], ", expected ",
                  m.owner[t]);
    if (md.is_valid_token[t] != (b.slot_mapping[t] >= 0 ? 1 : 0))
      return fail("is_valid_token[", t, "]");
  }
  const std::vector<std::string> types =
      m.num_decode_tokens > 0 ? expected_layer_types(c.config) : std::vector<std::string>{};
  if (md.tile_schedulers.sorted_names() != types) return fail("tile_schedulers");
  if (md.replay_start_given != !b.replay_start.empty()) return fail("replay_start_given");
  if (testing::to_vector(md.replay_start) != m.replay) return fail("replay_start");

  // Decode rows.
  const int32_t k = c.config.num_speculative_tokens;
  const int32_t wn = static_cast<int32_t>(std::max(round_up_64(w + k), round_up_64(w + m.theta)));
  const int32_t decode_width = b.causal ? w : wn;
  const ConstIndexView& dv = md.decode_swa;
  if (dv.rows != m.num_decode_tokens || dv.width != decode_width || dv.window != w ||
      dv.row_stride < dv.width) {
    return fail("decode view rows ", dv.rows, " width ", dv.width, " window ", dv.window,
                ", expected width ", decode_width);
  }
  std::map<int32_t, std::vector<int32_t>> noncausal_rows;  // request -> its first valid row
  for (int32_t t = 0; t < m.num_decode_tokens; ++t) {
    const int32_t r = m.owner[t];
    const int32_t* row = dv.row(t);
    std::string err;
    if (b.slot_mapping[t] < 0) {
      err = check_row(b, r, row, dv.width, dv.lens[t], 0, 0);
    } else if (b.causal) {
      const int32_t pos = m.position(b, t);
      const int32_t start = std::max({pos - (w - 1), 0, m.replay[r]});
      const int32_t n = pos + 1 - start;
      err = check_row(b, r, row, dv.width, dv.lens[t], start, n);
      if (err.empty() && row[n - 1] != b.slot_mapping[t]) err = "last entry is not the own slot";
    } else {
      const int32_t prefix = b.prefix_len(r);
      const int32_t n = std::min(prefix, w) + b.query_len(r);
      err = check_row(b, r, row, dv.width, dv.lens[t], std::max(prefix - w, 0), n);
      std::vector<int32_t> full(row, row + dv.width);
      auto [it, inserted] = noncausal_rows.emplace(r, full);
      if (err.empty() && !inserted && it->second != full) err = "non-causal rows differ";
      if (err.empty() && row[n - 1] != b.slot(r, b.seq_lens[r] - 1)) err = "misses seq - 1";
    }
    if (!err.empty()) return fail("decode row ", t, " (request ", r, "): ", err);
  }
  if (m.num_decode_tokens > 0) {
    for (int32_t i = m.num_decode_tokens; i < c.config.max_num_batched_tokens; ++i)
      if (dv.lens[i] != 0) return fail("decode_swa_lens[", i, "] = ", dv.lens[i], " past Td");
  }
  const std::string fi = check_flashinfer_lens(c.config, b, m.owner, md);
  if (!fi.empty()) return fail(fi);

  // Prefill rows, visibility and gather lens.
  const ConstIndexView& pv = md.prefill_swa;
  if (pv.rows != m.num_prefill_tokens || pv.width != m.prefill_width || pv.window != w)
    return fail("prefill view rows ", pv.rows, " width ", pv.width);
  if (md.has_image() != m.image_path) return fail("has_image ", md.has_image());
  if (m.image_path && (static_cast<int32_t>(md.left_visible.size()) != m.num_tokens ||
                       static_cast<int32_t>(md.right_visible.size()) != m.num_tokens))
    return fail("visibility size ", md.left_visible.size());
  for (int32_t p = 0; p < m.num_prefill_tokens; ++p) {
    const int32_t t = m.num_decode_tokens + p;
    const int32_t r = m.owner[t];
    const auto [left, right] = m.visibility(b, t);
    if (m.image_path && (md.left_visible[t] != left || md.right_visible[t] != right)) {
      return fail("visibility of token ", t, ": (", md.left_visible[t], ",", md.right_visible[t],
                  "), expected (", left, ",", right, ")");
    }
    std::string err;
    if (b.slot_mapping[t] < 0) {
      err = check_row(b, r, pv.row(p), pv.width, pv.lens[p], 0, 0);
    } else {
      const int32_t pos = m.position(b, t);
      const int32_t start = std::max({std::min(pos - (w - 1), pos - left), 0, m.replay[r]});
      const int32_t end = pos + right + 1;
      err = check_row(b, r, pv.row(p), pv.width, pv.lens[p], start, end - start);
      if (err.empty() && right == 0 && pv.row(p)[end - start - 1] != b.slot_mapping[t])
        err = "last entry is not the own slot";
      if (err.empty() && left == 0 && right == 0 && m.replay[r] == 0 &&
          pv.lens[p] != std::min(pos + 1, w))
        err = "text row lens is not min(pos + 1, W)";
    }
    if (!err.empty()) return fail("prefill row ", p, " (token ", t, ", request ", r, "): ", err);
  }
  for (int32_t t = 0; m.image_path && t < m.num_decode_tokens; ++t)
    if (md.left_visible[t] != 0 || md.right_visible[t] != 0) return fail("decode visibility");
  if (static_cast<int32_t>(md.prefill_gather_lens.size()) != m.num_prefills)
    return fail("gather lens size ", md.prefill_gather_lens.size());
  for (int32_t p = 0; p < m.num_prefills; ++p) {
    const int32_t r = m.num_decodes + p;
    const int32_t gather =
        b.query_len(r) + std::min(std::max(b.prefix_len(r) - m.replay[r], 0), w - 1);
    if (md.prefill_gather_lens[p] != gather)
      return fail("gather_lens[", p, "] = ", md.prefill_gather_lens[p], ", expected ", gather);
    if (md.prefill_seq_lens_host[p] != b.seq_lens[r] ||
        md.prefill_query_lens_host[p] != b.query_len(r))
      return fail("prefill host copies of request ", r);
  }
  for (const Status& st : {check_index_view(dv, "decode_swa"), check_index_view(pv, "prefill_swa")})
    if (!st.ok()) return st.message();
  return "";
}

// The greedy plan's defining properties (docs/semantics.md#prefill-chunk-plan), checked without
// re-running the greedy loop.
std::string check_chunk_plan(const SwaMetadata& md, int64_t ratio, int64_t chunk) {
  auto plan = prefill_chunk_plan(md, ratio, chunk);
  if (!plan.ok()) return plan.status().to_string();
  const int32_t n = md.num_prefills;
  const int64_t w = md.window_size;
  const bool compressed = ratio > 1;
  const int64_t area = chunk * ((compressed ? (md.max_model_len + ratio - 1) / ratio : 0) + w +
                                md.max_num_batched_tokens);
  auto g = [&](int32_t i) -> int64_t {
    const int64_t ql = md.prefill_query_lens_host[i];
    return ql + std::clamp<int64_t>(md.prefill_seq_lens_host[i] - ql, 0, w - 1);
  };
  auto c = [&](int32_t i) -> int64_t {
    return compressed ? md.prefill_seq_lens_host[i] / ratio : 0;
  };
  int32_t expect_start = 0;
  for (const ChunkPlanEntry& e : plan.value()) {
    if (e.start != expect_start || e.end <= e.start || e.end > n) return "chunks not contiguous";
    int64_t mc = 0, mg = 0;
    for (int32_t i = e.start; i < e.end; ++i) mc = std::max(mc, c(i)), mg = std::max(mg, g(i));
    if (e.compressed_width != mc || e.total_width != mc + mg) return "chunk widths";
    const int64_t size = e.end - e.start;
    if (size > 1 && size * (mc + mg) > area) return "chunk over the area budget";
    if (e.end < n && (size + 1) * (std::max(mc, c(e.end)) + std::max(mg, g(e.end))) <= area)
      return "chunk not maximal";
    expect_start = e.end;
  }
  return expect_start == n ? "" : "plan does not cover every prefill request";
}

TEST(BuilderProperties, RandomBatchesMatchTheDefinitions) {
  RandomBatch gen(/*seed=*/0x5eed0001, testing::builder_test_options());
  std::map<std::string, int> coverage;
  for (int i = 0; i < kNumCases; ++i) {
    const RandomCase c = gen.next();
    auto builder = testing::cpu_builder(c.config);
    SwaMetadata md;
    const Status st = builder->build(c.batch.input(), &md);
    ASSERT_TRUE(st.ok()) << "case " << i << ": " << st.to_string() << "\n" << c.describe();
    const std::string violation = check_against_definitions(c, md);
    ASSERT_EQ(violation, "") << "case " << i << ": " << c.describe();
    for (int64_t ratio : {1, 2, 4, 128}) {
      for (int64_t chunk : {1, 4}) {
        ASSERT_EQ(check_chunk_plan(md, ratio, chunk), "")
            << "case " << i << " ratio " << ratio << " chunk " << chunk << ": " << c.describe();
      }
    }
    ++coverage[batch_mode_name(c.mode)];
    if (md.num_decode_tokens > 0 && md.num_prefill_tokens > 0) ++coverage["mixed split"];
    if (md.num_decode_tokens == 0) ++coverage["Td = 0"];
    if (md.num_prefill_tokens == 0) ++coverage["Tp = 0"];
    if (md.has_image()) ++coverage["image path"];
    if (!md.causal && md.num_decode_tokens > 0) ++coverage["non-causal rows"];
    if (c.batch.num_tokens() > c.batch.query_start_loc.back()) ++coverage["trailing padding"];
    for (int32_t r = 0; r < c.batch.num_reqs(); ++r)
      if (c.batch.query_len(r) == 0) ++coverage["q = 0 request"];
    for (int32_t t = 0; t < c.batch.query_start_loc.back(); ++t)
      if (c.batch.slot_mapping[t] < 0) ++coverage["invalid token in a request"];
    for (int32_t t = 0; t < md.num_decode_tokens; ++t)
      if (md.decode_swa.lens[t] > c.config.window_size) ++coverage["non-causal row wider than W"];
    if (md.replay_start_given) ++coverage["replay_start"];
    for (int32_t r = 0; r < md.num_reqs; ++r) {
      if (md.replay_start[r] > 0 && r >= md.num_decodes) ++coverage["replaying prefill"];
      if (md.replay_start[r] > 0 && r < md.num_decodes && md.causal) ++coverage["replaying decode"];
    }
    if (c.config.model_runner_v2) ++coverage["model_runner_v2"];
    if (!c.config.widen_image_spans && md.num_prefill_tokens > 0 && !c.batch.image_spans.empty())
      ++coverage["spans on a non-widening builder"];
    if (md.has_flashinfer_decode_lens()) ++coverage["flashinfer lens"];
  }
  // The generator must keep exercising every mode and feature.
  for (const char* key : {"plain_decode",
                          "mtp",
                          "parallel_drafting",
                          "dspark_noncausal",
                          "chunked_prefill",
                          "image",
                          "padded_decode",
                          "mixed",
                          "mixed split",
                          "Td = 0",
                          "Tp = 0",
                          "image path",
                          "non-causal rows",
                          "trailing padding",
                          "q = 0 request",
                          "invalid token in a request",
                          "non-causal row wider than W",
                          "replay_start",
                          "replaying prefill",
                          "replaying decode",
                          "model_runner_v2",
                          "spans on a non-widening builder",
                          "flashinfer lens"}) {
    EXPECT_GT(coverage[key], 20) << key;
  }
}

TEST(BuilderProperties, SameBatchSameOutputWhateverCameBefore) {
  // Persistent buffers are reused; a step's output must not depend on the previous step.
  RandomBatch gen(/*seed=*/0x5eed0002, testing::builder_test_options());
  for (int i = 0; i < 600; ++i) {
    RandomCase a = gen.next();
    a.config.max_num_batched_tokens = 512;  // room for the other batches
    a.config.max_num_seqs = 64;
    auto builder = testing::cpu_builder(a.config);
    SwaMetadata md;
    SPARSE_SWA_ASSERT_OK(builder->build(a.batch.input(), &md));
    const testing::MetadataSnapshot first = testing::snapshot(md);
    // Another batch for the same config, as large as the capacity allows.
    for (int j = 0; j < 3; ++j) {
      const BatchMode mode = j == 0 ? BatchMode::kMixed : BatchMode::kPaddedDecode;
      TestBatch other = gen.batch_for(a.config, mode, a.batch.causal);
      if (other.num_tokens() > a.config.max_num_batched_tokens ||
          other.num_reqs() > a.config.max_num_seqs)
        continue;
      SPARSE_SWA_ASSERT_OK(builder->build(other.input(), &md));
    }
    SPARSE_SWA_ASSERT_OK(builder->build(a.batch.input(), &md));
    ASSERT_EQ(testing::first_difference(testing::snapshot(md), first), "")
        << "case " << i << ": " << a.describe();
  }
}

TEST(BuilderProperties, UpdateDraftRowsFollowTheBuildsMode) {
  // docs/semantics.md#draft-update: validity and the decode tokens' requests from the current
  // arrays (padding: the last request), decode rows in the build's mode (causal rows of W with
  // the build's replay_start, or non-causal rows), the FlashInfer lens refreshed.
  RandomBatch gen(/*seed=*/0x5eed0003, testing::builder_test_options());
  int updated = 0, noncausal = 0;
  for (int i = 0; i < 1500; ++i) {
    const BatchMode mode = static_cast<BatchMode>(i % testing::kNumBatchModes);
    RandomCase c = gen.next(mode);
    auto builder = testing::cpu_builder(c.config);
    SwaMetadata md;
    SPARSE_SWA_ASSERT_OK(builder->build(c.batch.input(), &md));
    const testing::MetadataSnapshot before = testing::snapshot(md);
    const int32_t width = md.decode_swa.width;

    // The draft loop advanced the decode requests' seq_lens (new pages where needed).
    TestBatch& b = c.batch;
    const int32_t block = b.block_size();
    for (int32_t r = 0; r < md.num_decodes; ++r) {
      if (b.query_len(r) == 0) continue;
      b.seq_lens[r] += gen.uniform(0, 3);
      while (static_cast<int64_t>(b.pages[r].size()) * block < b.seq_lens[r])
        b.pages[r].push_back(gen.uniform(0, 1000));
    }
    const std::vector<int32_t> replay = b.replay_start;
    if (gen.chance(0.5)) b.replay_start.clear();  // not read by the update
    SPARSE_SWA_ASSERT_OK(builder->update_draft_decode_rows(b.input(), &md));
    updated += md.num_decode_tokens > 0;
    noncausal += md.num_decode_tokens > 0 && !md.causal;

    const testing::MetadataSnapshot after = testing::snapshot(md);
    ASSERT_EQ(after.at("prefill_swa.rows"), before.at("prefill_swa.rows")) << c.describe();
    ASSERT_EQ(md.decode_swa.width, width);
    const int32_t num_reqs = b.num_reqs(), w = c.config.window_size;
    std::vector<int32_t> owner(b.num_tokens(), 0);
    for (int32_t t = 0; t < b.num_tokens(); ++t) {
      owner[t] = t < md.num_decode_tokens ? std::max(num_reqs - 1, 0) : md.token_to_req_indices[t];
      for (int32_t r = 0; r < num_reqs && t < md.num_decode_tokens; ++r)
        if (b.query_start_loc[r] <= t && t < b.query_start_loc[r + 1]) owner[t] = r;
      ASSERT_EQ(md.token_to_req_indices[t], owner[t]) << "case " << i << " token " << t;
      ASSERT_EQ(md.is_valid_token[t], b.slot_mapping[t] >= 0 ? 1 : 0) << "token " << t;
    }
    for (int32_t t = 0; t < md.num_decode_tokens; ++t) {
      const int32_t r = owner[t];
      std::string err;
      if (b.slot_mapping[t] < 0) {
        err = check_row(b, r, md.decode_swa.row(t), width, md.decode_swa.lens[t], 0, 0);
      } else if (md.causal) {
        const int32_t pos = b.prefix_len(r) + (t - b.query_start_loc[r]);
        const int32_t rs = replay.empty() ? 0 : replay[r];
        const int32_t start = std::max({pos - (w - 1), 0, rs});  // W, never the row width
        err = check_row(b, r, md.decode_swa.row(t), width, md.decode_swa.lens[t], start,
                        pos + 1 - start);
      } else {
        const int32_t prefix = b.prefix_len(r);
        err = check_row(b, r, md.decode_swa.row(t), width, md.decode_swa.lens[t],
                        std::max(prefix - w, 0), std::min(prefix, w) + b.query_len(r));
      }
      ASSERT_EQ(err, "") << "case " << i << " token " << t << ": " << c.describe();
    }
    ASSERT_EQ(check_flashinfer_lens(c.config, b, owner, md), "") << c.describe();
  }
  EXPECT_GT(updated, 500);
  EXPECT_GT(noncausal, 100);
}

}  // namespace
}  // namespace sparse_swa
