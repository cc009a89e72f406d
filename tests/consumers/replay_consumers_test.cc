// SPDX-License-Identifier: Apache-2.0
// The consumers under SWA bounded replay (docs/semantics.md#bounded-replay), CPU reference: the
// mixed matrix and the combined prefill of docs Example 6 (examples/batches/replay_prefill.json)
// by hand, an image-widened window clamped at the replay start, DSpark non-causal rows left alone,
// replay_start read from the metadata (not the batch), and the errors of a replay_start the
// metadata should not hold. Expected values are hand-computed from the rules, never produced by
// this library.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sparse_swa/consumers.h"
#include "sparse_swa/metadata_builder.h"
#include "support/host_output.h"
#include "support/status_matchers.h"
#include "testing/test_batch.h"

namespace sparse_swa {
namespace {

using testing::cpu_builder;
using testing::IsInvalidArgument;
using testing::TestBatch;
using Row = std::vector<int32_t>;

using Output = testing::HostOutput;
using testing::kPoison;
using testing::padded;

Row iota_row(int32_t from, int32_t n) {
  Row r(n);
  for (int32_t i = 0; i < n; ++i) r[i] = from + i;
  return r;
}

BuilderConfig text_config() {
  BuilderConfig c;
  c.window_size = 8;
  c.block_size = 4;
  c.max_num_batched_tokens = 64;
  c.max_num_seqs = 8;
  c.max_model_len = 64;
  c.compress_ratios = {1, 4};
  return c;
}

// Example 6 (docs/semantics.md#example-6-bounded-replay): W = 8, B = 4, replay_start [0, 8, 12].
// Request 0 decodes position 10; request 1 prefills positions 8..13 (pages [-1, -1, 11, 6]:
// positions 8..11 are slots 44..47, 12..13 are 24, 25); request 2 prefills 16..19 (pages
// [-1, -1, -1, 1, 4]: positions 12..15 are slots 4..7, 16..19 are 16..19). The freed pages lie
// below each replay start.
TestBatch example6_batch() {
  TestBatch b(4);
  b.add_request(11, 1, {7, 3, 9, 2, 0})
      .add_request(14, 6, {-1, -1, 11, 6, 0})
      .add_request(20, 4, {-1, -1, -1, 1, 4});
  b.replay_start = {0, 8, 12};
  return b;
}

class Example6 : public ::testing::Test {
 protected:
  void SetUp() override {
    builder_ = cpu_builder(text_config());
    SPARSE_SWA_ASSERT_OK(builder_->build(input_, &md_));
    ASSERT_EQ(md_.num_decode_tokens, 1);
    ASSERT_EQ(md_.num_prefill_tokens, 10);
    ASSERT_EQ(Row(md_.replay_start.begin(), md_.replay_start.end()), Row({0, 8, 12}));
    ASSERT_EQ(Row(md_.prefill_gather_lens.begin(), md_.prefill_gather_lens.end()), Row({6, 8}));
  }
  ConsumerStep step() const { return {md_, input_, 4}; }
  // The metadata with another replay_start (the builder's arrays otherwise).
  SwaMetadata with_replay(const Row& replay) const {
    SwaMetadata md = md_;
    md.replay_start = replay;
    return md;
  }

