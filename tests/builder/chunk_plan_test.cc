// SPDX-License-Identifier: Apache-2.0
// prefill_chunk_plan: the greedy workspace plan (docs/semantics.md#prefill-chunk-plan), on
// hand-made prefill metadata with hand-computed plans.
//   area = chunk * (cdiv(max_model_len, ratio) if compressed + W + max_num_batched_tokens)
//   gather g = ql + clamp(prefix, 0, W - 1); compressed c = seq / ratio.
#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "sparse_swa/metadata.h"
#include "sparse_swa/metadata_builder.h"
#include "support/status_matchers.h"
#include "testing/test_batch.h"

namespace sparse_swa {
namespace {

using testing::IsInvalidArgument;
using Plan = std::vector<ChunkPlanEntry>;

// Host-only metadata holding just what the chunk planner reads.
struct PrefillRequests {
  std::vector<int32_t> seq_lens;
  std::vector<int32_t> query_lens;
  SwaMetadata md(int32_t window, int64_t max_model_len, int32_t max_num_batched_tokens) const {
    SwaMetadata m;
    m.num_prefills = static_cast<int32_t>(seq_lens.size());
    m.prefill_seq_lens_host = seq_lens;
    m.prefill_query_lens_host = query_lens;
    m.window_size = window;
    m.max_model_len = max_model_len;
    m.max_num_batched_tokens = max_num_batched_tokens;
    return m;
  }
};

Plan plan_or_fail(const SwaMetadata& md, int64_t ratio, int64_t chunk,
                  std::optional<bool> has_compressed = std::nullopt) {
  auto plan = prefill_chunk_plan(md, ratio, chunk, has_compressed);
  EXPECT_TRUE(plan.ok()) << plan.status().to_string();
  return plan.ok() ? plan.value() : Plan{};
}

TEST(ChunkPlan, FiveRequestsGolden) {
  const PrefillRequests r{{80, 96, 112, 128, 144}, {4, 4, 4, 4, 4}};
  // area = 4 * (256 + 64 + 128) = 1792; c = [20..36], g = 67; 5 * 103 = 515.
  EXPECT_EQ(plan_or_fail(r.md(64, 1024, 128), 4, 4), (Plan{{0, 5, 36, 103}}));
}

TEST(ChunkPlan, SingleRequestOverBudgetStillGetsItsOwnChunk) {
  // W 8, max_model_len 64, mnbt 16, ratio 1, chunk 1: area = 24.
  const PrefillRequests r{{140, 12}, {40, 10}};  // g = 40 + 7 = 47 > 24, g = 10 + 2 = 12
  EXPECT_EQ(plan_or_fail(r.md(8, 64, 16), 1, 1), (Plan{{0, 1, 0, 47}, {1, 2, 0, 12}}));
}

TEST(ChunkPlan, GreedySplitWithPrefixClamp) {
  // g = 3 + min(17, 7) = 10 (x3) and 5 + 0 = 5 (first chunk of a prompt). area 24.
  const PrefillRequests r{{20, 20, 20, 5}, {3, 3, 3, 5}};
  EXPECT_EQ(plan_or_fail(r.md(8, 64, 16), 1, 1), (Plan{{0, 2, 0, 10}, {2, 4, 0, 10}}));
}

TEST(ChunkPlan, BudgetIsInclusive) {
  // g = 5 + 7 = 12 each: 2 * 12 = 24 = area still fits one chunk; a third would not.
  const PrefillRequests r{{20, 20, 20}, {5, 5, 5}};
  EXPECT_EQ(plan_or_fail(r.md(8, 64, 16), 1, 1), (Plan{{0, 2, 0, 12}, {2, 3, 0, 12}}));
}

TEST(ChunkPlan, AllRequestsFit) {
  const PrefillRequests r{{20, 20, 20, 5}, {3, 3, 3, 5}};
  // chunk 4: area 96 >= 4 * 10.
  EXPECT_EQ(plan_or_fail(r.md(8, 64, 16), 1, 4), (Plan{{0, 4, 0, 10}}));
}

TEST(ChunkPlan, ChunkSizeScalesTheAreaNotTheRequestCount) {
  PrefillRequests r;
  for (int i = 0; i < 20; ++i) {
    r.seq_lens.push_back(20);
    r.query_lens.push_back(3);
  }
  // chunk 4: area 96, g 10 -> 9 requests per chunk.
  EXPECT_EQ(plan_or_fail(r.md(8, 64, 16), 1, 4),
            (Plan{{0, 9, 0, 10}, {9, 18, 0, 10}, {18, 20, 0, 10}}));
}

TEST(ChunkPlan, CompressedRatioFour) {
  // area = 1 * (16 + 8 + 16) = 40; c = 5, 7, 10; g = 11.
  const PrefillRequests r{{20, 30, 40}, {4, 4, 4}};
  EXPECT_EQ(plan_or_fail(r.md(8, 64, 16), 4, 1), (Plan{{0, 2, 7, 18}, {2, 3, 10, 21}}));
}

TEST(ChunkPlan, CompressedRatioTwo) {
  // area = 1 * (32 + 8 + 16) = 56; c = 10, 15, 20; g = 11: 2 * 26 = 52, 3 * 31 = 93.
  const PrefillRequests r{{20, 30, 40}, {4, 4, 4}};
  EXPECT_EQ(plan_or_fail(r.md(8, 64, 16), 2, 1), (Plan{{0, 2, 15, 26}, {2, 3, 20, 31}}));
}

TEST(ChunkPlan, CompressedRatio128) {
  // area = 1 * (1 + 8 + 16) = 25; c = 0; g = 11: 2 * 11 = 22, 3 * 11 = 33.
  const PrefillRequests r{{20, 30, 40}, {4, 4, 4}};
  EXPECT_EQ(plan_or_fail(r.md(8, 64, 16), 128, 1), (Plan{{0, 2, 0, 11}, {2, 3, 0, 11}}));
}

TEST(ChunkPlan, HasCompressedOverrides) {
  const PrefillRequests r{{20, 30, 40}, {4, 4, 4}};
  const SwaMetadata md = r.md(8, 64, 16);
  // V4.1 C1A: ratio 1 with a compressed region; area = 4 * (64 + 8 + 16) = 352, c = seq.
  EXPECT_EQ(plan_or_fail(md, 1, 4, true), (Plan{{0, 3, 40, 51}}));
  EXPECT_EQ(plan_or_fail(md, 1, 4), (Plan{{0, 3, 0, 11}}));  // default: ratio > 1
  // Ratio 4 without a compressed region: area = 1 * (8 + 16) = 24, c = 0: 2 * 11 = 22.
  EXPECT_EQ(plan_or_fail(md, 4, 1, false), (Plan{{0, 2, 0, 11}, {2, 3, 0, 11}}));
}

TEST(ChunkPlan, NoPrefillsGivesAnEmptyPlan) {
  const PrefillRequests r;
  EXPECT_TRUE(plan_or_fail(r.md(8, 64, 16), 4, 4).empty());
}

TEST(ChunkPlan, MismatchedHostArraysAreAnError) {
  const PrefillRequests r{{20, 30}, {4, 4}};
  SwaMetadata md = r.md(8, 64, 16);
  md.num_prefills = 3;
  EXPECT_TRUE(IsInvalidArgument(prefill_chunk_plan(md, 1, 4).status(),
                                {"metadata.prefill_seq_lens_host", "expected 3", "got 2"}));
}

TEST(ChunkPlan, FromABuildWithDecodesAndPrefills) {
  // Decodes are not part of the plan; prefill requests are numbered from 0.
  BuilderConfig c;
  c.window_size = 8;
  c.block_size = 4;
  c.max_num_batched_tokens = 16;
  c.max_num_seqs = 4;
  c.max_model_len = 64;
  auto builder = testing::cpu_builder(c);
  testing::TestBatch b(4);
  b.add_request(30, 1, std::vector<int32_t>(8, 1))       // decode
      .add_request(20, 3, std::vector<int32_t>(5, 2))    // g = 3 + 7 = 10
      .add_request(5, 5, std::vector<int32_t>(2, 3))     // g = 5
      .add_request(40, 4, std::vector<int32_t>(10, 4));  // g = 11
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(b.input(), &md));
  ASSERT_EQ(md.num_prefills, 3);
  // ratio 1, chunk 1: area 24: [10, 5] fit (2 * 10), adding 11 gives 3 * 11 = 33.
  EXPECT_EQ(plan_or_fail(md, 1, 1), (Plan{{0, 2, 0, 10}, {2, 3, 0, 11}}));
  // ratio 4, chunk 1: area 40; c = 5, 1, 10: 2 * (5 + 10) = 30, 3 * (10 + 11) = 63.
  EXPECT_EQ(plan_or_fail(md, 4, 1), (Plan{{0, 2, 5, 15}, {2, 3, 10, 21}}));
}

}  // namespace
}  // namespace sparse_swa
