// SPDX-License-Identifier: Apache-2.0
// One test per malformed-batch error (docs/errors.md): each checks the status code, that the
// message names the field, the expected and the actual value, and that nothing was written
// (the previous build's outputs and the persistent buffers are unchanged).
#include <gtest/gtest.h>

#include <climits>
#include <initializer_list>
#include <string>
#include <vector>

#include "sparse_swa/metadata_builder.h"
#include "support/metadata_snapshot.h"
#include "support/status_matchers.h"
#include "testing/test_batch.h"

namespace sparse_swa {
namespace {

using testing::capture_buffers;
using testing::cpu_builder;
using testing::first_difference;
using testing::IsInvalidArgument;
using testing::snapshot;
using testing::TestBatch;

constexpr int32_t kMaxTokens = 32;
constexpr int32_t kMaxSeqs = 4;

BuilderConfig error_config() {
  BuilderConfig c;
  c.window_size = 8;
  c.block_size = 4;
  c.max_num_batched_tokens = kMaxTokens;
  c.max_num_seqs = kMaxSeqs;
  c.max_model_len = 64;
  c.speculative_method = SpeculativeMethod::kDspark;
  c.num_speculative_tokens = 1;  // theta 2
  c.max_image_tokens = 4;        // prefill width 12
  c.compress_ratios = {1, 4};
  return c;
}

// Decodes at positions 10 and 4..5, a prefill at 6..9 with an image at 6..8: every buffer
// (decode rows, prefill rows, visibility) holds values after it.
TestBatch good_batch() {
  TestBatch b(4);
  b.add_request(11, 1, {7, 3, 9, 2})
      .add_request(6, 2, {5, 11, 6, 0})
      .add_request(10, 4, {1, 4, 8, 0})
      .add_image_span(2, 6, 8);
  return b;
}

class BuildErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    builder_ = cpu_builder(error_config());
    good_ = good_batch();
    SPARSE_SWA_ASSERT_OK(builder_->build(good_.input(), &md_));
    ASSERT_TRUE(md_.has_image());
    before_ = snapshot(md_);
    buffers_ = capture_buffers(md_, kMaxTokens);
  }

  // Builds `bad` into a copy of the last metadata and checks the error and that nothing changed.
  void expect_rejected(const TestBatch& bad, std::initializer_list<std::string> fragments) {
    expect_rejected(bad.input(), fragments);
  }
  void expect_rejected(const BatchInput& bad, std::initializer_list<std::string> fragments) {
    SwaMetadata out = md_;
    EXPECT_TRUE(IsInvalidArgument(builder_->build(bad, &out), fragments));
    EXPECT_EQ(first_difference(snapshot(out), before_), "") << "the output metadata changed";
    EXPECT_EQ(first_difference(snapshot(md_), before_), "") << "the previous views changed";
    EXPECT_TRUE(capture_buffers(md_, kMaxTokens) == buffers_) << "a persistent buffer changed";
  }

  std::unique_ptr<MetadataBuilder> builder_;
  TestBatch good_{4};
  SwaMetadata md_;
  testing::MetadataSnapshot before_;
  testing::BufferImage buffers_;
};

// ---------------------------------------------------------------- query_start_loc

TEST_F(BuildErrors, QueryStartLocNotStartingAtZero) {
  TestBatch bad = good_;
  bad.query_start_loc = {1, 2, 4, 7};
  expect_rejected(bad, {"batch.query_start_loc[0]", "expected 0", "got 1"});
}

TEST_F(BuildErrors, QueryStartLocDecreasing) {
  TestBatch bad = good_;
  bad.query_start_loc = {0, 3, 1, 7};
  expect_rejected(bad, {"batch.query_start_loc[2]", "expected >=", "3", "got 1"});
}

TEST_F(BuildErrors, QueryStartLocWrongLength) {
  TestBatch bad = good_;
  bad.query_start_loc.pop_back();
  expect_rejected(bad, {"batch.query_start_loc", "expected num_reqs + 1 = 4", "got 3"});
}

TEST_F(BuildErrors, QueryStartLocEmpty) {
  TestBatch bad(4);
  bad.query_start_loc.clear();
  expect_rejected(bad, {"batch.query_start_loc", "expected num_reqs + 1 = 1", "got 0"});
}