  TestBatch batch_ = example6_batch();
  BatchInput input_ = batch_.input();
  std::unique_ptr<MetadataBuilder> builder_;
  SwaMetadata md_;
};

// The prefill rows start at max(pos - 7, replay_start): request 1 at 8 (lens 1..6), request 2 at
// 12 (lens 5..8); S = 8, so lens = 8 for every row and swa_lens are the window sizes.
const std::vector<Row> kEx6MixedRows = {{31, 12, 13, 14, 15, 36, 37, 38},
                                        {44},
                                        {44, 45},
                                        {44, 45, 46},
                                        {44, 45, 46, 47},
                                        {44, 45, 46, 47, 24},
                                        {44, 45, 46, 47, 24, 25},
                                        {4, 5, 6, 7, 16},
                                        {4, 5, 6, 7, 16, 17},
                                        {4, 5, 6, 7, 16, 17, 18},
                                        {4, 5, 6, 7, 16, 17, 18, 19}};

TEST_F(Example6, MixedMatrixPrefillRowsStartAtTheReplayStart) {
  for (MixedMatrixForm form : {MixedMatrixForm::kFlashInferSm100, MixedMatrixForm::kVerbatim}) {
    SCOPED_TRACE(mixed_matrix_form_name(form));
    Output out(11, 8);
    Row swa_lens(11, kPoison);
    SPARSE_SWA_ASSERT_OK(build_mixed_matrix(step(), {}, form, out.view(), swa_lens));
    for (int t = 0; t < 11; ++t) EXPECT_EQ(out.row(t), padded(kEx6MixedRows[t], 8)) << t;
    EXPECT_EQ(out.lens, Row(11, 8));
    EXPECT_EQ(swa_lens, Row({8, 1, 2, 3, 4, 5, 6, 5, 6, 7, 8}));
  }
}

// Without the replay start the windows reach the freed pages: the CPU names the first one (the
// GPU masks such rows), nothing written.
TEST_F(Example6, MixedMatrixWithoutTheReplayStartReadsFreedPages) {
  const SwaMetadata md = with_replay({});
  Output out(11, 8);
  EXPECT_TRUE(
      IsInvalidArgument(build_mixed_matrix({md, input_, 4}, {}, out.view()),
                        {"batch.block_table[1][0]", "token 1 reads positions [1, 9)", "got -1"}));
  EXPECT_TRUE(out.untouched());
}

// One chunk (0, 2, N 0, M 13): the replay-free gather bounds 13 and 11 size the workspace;
// gather_start = seq_len - prefill_gather_lens = 14 - 6 = 8 and 20 - 8 = 12, so the window from
// the replay start maps to workspace rows from N + 0: request 1 (b = 0) rows 0.., request 2
// (b = 1) rows 13...
TEST_F(Example6, CombinedPrefillSwaOnly) {
  auto plan = prefill_chunk_plan(md_, 1, 4);
  SPARSE_SWA_ASSERT_OK(plan.status());
  ASSERT_EQ(plan.value(), std::vector<ChunkPlanEntry>({{0, 2, 0, 13}}));
  Output out(10, 128);
  SPARSE_SWA_ASSERT_OK(build_combined_prefill(step(), plan.value()[0], 1, {}, out.view()));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out.row(i), padded(iota_row(0, i + 1), 128)) << i;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out.row(6 + i), padded(iota_row(13, 5 + i), 128)) << i;
  EXPECT_EQ(out.lens, Row({1, 2, 3, 4, 5, 6, 5, 6, 7, 8}));
}

// C4A, TOP_K 2: one chunk (0, 2, N 5, M 18) (compressed entries 14 / 4 = 3 and 20 / 4 = 5,
// replay-free gathers 13 and 11). topk_len = min((pos + 1) / 4, 2) = 2 for every row (replay
// does not touch the compressed part); SWA entries from N: request 1 at 5 + (p - 8), request 2
// at 18 + 5 + (p - 12). Local entries are base + l, -1 for l < 0 (still counted).
TEST_F(Example6, CombinedPrefillC4a) {
  auto plan = prefill_chunk_plan(md_, 4, 4);
  SPARSE_SWA_ASSERT_OK(plan.status());
  ASSERT_EQ(plan.value(), std::vector<ChunkPlanEntry>({{0, 2, 5, 18}}));
  const Row local = {0, 1, 2, 0, 1, 2, 0, -1, 2, 1, 1, 0,  // request 1, positions 8..13
                     4, 0, 3, 1, 2, 4, 0, 3};              // request 2, positions 16..19
  Output out(10, 128);
  SPARSE_SWA_ASSERT_OK(build_combined_prefill(
      step(), plan.value()[0], 4, {local.data(), 10, 2, 2, MemorySpace::kHost}, out.view()));
  const std::vector<Row> want = {{0, 1, 5},
                                 {2, 0, 5, 6},
                                 {1, 2, 5, 6, 7},
                                 {0, -1, 5, 6, 7, 8},
                                 {2, 1, 5, 6, 7, 8, 9},
                                 {1, 0, 5, 6, 7, 8, 9, 10},
                                 {22, 18, 23, 24, 25, 26, 27},
                                 {21, 19, 23, 24, 25, 26, 27, 28},
                                 {20, 22, 23, 24, 25, 26, 27, 28, 29},
                                 {18, 21, 23, 24, 25, 26, 27, 28, 29, 30}};
  for (int i = 0; i < 10; ++i) EXPECT_EQ(out.row(i), padded(want[i], 128)) << i;
  EXPECT_EQ(out.lens, Row({3, 4, 5, 6, 7, 8, 7, 8, 9, 10}));
}

