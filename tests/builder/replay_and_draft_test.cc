// SPDX-License-Identifier: Apache-2.0
// The builder rules of docs/semantics.md#bounded-replay, #draft-update, #decode-threshold,
// #image-widening-switch and #flashinfer-decode-lens, each with rows computed by hand
// (slot(r, p) = page[p / B] * B + p % B; identity pages give slot = position).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sparse_swa/metadata_builder.h"
#include "support/metadata_snapshot.h"
#include "support/status_matchers.h"
#include "testing/presets.h"
#include "testing/test_batch.h"

namespace sparse_swa {
namespace {

using testing::cpu_builder;
using testing::IsInvalidArgument;
using testing::lens_of;
using testing::row_of;
using testing::TestBatch;
using testing::to_vector;
using Row = std::vector<int32_t>;

// Positions [from, to) (identity pages: the slots), then -1 up to `width`.
Row positions(int32_t from, int32_t to, int32_t width) {
  Row row;
  for (int32_t p = from; p < to; ++p) row.push_back(p);
  row.resize(width, -1);
  return row;
}

// Slots of positions [from, to) of request r, then -1 up to `width`.
Row slots(const TestBatch& b, int32_t r, int32_t from, int32_t to, int32_t width) {
  Row row;
  for (int32_t p = from; p < to; ++p) row.push_back(static_cast<int32_t>(b.slot(r, p)));
  row.resize(width, -1);
  return row;
}

Row repeat(std::initializer_list<std::pair<int32_t, int32_t>> runs) {
  Row out;
  for (auto [value, count] : runs) out.insert(out.end(), count, value);
  return out;
}

SwaMetadata build_ok(MetadataBuilder& builder, const BatchInput& batch) {
  SwaMetadata md;
  const Status st = builder.build(batch, &md);
  if (!st.ok()) ADD_FAILURE() << st.to_string();
  return md;
}

std::vector<uint8_t> validity(const SwaMetadata& md) {
  return {md.is_valid_token.begin(), md.is_valid_token.end()};
}

// ---------------------------------------------------------------- bounded replay

// docs/semantics.md#bounded-replay's example: W = 8, seq [40, 12, 30], ql [24, 12, 10], replay
// [12, 0, 0].
TestBatch replay_golden_batch() {
  TestBatch b(4);
  b.add_identity_request(40, 24).add_identity_request(12, 12).add_identity_request(30, 10);
  b.replay_start = {12, 0, 0};
  return b;
}

TEST(BoundedReplay, ClampsPrefillRowsAndGatherLens) {
  auto builder = cpu_builder(testing::small_config(8, 4));
  const TestBatch b = replay_golden_batch();
  const SwaMetadata md = build_ok(*builder, b.input());
  ASSERT_EQ(md.num_prefills, 3);
  EXPECT_TRUE(md.replay_start_given);
  EXPECT_EQ(to_vector(md.replay_start), (Row{12, 0, 0}));
  // Request 0 (prefix 16): position 16 starts at max(9, 12) = 12, lens 5; from position 19 on the
  // replay start is below the window (lens 8); its last row (position 39) is 32..39.
  const Row lens = lens_of(md.prefill_swa);
  EXPECT_EQ(Row(lens.begin(), lens.begin() + 24), repeat({{5, 1}, {6, 1}, {7, 1}, {8, 21}}));
  EXPECT_EQ(row_of(md.prefill_swa, 0), positions(12, 17, 8));
  EXPECT_EQ(row_of(md.prefill_swa, 2), positions(12, 19, 8));
  EXPECT_EQ(row_of(md.prefill_swa, 23), positions(32, 40, 8));
  // Requests 1 and 2 replay nothing: min(pos + 1, 8).
  EXPECT_EQ(Row(lens.begin() + 24, lens.begin() + 36), (Row{1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8, 8}));
  EXPECT_EQ(Row(lens.begin() + 36, lens.end()), Row(10, 8));
  // [24 + min(16 - 12, 7), 12 + 0, 10 + min(20, 7)]
  EXPECT_EQ(to_vector(md.prefill_gather_lens), (Row{28, 12, 17}));
}

TEST(BoundedReplay, ChunkPlanKeepsTheReplayFreeBound) {
  auto builder = cpu_builder(testing::small_config(8, 4));
  TestBatch b = replay_golden_batch();
  const SwaMetadata with = build_ok(*builder, b.input());
  auto plan = prefill_chunk_plan(with, 1, 4);
  SPARSE_SWA_ASSERT_OK(plan.status());
  const std::vector<ChunkPlanEntry> replayed = plan.value();
  b.replay_start.clear();
  const SwaMetadata without = build_ok(*builder, b.input());
  EXPECT_EQ(prefill_chunk_plan(without, 1, 4).value(), replayed);
  // The gather bound the plan uses is 24 + 7 = 31 for request 0 whatever the replay.
  EXPECT_EQ(to_vector(without.prefill_gather_lens), (Row{31, 12, 17}));
  EXPECT_FALSE(without.replay_start_given);
  EXPECT_EQ(to_vector(without.replay_start), (Row{0, 0, 0}));
}

TEST(BoundedReplay, ZerosGiveTheRowsOfNoReplay) {
  auto builder = cpu_builder(testing::small_config(8, 4));
  TestBatch b = replay_golden_batch();
  b.replay_start = {0, 0, 0};
  const testing::MetadataSnapshot zeros = testing::snapshot(build_ok(*builder, b.input()));
  b.replay_start.clear();
  const testing::MetadataSnapshot none = testing::snapshot(build_ok(*builder, b.input()));
  EXPECT_EQ(testing::first_difference(zeros, none), "");
}

TEST(BoundedReplay, ClampsCausalDecodeRows) {
  auto builder = cpu_builder(testing::with_mtp(testing::small_config(8, 4), 1));  // theta 2
  TestBatch b(4);
  b.add_request(11, 1, {7, 3, 9, 2}).add_request(6, 2, {5, 11, 6, 0});
  b.replay_start = {5, 4};
  const SwaMetadata md = build_ok(*builder, b.input());
  ASSERT_EQ(md.num_decode_tokens, 3);
  // Request 0 at position 10: max(3, 5) = 5 -> 5..10. Request 1 at 4, 5: starts at 4.
  EXPECT_EQ(lens_of(md.decode_swa), (Row{6, 1, 2}));
  EXPECT_EQ(row_of(md.decode_swa, 0), slots(b, 0, 5, 11, 8));
  EXPECT_EQ(row_of(md.decode_swa, 2), slots(b, 1, 4, 6, 8));
}

TEST(BoundedReplay, ClampsImageWidenedRows) {
  // W = 4, Mi = 8, span [1, 8], a chunk at positions 4..9 replaying from 3: without replay the
  // in-image rows would reach back to position 1.
  auto builder = cpu_builder(testing::with_images(testing::small_config(4, 4), 8));
  TestBatch b(4);
  b.add_identity_request(10, 6).add_image_span(0, 1, 8);
  b.replay_start = {3};
  const SwaMetadata md = build_ok(*builder, b.input());
  ASSERT_TRUE(md.has_image());
  EXPECT_EQ(lens_of(md.prefill_swa), (Row{6, 6, 6, 6, 6, 4}));
  EXPECT_EQ(row_of(md.prefill_swa, 0), positions(3, 9, 12));
  EXPECT_EQ(row_of(md.prefill_swa, 4), positions(3, 9, 12));
  EXPECT_EQ(row_of(md.prefill_swa, 5), positions(6, 10, 12));
  EXPECT_EQ(to_vector(md.prefill_gather_lens), (Row{7}));  // 6 + min(4 - 3, 3)
  b.replay_start.clear();
  const SwaMetadata plain = build_ok(*builder, b.input());
  EXPECT_EQ(row_of(plain.prefill_swa, 0), positions(1, 9, 12));
}

TEST(BoundedReplay, NonCausalRowsIgnoreIt) {
  auto builder = cpu_builder(testing::with_dspark(testing::small_config(8, 4), 3));  // Wn 64
  TestBatch b(4);
  b.add_request(13, 3, {7, 3, 9, 2}).add_request(5, 3, {5, 11}).set_causal(false);
  b.replay_start = {10, 2};
  const SwaMetadata md = build_ok(*builder, b.input());
  EXPECT_EQ(lens_of(md.decode_swa), (Row{11, 11, 11, 5, 5, 5}));
  EXPECT_EQ(row_of(md.decode_swa, 0), slots(b, 0, 2, 13, 64));
  EXPECT_EQ(to_vector(md.replay_start), (Row{10, 2}));
}

TEST(BoundedReplay, PagesBelowTheReplayStartAreNeverRead) {
  // Bounded replay frees the window pages below replay_start: the rows must not touch them.
  auto builder = cpu_builder(testing::small_config(8, 4));
  TestBatch b(4);
  b.add_request(24, 8, {-1, -1, -1, 5, 6, 7});  // prefix 16, pages 0..2 (positions 0..11) freed
  b.replay_start = {12};
  const SwaMetadata md = build_ok(*builder, b.input());
  EXPECT_EQ(lens_of(md.prefill_swa), (Row{5, 6, 7, 8, 8, 8, 8, 8}));
  b.replay_start.clear();
  SwaMetadata out;
  EXPECT_TRUE(IsInvalidArgument(builder->build(b.input(), &out), {"batch.block_table[0][2]"}));
}

TEST(BoundedReplayErrors, NegativePastThePrefixAndWrongLength) {
  auto builder = cpu_builder(testing::small_config(8, 4));
  TestBatch b = replay_golden_batch();
  SwaMetadata md;
  b.replay_start = {12, -1, 0};
  EXPECT_TRUE(IsInvalidArgument(builder->build(b.input(), &md),
                                {"batch.replay_start[1]: expected >= 0", "got -1"}));
  b.replay_start = {17, 0, 0};
  EXPECT_TRUE(IsInvalidArgument(
      builder->build(b.input(), &md),
      {"batch.replay_start[0]: expected <= the request's prefix", "40 - 24 = 16", "got 17"}));
  b.replay_start = {12, 0};
  EXPECT_TRUE(IsInvalidArgument(builder->build(b.input(), &md),
                                {"batch.replay_start: expected num_reqs = 3 entries", "got 2"}));
}

TEST(BoundedReplayErrors, PaddingRequestsReplayNothing) {
  auto builder = cpu_builder(testing::small_config(8, 4));
  TestBatch b(4);
  b.add_request(11, 1, {7, 3, 9}).add_padding_request();
  b.replay_start = {3, 1};
  SwaMetadata md;
  EXPECT_TRUE(IsInvalidArgument(builder->build(b.input(), &md),
                                {"batch.replay_start[1]", "0 - 0 = 0", "got 1"}));
}

// ---------------------------------------------------------------- draft update

BuilderConfig dspark_config(bool flashinfer_lens) {
  BuilderConfig c = testing::with_dspark(testing::small_config(8, 4), 3);  // theta 4, Wn 64
  c.flashinfer_decode_lens = flashinfer_lens;
  return c;
}

// Example 3: request 0 seq 13 ql 3 (prefix 10), request 1 seq 5 ql 3 (prefix 2).
TestBatch dspark_batch() {
  TestBatch b(4);
  b.add_request(13, 3, {7, 3, 9, 2, 4}).add_request(5, 3, {5, 11, 6}).set_causal(false);
  return b;
}

TEST(DraftUpdate, NonCausalBuildStaysNonCausal) {
  auto builder = cpu_builder(dspark_config(false));
  TestBatch b = dspark_batch();
  SwaMetadata md = build_ok(*builder, b.input());
  ASSERT_EQ(lens_of(md.decode_swa), (Row{11, 11, 11, 5, 5, 5}));
  // The draft loop advanced both requests by one token: request 0 prefix 11 sees 3..13, request
  // 1 prefix 3 sees 0..5; every token of a block keeps the block's row, width Wn = 64.
  b.seq_lens = {14, 6};
  SPARSE_SWA_ASSERT_OK(builder->update_draft_decode_rows(b.input(), &md));
  EXPECT_EQ(md.decode_swa_width(), 64);
  EXPECT_EQ(md.decode_swa.window, 8);
  EXPECT_EQ(lens_of(md.decode_swa), (Row{11, 11, 11, 6, 6, 6}));
  for (int t = 0; t < 3; ++t) EXPECT_EQ(row_of(md.decode_swa, t), slots(b, 0, 3, 14, 64));
  for (int t = 3; t < 6; ++t) EXPECT_EQ(row_of(md.decode_swa, t), slots(b, 1, 0, 6, 64));
  EXPECT_FALSE(md.tile_schedulers.empty());
}

TEST(DraftUpdate, FlashInferLensOfANonCausalBuildAndItsUpdate) {
  auto builder = cpu_builder(dspark_config(true));
  TestBatch b = dspark_batch();
  SwaMetadata md = build_ok(*builder, b.input());
  ASSERT_TRUE(md.has_flashinfer_decode_lens());
  // max(lens, W = 8) and the seq_len of each token's request.
  EXPECT_EQ(to_vector(md.flashinfer_decode_topk_lens), (Row{11, 11, 11, 8, 8, 8}));
  EXPECT_EQ(to_vector(md.flashinfer_decode_seq_lens), (Row{13, 13, 13, 5, 5, 5}));
  b.seq_lens = {14, 6};
  b.invalidate(4);
  SPARSE_SWA_ASSERT_OK(builder->update_draft_decode_rows(b.input(), &md));
  EXPECT_EQ(lens_of(md.decode_swa), (Row{11, 11, 11, 6, 0, 6}));
  // An invalid token has lens 0, lifted to W by the max.
  EXPECT_EQ(to_vector(md.flashinfer_decode_topk_lens), (Row{11, 11, 11, 8, 8, 8}));
  EXPECT_EQ(to_vector(md.flashinfer_decode_seq_lens), (Row{14, 14, 14, 6, 6, 6}));
}

TEST(DraftUpdate, FlashInferLensOnlyOnNonCausalSteps) {
  auto builder = cpu_builder(dspark_config(true));
  TestBatch b = dspark_batch();
  b.set_causal(true);
  const SwaMetadata md = build_ok(*builder, b.input());
  EXPECT_FALSE(md.has_flashinfer_decode_lens());
  EXPECT_TRUE(md.flashinfer_decode_seq_lens.empty());
  // A config that does not ask for them: none on a non-causal step either.
  auto plain = cpu_builder(dspark_config(false));
  b.set_causal(false);
  EXPECT_FALSE(build_ok(*plain, b.input()).has_flashinfer_decode_lens());
}

// Example 2: two real decodes padded to four requests and four tokens.
TestBatch padded_batch() {
  TestBatch b(4);
  b.add_request(3, 1, {7, 3, 9, 2}).add_request(9, 1, {5, 11, 6, 0});
  b.add_padding_request().add_padding_request().pad_tokens(2);
  return b;
}

TEST(DraftUpdate, PaddingTokensMapToTheLastRequest) {
  auto builder = cpu_builder(testing::small_config(8, 4));
  TestBatch b = padded_batch();
  SwaMetadata md = build_ok(*builder, b.input());
  ASSERT_EQ(md.num_decode_tokens, 4);
  EXPECT_EQ(to_vector(md.token_to_req_indices), (Row{0, 1, 0, 0}));
  b.seq_lens = {4, 10, 0, 0};
  SPARSE_SWA_ASSERT_OK(builder->update_draft_decode_rows(b.input(), &md));
  EXPECT_EQ(to_vector(md.token_to_req_indices), (Row{0, 1, 3, 3}));
  EXPECT_EQ(validity(md), (std::vector<uint8_t>{1, 1, 0, 0}));
  EXPECT_EQ(lens_of(md.decode_swa), (Row{4, 8, 0, 0}));
  EXPECT_EQ(row_of(md.decode_swa, 0), (Row{28, 29, 30, 31, -1, -1, -1, -1}));
  EXPECT_EQ(row_of(md.decode_swa, 1), (Row{22, 23, 44, 45, 46, 47, 24, 25}));
}

TEST(DraftUpdate, ReadsTheCurrentQueryStartLocAndSlotMapping) {
  // A graph captured over a dummy batch replays over another padding: request 1 emptied, its
  // token turned padding (slot -1). The update follows the arrays, not the build.
  auto builder = cpu_builder(testing::small_config(8, 4));
  TestBatch b = padded_batch();
  SwaMetadata md = build_ok(*builder, b.input());
  b.query_start_loc = {0, 1, 1, 1, 1};
  b.seq_lens = {4, 0, 0, 0};
  b.slot_mapping = {31, -1, -1, -1};
  SPARSE_SWA_ASSERT_OK(builder->update_draft_decode_rows(b.input(), &md));
  EXPECT_EQ(to_vector(md.token_to_req_indices), (Row{0, 3, 3, 3}));
  EXPECT_EQ(validity(md), (std::vector<uint8_t>{1, 0, 0, 0}));
  EXPECT_EQ(lens_of(md.decode_swa), (Row{4, 0, 0, 0}));
  EXPECT_EQ(row_of(md.decode_swa, 1), Row(8, -1));
}

TEST(DraftUpdate, ValidityOfEveryTokenFollowsTheSlotMapping) {
  // One decode and one prefill: the update rewrites the validity of the prefill token too (its
  // row stays the build's), as the reference does.
  auto builder = cpu_builder(testing::small_config(8, 4));
  TestBatch b(4);
  b.add_request(11, 1, {7, 3, 9, 2}).add_request(6, 2, {5, 11});
  SwaMetadata md = build_ok(*builder, b.input());
  ASSERT_EQ(md.num_decode_tokens, 1);
  const Row prefill_lens = lens_of(md.prefill_swa);
  b.invalidate(2);
  SPARSE_SWA_ASSERT_OK(builder->update_draft_decode_rows(b.input(), &md));
  EXPECT_EQ(validity(md), (std::vector<uint8_t>{1, 1, 0}));
  EXPECT_EQ(lens_of(md.prefill_swa), prefill_lens);
}

TEST(DraftUpdate, CausalRowsKeepTheBuildsReplayStart) {
  auto builder = cpu_builder(testing::with_mtp(testing::small_config(8, 4), 1));
  TestBatch b(4);
  b.add_request(11, 1, {7, 3, 9, 2}).add_request(6, 2, {5, 11, 6, 0});
  b.replay_start = {5, 4};
  SwaMetadata md = build_ok(*builder, b.input());
  b.seq_lens = {12, 7};
  b.replay_start.clear();  // not read by the update: the build's applies
  SPARSE_SWA_ASSERT_OK(builder->update_draft_decode_rows(b.input(), &md));
  // Request 0 at 11: max(4, 5) = 5; request 1 at 5, 6: from 4.
  EXPECT_EQ(lens_of(md.decode_swa), (Row{7, 2, 3}));
  EXPECT_EQ(row_of(md.decode_swa, 0), slots(b, 0, 5, 12, 8));
  EXPECT_EQ(to_vector(md.replay_start), (Row{5, 4}));
}

TEST(DraftUpdate, AcceptsHostCopiesAsTheBuildLeftThem) {
  // vLLM's draft loop advances the device arrays in place and leaves the host copies alone.
  auto builder = cpu_builder(testing::with_mtp(testing::small_config(8, 4), 1));
  TestBatch b(4);
  b.add_request(5, 1, {7, 3}).add_request(6, 2, {5, 11});
  const std::vector<int32_t> qsl_host = b.query_start_loc, seq_host = b.seq_lens;
  BatchInput in = b.input();
  in.query_start_loc_host = qsl_host;
  in.seq_lens_host = seq_host;
  SwaMetadata md = build_ok(*builder, in);
  b.seq_lens = {7, 7};
  in = b.input();
  in.query_start_loc_host = qsl_host;
  in.seq_lens_host = seq_host;  // 5, 6: stale
  SPARSE_SWA_ASSERT_OK(builder->update_draft_decode_rows(in, &md));
  EXPECT_EQ(lens_of(md.decode_swa), (Row{7, 6, 7}));
  // The build itself still requires equal copies on the CPU.
  SwaMetadata out;
  EXPECT_TRUE(
      IsInvalidArgument(builder->build(in, &out),
                        {"batch.seq_lens_host[0]: expected batch.seq_lens[0] = 7", "got 5"}));
}

TEST(DraftUpdateErrors, BuildsReplayStartPastTheCurrentPrefix) {
  auto builder = cpu_builder(testing::with_mtp(testing::small_config(8, 4), 1));
  TestBatch b(4);
  b.add_request(11, 1, {7, 3, 9, 2});
  b.replay_start = {10};
  SwaMetadata md = build_ok(*builder, b.input());
  const Row lens = lens_of(md.decode_swa);
  b.seq_lens = {10};  // shrunk: the prefix 9 lies below the build's replay start
  EXPECT_TRUE(IsInvalidArgument(builder->update_draft_decode_rows(b.input(), &md),
                                {"batch.replay_start[0]", "10 - 1 = 9", "got 10"}));
  EXPECT_EQ(lens_of(md.decode_swa), lens);
}

TEST(DraftUpdateErrors, NonCausalRowWiderThanItsWidth) {
  // A query_start_loc that gives a decode token's request more tokens than the build's split
  // allowed makes a non-causal row of min(prefix, W) + ql entries: past Wn, an error.
  BuilderConfig c = testing::with_dspark(testing::small_config(8, 4, 128), 3);
  c.noncausal_index_width = 12;  // W + theta
  auto builder = cpu_builder(c);
  TestBatch b(4);
  std::vector<int32_t> pages(8);
  for (int i = 0; i < 8; ++i) pages[i] = i;
  b.add_request(14, 4, pages).add_request(5, 1, pages).set_causal(false);
  SwaMetadata md = build_ok(*builder, b.input());
  ASSERT_EQ(md.num_decode_tokens, 5);
  b.query_start_loc = {0, 5, 5};  // request 0 now holds all five tokens
  b.seq_lens = {15, 0};
  EXPECT_TRUE(IsInvalidArgument(builder->update_draft_decode_rows(b.input(), &md),
                                {"batch.query_start_loc[1]", "fit its row of width 12",
                                 "query length 5", "window of 13 positions"}));
}

// ---------------------------------------------------------------- decode threshold

TEST(DecodeThreshold, ParallelDraftingCountsTheMaskSlotsOnlyOnRunnerV1) {
  BuilderConfig c = testing::with_mtp(testing::small_config(8, 4), 2, /*parallel=*/true);
  EXPECT_EQ(derive_config(c).decode_threshold, 5);  // 1 + 2k
  c.model_runner_v2 = true;
  EXPECT_EQ(derive_config(c).decode_threshold, 3);  // 1 + k
  c.parallel_drafting = false;
  EXPECT_EQ(derive_config(c).decode_threshold, 3);
  c.model_runner_v2 = false;
  EXPECT_EQ(derive_config(c).decode_threshold, 3);
}

TEST(DecodeThreshold, SplitFollowsTheRunner) {
  BuilderConfig c = testing::with_mtp(testing::small_config(8, 4), 2, /*parallel=*/true);
  TestBatch b(4);
  b.add_request(11, 3, {7, 3, 9}).add_request(6, 4, {5, 11});
  const SwaMetadata v1 = build_ok(*cpu_builder(c), b.input());
  EXPECT_EQ(v1.num_decodes, 2);  // ql 4 <= 5
  EXPECT_EQ(v1.max_decode_query_len, 4);
  c.model_runner_v2 = true;
  const SwaMetadata v2 = build_ok(*cpu_builder(c), b.input());
  EXPECT_EQ(v2.num_decodes, 1);  // ql 4 > 3: a prefill
  EXPECT_EQ(v2.num_decode_tokens, 3);
  EXPECT_EQ(v2.max_decode_query_len, 3);
}

// ---------------------------------------------------------------- image widening switch

TEST(ImageWideningSwitch, VisionV41RowsArePlainCausalWindows) {
  BuilderConfig c = testing::with_images(testing::small_config(4, 4), 8);
  c.widen_image_spans = false;
  EXPECT_EQ(derive_config(c).prefill_index_width, 4);
  auto builder = cpu_builder(c);
  TestBatch b(4);
  b.add_identity_request(10, 10).add_image_span(0, 1, 8);
  const SwaMetadata md = build_ok(*builder, b.input());
  EXPECT_FALSE(md.has_image());
  EXPECT_EQ(md.prefill_swa.width, 4);
  EXPECT_EQ(lens_of(md.prefill_swa), (Row{1, 2, 3, 4, 4, 4, 4, 4, 4, 4}));
  EXPECT_EQ(row_of(md.prefill_swa, 8), positions(5, 9, 4));
}

TEST(ImageWideningSwitch, SpansAreNotReadSoNotChecked) {
  BuilderConfig c = testing::small_config(4, 4);  // Mi = 0
  c.widen_image_spans = false;
  auto builder = cpu_builder(c);
  TestBatch b(4);
  b.add_identity_request(10, 10).add_image_span(0, 7, 2).add_image_span(3, 0, 100);
  EXPECT_EQ(lens_of(build_ok(*builder, b.input()).prefill_swa),
            (Row{1, 2, 3, 4, 4, 4, 4, 4, 4, 4}));
  // A widening text model still refuses any span.
  c.widen_image_spans = true;
  SwaMetadata md;
  EXPECT_TRUE(IsInvalidArgument(cpu_builder(c)->build(b.input(), &md),
                                {"batch.image_spans", "max_image_tokens = 0"}));
}

}  // namespace
}  // namespace sparse_swa