TEST_F(BuildErrors, QueryStartLocDisagreesWithItsHostCopy) {
  // The CPU backend reads both: the split from the copy, the rows from the array. A copy with
  // the array's total but other spans must not pass.
  const std::vector<int32_t> host_qsl = {0, 2, 3, 7};
  BatchInput in = good_.input();
  in.query_start_loc_host = host_qsl;
  expect_rejected(
      in, {"batch.query_start_loc_host[1]", "expected batch.query_start_loc[1] = 1", "got 2"});
}

TEST_F(BuildErrors, QueryStartLocDisagreesWithItsHostCopyOnTheTotal) {
  const std::vector<int32_t> host_qsl = {0, 1, 3, 6};
  BatchInput in = good_.input();
  in.query_start_loc_host = host_qsl;
  expect_rejected(
      in, {"batch.query_start_loc_host[3]", "expected batch.query_start_loc[3] = 7", "got 6"});
}

TEST_F(BuildErrors, SeqLensDisagreesWithItsHostCopy) {
  const std::vector<int32_t> host_seq = {11, 6, 12};  // valid on its own
  BatchInput in = good_.input();
  in.seq_lens_host = host_seq;
  expect_rejected(in, {"batch.seq_lens_host[2]", "expected batch.seq_lens[2] = 10", "got 12"});
}

TEST(BuildHostCopies, EqualHostCopiesGiveTheSameMetadata) {
  const TestBatch b = good_batch();
  const std::vector<int32_t> host_qsl = b.query_start_loc, host_seq = b.seq_lens;
  BatchInput in = b.input();
  in.query_start_loc_host = host_qsl;
  in.seq_lens_host = host_seq;
  auto with = cpu_builder(error_config()), without = cpu_builder(error_config());
  SwaMetadata a, c;
  SPARSE_SWA_ASSERT_OK(with->build(in, &a));
  SPARSE_SWA_ASSERT_OK(without->build(b.input(), &c));
  EXPECT_EQ(first_difference(snapshot(a), snapshot(c)), "");
}

// ---------------------------------------------------------------- seq_lens / requests

TEST_F(BuildErrors, SeqLenSmallerThanQueryLen) {
  TestBatch bad = good_;
  bad.seq_lens[1] = 1;  // query length 2
  expect_rejected(bad, {"batch.seq_lens[1]", "expected >= the query length 2", "got 1"});
}

TEST_F(BuildErrors, NegativeSeqLenOfAPaddingRequest) {
  TestBatch bad = good_;
  bad.add_padding_request();
  bad.seq_lens[3] = -1;
  expect_rejected(bad, {"batch.seq_lens[3]", "expected >= the query length 0", "got -1"});
}

TEST_F(BuildErrors, MoreRequestsThanMaxNumSeqs) {
  TestBatch bad = good_;
  bad.add_request(3, 3, {1}).add_request(3, 3, {2});
  expect_rejected(bad, {"batch.seq_lens", "expected at most max_num_seqs = 4", "got 5"});
}

// ---------------------------------------------------------------- slot_mapping / tokens

TEST_F(BuildErrors, FewerTokensThanQueryStartLocTotal) {
  TestBatch bad = good_;
  bad.slot_mapping.pop_back();
  expect_rejected(bad, {"batch.slot_mapping", "expected at least query_start_loc[3] = 7", "got 6"});
}

TEST_F(BuildErrors, MoreTokensThanMaxNumBatchedTokens) {
  TestBatch bad = good_;
  bad.pad_tokens(kMaxTokens + 1 - bad.num_tokens());
  expect_rejected(bad,
                  {"batch.slot_mapping", "expected at most max_num_batched_tokens = 32", "got 33"});
}

TEST_F(BuildErrors, PaddingTokenWithARealSlot) {
  TestBatch bad = good_;
  bad.pad_tokens(2);
  bad.slot_mapping[8] = 5;
  expect_rejected(bad, {"batch.slot_mapping[8]", "CUDA-graph padding", "must be -1", "got 5"});
}

TEST_F(BuildErrors, SlotBelowMinusOne) {
  TestBatch bad = good_;
  bad.slot_mapping[3] = -2;
  expect_rejected(bad, {"batch.slot_mapping[3]", "expected a slot >= 0 or -1", "got -2"});
}

// ---------------------------------------------------------------- block_table