// The combined prefill reads no page: its windows stay inside the gathered range, so gather lens
// shrunk by replay give the same rows without md.replay_start (the freed pages below are never
// looked at); and a replay_start with replay-free gather lens indexes further into the larger
// gathered range.
TEST_F(Example6, CombinedPrefillStaysInsideTheGatheredRange) {
  const ChunkPlanEntry chunk{0, 2, 0, 13};
  Output with(10, 128), without(10, 128);
  SPARSE_SWA_ASSERT_OK(build_combined_prefill(step(), chunk, 1, {}, with.view()));
  const SwaMetadata no_replay = with_replay({});
  SPARSE_SWA_ASSERT_OK(
      build_combined_prefill({no_replay, input_, 4}, chunk, 1, {}, without.view()));
  EXPECT_EQ(with.data, without.data);
  EXPECT_EQ(with.lens, without.lens);
  // Replay-free gather lens 6 + min(8, 7) = 13 and 4 + min(16, 7) = 11: gather_start 1 and 9, so
  // request 1's window [8, p + 1) starts at N + 7, request 2's [12, p + 1) at 13 + 3 = 16.
  const Row free_gather = {13, 11};
  SwaMetadata md = md_;
  md.prefill_gather_lens = free_gather;
  Output wide(10, 128);
  SPARSE_SWA_ASSERT_OK(build_combined_prefill({md, input_, 4}, chunk, 1, {}, wide.view()));
  EXPECT_EQ(wide.row(0), padded({7}, 128));
  EXPECT_EQ(wide.row(5), padded(iota_row(7, 6), 128));
  EXPECT_EQ(wide.row(6), padded(iota_row(16, 5), 128));
  EXPECT_EQ(wide.row(9), padded(iota_row(16, 8), 128));
  EXPECT_EQ(wide.lens, with.lens);
}

// replay_start is read from the metadata (the builder's copy), never from the batch.
TEST_F(Example6, ReplayStartComesFromTheMetadata) {
  BatchInput batch = input_;
  batch.replay_start = {};
  Output out(11, 8);
  SPARSE_SWA_ASSERT_OK(build_mixed_matrix({md_, batch, 4}, {}, out.view()));
  for (int t = 0; t < 11; ++t) EXPECT_EQ(out.row(t), padded(kEx6MixedRows[t], 8)) << t;
}

TEST_F(Example6, ReplayStartOutsideThePrefixIsAnError) {
  const ChunkPlanEntry chunk{0, 2, 0, 13};
  struct Case {
    Row replay;
    std::vector<std::string> message;
  };
  const Case cases[] = {
      {{0, 9, 12},
       {"metadata.replay_start[1]: expected 0..prefix seq_lens[1] - query_len = 14 - 6 = 8, "
        "got 9"}},
      {{0, 8, -1},
       {"metadata.replay_start[2]: expected 0..prefix seq_lens[2] - query_len = 20 - 4 = 16, "
        "got -1"}},
      {{0, 8},
       {"metadata.replay_start: expected >= num_reqs 3 entries (or none: no replay), got 2"}},
  };
  for (const Case& c : cases) {
    const SwaMetadata md = with_replay(c.replay);
    const ConsumerStep bad{md, input_, 4};
    Output mixed(11, 8), comb(10, 128);
    Row swa_lens(11, kPoison);
    EXPECT_TRUE(IsInvalidArgument(build_mixed_matrix(bad, {}, mixed.view(), swa_lens), c.message));
    EXPECT_TRUE(mixed.untouched());
    EXPECT_EQ(swa_lens, Row(11, kPoison));
    EXPECT_TRUE(
        IsInvalidArgument(build_combined_prefill(bad, chunk, 1, {}, comb.view()), c.message));
    EXPECT_TRUE(comb.untouched());
    const Row local(20, 0);
    EXPECT_TRUE(IsInvalidArgument(
        check_prefill_topk(bad, 4, {local.data(), 10, 2, 2, MemorySpace::kHost}), c.message));
  }
}