TEST_F(BuildErrors, BlockTableRowTooShort) {
  TestBatch bad = good_;
  bad.max_block_table_cols = 2;  // request 0 has 11 tokens: ceil(11 / 4) = 3 pages
  expect_rejected(bad, {"batch.block_table[0]", "ceil(seq_lens[0] / block_size)", "= 3", "got 2"});
}

TEST_F(BuildErrors, BlockTableWithFewerRowsThanRequests) {
  BatchInput in = good_.input();
  in.block_table.rows = 2;
  expect_rejected(in, {"batch.block_table", "expected at least num_reqs = 3", "got 2"});
}

TEST_F(BuildErrors, NegativePageInsideAWindow) {
  TestBatch bad = good_;
  bad.pages[0][1] = -1;  // request 0's window (positions 3..10) reads page 1
  expect_rejected(bad, {"batch.block_table[0][1]", "expected a block id >= 0", "got -1"});
}

TEST_F(BuildErrors, NegativePageOfAPrefillWindow) {
  TestBatch bad = good_;
  bad.pages[2][0] = -7;  // prefill position 6 reads positions 0..6
  expect_rejected(bad, {"batch.block_table[2][0]", "expected a block id >= 0", "got -7"});
}

TEST_F(BuildErrors, SlotIdOverflowingInt32) {
  TestBatch bad = good_;
  bad.pages[0][2] = INT32_MAX / 4 + 1;  // 536870912 * 4 + 3 > 2^31 - 1
  expect_rejected(bad, {"batch.block_table[0][2]", "536870912", "overflows an int32 slot id"});
}

TEST(BuildErrorsOutsideWindows, NegativePageNoWindowReadsIsAccepted) {
  // Sliding-window freeing may leave pages before every window invalid; they must not be read.
  BuilderConfig c = error_config();
  c.window_size = 4;
  auto builder = cpu_builder(c);
  TestBatch b(4);
  b.add_request(11, 1, {-1, 3, 9});  // pos 10 reads positions 7..10: pages 1 and 2
  SwaMetadata md;
  SPARSE_SWA_EXPECT_OK(builder->build(b.input(), &md));
  EXPECT_EQ(testing::row_of(md.decode_swa, 0), (std::vector<int32_t>{15, 36, 37, 38}));
}

// ---------------------------------------------------------------- image spans

TEST_F(BuildErrors, ImageSpanLongerThanMaxImageTokens) {
  TestBatch bad = good_;
  bad.image_spans = {{2, 2, 7}};
  expect_rejected(bad, {"batch.image_spans[0]", "expected at most max_image_tokens = 4", "got 6"});
}

TEST_F(BuildErrors, ImageSpanReversed) {
  TestBatch bad = good_;
  bad.image_spans = {{2, 8, 6}};
  expect_rejected(bad, {"batch.image_spans[0]", "expected 0 <= start <= end", "got [8, 6]"});
}

TEST_F(BuildErrors, ImageSpanWithNegativeStart) {
  TestBatch bad = good_;
  bad.image_spans = {{2, -1, 1}};
  expect_rejected(bad, {"batch.image_spans[0]", "expected 0 <= start <= end", "got [-1, 1]"});
}

TEST_F(BuildErrors, ImageSpansOverlapping) {
  TestBatch bad = good_;
  bad.image_spans = {{2, 8, 9}, {0, 1, 2}, {2, 6, 8}};
  expect_rejected(bad, {"batch.image_spans[0]", "overlaps span [6, 8]", "got [8, 9]"});
}

TEST_F(BuildErrors, ImageSpanPastTheSequence) {
  TestBatch bad = good_;
  bad.image_spans = {{2, 8, 10}};  // seq_len 10
  expect_rejected(bad, {"batch.image_spans[0]", "expected end < seq_lens[2] = 10", "got [8, 10]"});
}

TEST_F(BuildErrors, ImageSpanOfAMissingRequest) {
  TestBatch bad = good_;
  bad.image_spans = {{2, 6, 8}, {3, 0, 1}};
  expect_rejected(bad, {"batch.image_spans[1].request", "expected 0..2", "got 3"});
}

TEST_F(BuildErrors, MoreImageSpansThanCapacity) {
  TestBatch bad = good_;
  bad.image_spans.assign(kMaxTokens + 1, {0, 0, 0});
  expect_rejected(bad, {"batch.image_spans", "expected at most 32 spans", "got 33"});
}

TEST(BuildErrorsTextModel, ImageSpanOnATextModel) {
  BuilderConfig c = error_config();
  c.max_image_tokens = 0;
  auto builder = cpu_builder(c);
  TestBatch bad = good_batch();
  SwaMetadata md;
  EXPECT_TRUE(IsInvalidArgument(builder->build(bad.input(), &md),
                                {"batch.image_spans", "max_image_tokens = 0", "got 1"}));
}

// ---------------------------------------------------------------- causal flag

TEST(BuildErrorsCausal, NonCausalWithoutDspark) {
  BuilderConfig c = error_config();
  c.speculative_method = SpeculativeMethod::kMtp;
  auto builder = cpu_builder(c);
  TestBatch bad = good_batch();
  bad.set_causal(false);
  SwaMetadata md;
  EXPECT_TRUE(
      IsInvalidArgument(builder->build(bad.input(), &md), {"batch.causal", "dspark", "got mtp"}));
}

TEST(BuildErrorsCausal, NonCausalWithoutDsparkAndNoDecodeTokens) {
  // The reference only asserts when there are decode tokens; we reject the step either way.
  BuilderConfig c = error_config();
  c.speculative_method = SpeculativeMethod::kNone;
  c.num_speculative_tokens = 0;
  auto builder = cpu_builder(c);
  TestBatch bad(4);
  bad.add_request(10, 4, {1, 4, 8}).set_causal(false);
  SwaMetadata md;
  EXPECT_TRUE(
      IsInvalidArgument(builder->build(bad.input(), &md), {"batch.causal", "dspark", "got none"}));
}

// ---------------------------------------------------------------- position arithmetic

TEST(BuildErrorsOverflow, PaddingTokensOfARequestEndingAtInt32Max) {
  // Request 0 ends at position 2^31 - 2; padding tokens map to request 0, so the image path's
  // per-token position seq_len - query_len + (t - query_start) would pass 2^31 - 1 for them.
  // Acceptable outcomes: a clear error naming a batch field, or a build whose padding rows are
  // cleared. Run under SPARSE_SWA_SANITIZE=ON to catch a signed overflow on the way.
  BuilderConfig c = error_config();
  c.block_size = 1 << 30;
  auto builder = cpu_builder(c);
  TestBatch b(1 << 30);
  b.add_request(INT32_MAX, 1, {0, 1}).add_request(3, 3, {0}).add_image_span(1, 0, 1).pad_tokens(3);
  SwaMetadata md;
  const Status st = builder->build(b.input(), &md);
  if (!st.ok()) {
    EXPECT_TRUE(IsInvalidArgument(st, {"batch."}));
    return;
  }
  ASSERT_EQ(md.num_prefill_tokens, 6);
  ASSERT_TRUE(md.has_image());
  for (int p = 3; p < 6; ++p) {
    EXPECT_EQ(md.prefill_swa.lens[p], 0);
    EXPECT_EQ(md.prefill_swa.row(p)[0], -1);
    // Past the end of request 0's span list: no in-image visibility.
    EXPECT_EQ(md.left_visible[1 + p], 0);
    EXPECT_EQ(md.right_visible[1 + p], 0);
  }
  EXPECT_EQ(md.decode_swa.lens[0], 8);
}

// ---------------------------------------------------------------- chunk plan

TEST_F(BuildErrors, ChunkPlanUnsupportedRatio) {
  for (int64_t ratio : {0, 3, 8, 64, -4}) {
    auto plan = prefill_chunk_plan(md_, ratio, 4);
    EXPECT_TRUE(IsInvalidArgument(plan.status(), {"chunk_plan.compress_ratio", "{1, 2, 4, 128}",
                                                  "got " + std::to_string(ratio)}));
  }
}

TEST_F(BuildErrors, ChunkPlanChunkSizeBelowOne) {
  for (int64_t chunk : {0, -1}) {
    auto plan = prefill_chunk_plan(md_, 4, chunk);
    EXPECT_TRUE(IsInvalidArgument(
        plan.status(), {"chunk_plan.chunk_size", "expected >= 1", "got " + std::to_string(chunk)}));
  }
}

// ---------------------------------------------------------------- inputs overlapping outputs