// W = 4, Mi = 8 (prefill width 12), one request of seq 10 prefilling positions 6..9 with the
// span [1, 8] and replay_start 4 (page 0, positions 0..3, freed). Positions 6..8 are widened back
// to the span's start (1) but clamped at 4: positions 4..8, slots 20..24 (pages [-1, 5, 6]);
// position 9 sees 6..9. Gather 4 + min(6 - 4, 3) = 6: gather_start 4.
TEST(ReplayConsumers, ImageWidenedWindowsStopAtTheReplayStart) {
  BuilderConfig c = text_config();
  c.window_size = 4;
  c.max_image_tokens = 8;
  c.compress_ratios = {1};
  TestBatch batch(4);
  batch.add_request(10, 4, {-1, 5, 6}).add_image_span(0, 1, 8);
  batch.replay_start = {4};
  const BatchInput input = batch.input();
  auto builder = cpu_builder(c);
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(input, &md));
  ASSERT_TRUE(md.has_image());
  ASSERT_EQ(md.prefill_gather_lens[0], 6);
  const ConsumerStep step{md, input, 4};
  Output mixed(4, 12);
  Row swa_lens(4, kPoison);
  SPARSE_SWA_ASSERT_OK(build_mixed_matrix(step, {}, mixed.view(), swa_lens));
  for (int t = 0; t < 3; ++t) EXPECT_EQ(mixed.row(t), padded({20, 21, 22, 23, 24}, 12)) << t;
  EXPECT_EQ(mixed.row(3), padded({22, 23, 24, 25}, 12));
  EXPECT_EQ(mixed.lens, Row(4, 12));
  EXPECT_EQ(swa_lens, Row({5, 5, 5, 4}));
  auto plan = prefill_chunk_plan(md, 1, 4);
  SPARSE_SWA_ASSERT_OK(plan.status());
  ASSERT_EQ(plan.value(), std::vector<ChunkPlanEntry>({{0, 1, 0, 7}}));
  Output comb(4, 128);
  SPARSE_SWA_ASSERT_OK(build_combined_prefill(step, plan.value()[0], 1, {}, comb.view()));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(comb.row(i), padded({0, 1, 2, 3, 4}, 128)) << i;
  EXPECT_EQ(comb.row(3), padded({2, 3, 4, 5}, 128));
  EXPECT_EQ(comb.lens, Row({5, 5, 5, 4}));
}

// A DSpark draft step (Example 3's two blocks, W = 8, k = 3: theta 4, Wn = S = 64) with a
// replaying prefill beside them (Example 6's request 1: seq 14, ql 6, replay_start 8) and a
// replay start at each block's prefix: the non-causal rows ignore replay (the SM100 relayout of
// Example 3 unchanged), the prefill rows start at 8.
TEST(ReplayConsumers, DsparkRowsIgnoreReplayPrefillRowsApplyIt) {
  BuilderConfig c = text_config();
  c.speculative_method = SpeculativeMethod::kDspark;
  c.num_speculative_tokens = 3;
  TestBatch batch(4);
  batch.add_request(13, 3, {7, 3, 9, 2})
      .add_request(5, 3, {5, 11, 6, 0})
      .add_request(14, 6, {-1, -1, 11, 6})
      .set_causal(false);
  batch.replay_start = {10, 2, 8};
  const BatchInput input = batch.input();
  auto builder = cpu_builder(c);
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(input, &md));
  ASSERT_EQ(md.decode_swa.width, 64);
  ASSERT_EQ(md.num_decode_tokens, 6);
  Output out(12, 64);
  Row swa_lens(12, kPoison);
  SPARSE_SWA_ASSERT_OK(build_mixed_matrix({md, input, 4}, {}, out.view(), swa_lens));
  const Row req0 = padded({30, 31, 12, 13, 14, 15, 36, 37, 38, 39, 8}, 64);
  for (int t = 0; t < 3; ++t) EXPECT_EQ(out.row(t), req0) << t;
  EXPECT_EQ(out.row(3), padded({20, 21, 22, -1, -1, -1, -1, -1, 23, 44}, 64));
  EXPECT_EQ(out.row(4), padded({20, 21, 22, 23, -1, -1, -1, -1, 44}, 64));
  EXPECT_EQ(out.row(5), padded({20, 21, 22, 23, 44}, 64));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out.row(6 + i), padded(kEx6MixedRows[1 + i], 64)) << i;
  EXPECT_EQ(out.lens, Row({11, 11, 11, 10, 9, 8, 64, 64, 64, 64, 64, 64}));
  EXPECT_EQ(swa_lens, Row({11, 11, 11, 5, 5, 5, 1, 2, 3, 4, 5, 6}));
}

}  // namespace
}  // namespace sparse_swa