// A build's output passed back as the next step's input: the builder would overwrite what it
// still reads (the decode lens are written while seq_lens are read).
TEST_F(BuildErrors, SeqLensOverlappingTheDecodeLens) {
  BatchInput in = good_.input();
  in.seq_lens = {md_.decode_swa.lens, 3};
  expect_rejected(in, {"batch.seq_lens: expected memory outside the builder's own buffers",
                       "overlapping its decode_swa.lens", "pass a copy"});
}

TEST_F(BuildErrors, SeqLensOverlappingThePrefillLens) {
  BatchInput in = good_.input();
  in.seq_lens = {md_.prefill_swa.lens + 1, 3};  // overlapping, not starting at the buffer
  expect_rejected(in, {"batch.seq_lens", "overlapping its prefill_swa.lens"});
}

TEST_F(BuildErrors, EveryBatchArrayIsCheckedForOverlap) {
  const BatchInput good = good_.input();
  {
    BatchInput in = good;
    in.query_start_loc = {md_.token_to_req_indices.data(), 4};
    expect_rejected(in, {"batch.query_start_loc", "overlapping its token_to_req_indices"});
  }
  {
    BatchInput in = good;
    in.block_table = {md_.prefill_gather_lens.data(), 3, 4, 4, MemorySpace::kHost};
    expect_rejected(in, {"batch.block_table", "overlapping its prefill_gather_lens"});
  }
  {
    BatchInput in = good;
    in.slot_mapping = {reinterpret_cast<const int64_t*>(md_.decode_swa.data), 7};
    expect_rejected(in, {"batch.slot_mapping", "overlapping its decode_swa.data"});
  }
  {
    BatchInput in = good;
    in.query_start_loc_host = {md_.prefill_query_lens_host.data(), 4};
    expect_rejected(in, {"batch.query_start_loc_host", "overlapping its prefill_query_lens_host"});
  }
  {
    BatchInput in = good;
    in.seq_lens_host = {md_.left_visible.data(), 3};
    expect_rejected(in, {"batch.seq_lens_host", "overlapping its left_visible"});
  }
}

// ---------------------------------------------------------------- update_draft_decode_rows

TEST_F(BuildErrors, UpdateDraftRowsWithNullMetadata) {
  EXPECT_TRUE(IsInvalidArgument(builder_->update_draft_decode_rows(good_.input(), nullptr),
                                {"metadata", "got null"}));
}

TEST_F(BuildErrors, UpdateDraftRowsWithAnotherBuildersMetadata) {
  auto other = cpu_builder(error_config());
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(other->build(good_.input(), &md));
  EXPECT_TRUE(IsInvalidArgument(builder_->update_draft_decode_rows(good_.input(), &md),
                                {"metadata.decode_swa", "this builder's last build()"}));
}

TEST_F(BuildErrors, UpdateDraftRowsWithADifferentShape) {
  TestBatch bigger = good_;
  bigger.pad_tokens(1);
  SwaMetadata md = md_;
  EXPECT_TRUE(IsInvalidArgument(builder_->update_draft_decode_rows(bigger.input(), &md),
                                {"batch", "3 requests, 7 tokens", "got 3 requests, 8 tokens"}));
  EXPECT_TRUE(capture_buffers(md_, kMaxTokens) == buffers_);
}

TEST_F(BuildErrors, UpdateDraftRowsWithEditedMetadata) {
  SwaMetadata md = md_;
  md.num_decode_tokens = kMaxTokens;
  md.decode_swa.rows = kMaxTokens;
  EXPECT_TRUE(
      IsInvalidArgument(builder_->update_draft_decode_rows(good_.input(), &md),
                        {"metadata.num_decode_tokens", "expected the last build's 3", "got 32"}));
  md = md_;
  md.decode_swa.width = 64;
  md.decode_swa.row_stride = 64;
  EXPECT_TRUE(
      IsInvalidArgument(builder_->update_draft_decode_rows(good_.input(), &md),
                        {"metadata.decode_swa.width", "expected the last build's 8", "got 64"}));
  md = md_;
  md.decode_swa.lens = md_.prefill_swa.lens;
  EXPECT_TRUE(IsInvalidArgument(builder_->update_draft_decode_rows(good_.input(), &md),
                                {"metadata.decode_swa", "this builder's last build()"}));
  EXPECT_TRUE(capture_buffers(md_, kMaxTokens) == buffers_);
}

TEST_F(BuildErrors, UpdateDraftRowsWithSeqLensOverlappingTheDecodeLens) {
  BatchInput in = good_.input();
  in.seq_lens = {md_.decode_swa.lens, 3};
  SwaMetadata md = md_;
  EXPECT_TRUE(IsInvalidArgument(builder_->update_draft_decode_rows(in, &md),
                                {"batch.seq_lens", "overlapping its decode_swa.lens"}));
  EXPECT_TRUE(capture_buffers(md_, kMaxTokens) == buffers_);
}

TEST(UpdateDraftErrors, MetadataOfAnEarlierBuild) {
  auto builder = cpu_builder(error_config());
  const TestBatch first = good_batch();
  TestBatch second(4);
  second.add_request(9, 1, {4, 5, 6});  // one decode token
  SwaMetadata old_md, md;
  SPARSE_SWA_ASSERT_OK(builder->build(first.input(), &old_md));
  SPARSE_SWA_ASSERT_OK(builder->build(second.input(), &md));
  EXPECT_TRUE(
      IsInvalidArgument(builder->update_draft_decode_rows(first.input(), &old_md),
                        {"metadata.num_decode_tokens", "expected the last build's 1", "got 3"}));
  EXPECT_EQ(testing::lens_of(md.decode_swa), (std::vector<int32_t>{8}));
}

// Spans moved under the same counts: the update maps the decode tokens over the moved spans and
// reads nothing past a request (docs/semantics.md#draft-update).
TEST(UpdateDraftErrors, SpansMovedUnderTheSameCountsAreReadFromTheArrays) {
  BuilderConfig c;
  c.window_size = 8;
  c.block_size = 4;
  c.max_num_batched_tokens = 16;
  c.max_num_seqs = 4;
  c.max_model_len = 64;
  c.speculative_method = SpeculativeMethod::kMtp;
  c.num_speculative_tokens = 10;
  auto builder = cpu_builder(c);
  std::vector<int32_t> bt(8), qsl = {0, 1, 12}, seq = {1, 11};
  std::vector<int64_t> slots(12);
  for (int i = 0; i < 8; ++i) bt[i] = i;
  for (int i = 0; i < 12; ++i) slots[i] = i;
  BatchInput in;
  in.query_start_loc = qsl;
  in.seq_lens = seq;
  in.block_table = {bt.data(), 2, 4, 4, MemorySpace::kHost};
  in.slot_mapping = slots;
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(in, &md));
  ASSERT_EQ(testing::lens_of(md.decode_swa),
            (std::vector<int32_t>{1, 1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8}));

  const std::vector<int32_t> moved_qsl = {0, 11, 12}, moved_seq = {11, 1};
  in.query_start_loc = moved_qsl;
  in.seq_lens = moved_seq;
  SPARSE_SWA_ASSERT_OK(builder->update_draft_decode_rows(in, &md));
  EXPECT_EQ(testing::lens_of(md.decode_swa),
            (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8, 1}));
  EXPECT_EQ(testing::to_vector(md.token_to_req_indices),
            (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}));
  // A moved span whose windows the table does not cover is an error, nothing written.
  const std::vector<int32_t> far_seq = {17, 1};
  in.seq_lens = far_seq;
  const std::vector<int32_t> lens = testing::lens_of(md.decode_swa);
  EXPECT_TRUE(IsInvalidArgument(builder->update_draft_decode_rows(in, &md),
                                {"batch.block_table[0]", "ceil(17 / 4) = 5", "got 4"}));
  EXPECT_EQ(testing::lens_of(md.decode_swa), lens);
}

TEST_F(BuildErrors, UpdateDraftRowsWithAMalformedBatch) {
  TestBatch bad = good_;
  bad.seq_lens[0] = 12;       // advanced ...
  bad.pages[0] = {7, 3, -1};  // ... onto a freed page that its window reads
  SwaMetadata md = md_;
  EXPECT_TRUE(IsInvalidArgument(builder_->update_draft_decode_rows(bad.input(), &md),
                                {"batch.block_table[0][2]", "got -1"}));
  EXPECT_TRUE(capture_buffers(md_, kMaxTokens) == buffers_);
}

}  // namespace
}  // namespace sparse_swa
