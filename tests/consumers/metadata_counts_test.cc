// SPDX-License-Identifier: Apache-2.0
// Caller-supplied metadata whose counts are inconsistent (with each other, with the arrays or
// with int32) is an error before any arithmetic on them, in every consumer. Each test names the
// overflow it guards against; run under SPARSE_SWA_SANITIZE=ON to see UBSan stay quiet.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "sparse_swa/consumers.h"
#include "sparse_swa/metadata_builder.h"
#include "support/status_matchers.h"
#include "testing/test_batch.h"

namespace sparse_swa {
namespace {

using testing::IsInvalidArgument;
using Row = std::vector<int32_t>;

constexpr int32_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int32_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr int32_t kPoison = 0x5a5a5a5a;

// W = 8, B = 4: one decode (request 0) and two prefills (requests 1 and 2), SWA-only.
class MetadataCounts : public ::testing::Test {
 protected:
  void SetUp() override {
    BuilderConfig c;
    c.window_size = 8;
    c.block_size = 4;
    c.max_num_batched_tokens = 16;
    c.max_num_seqs = 4;
    c.max_model_len = 64;
    builder_ = testing::cpu_builder(c);
    SPARSE_SWA_ASSERT_OK(builder_->build(input_, &md_));
    ASSERT_EQ(md_.num_decodes, 1);
    ASSERT_EQ(md_.num_prefills, 2);
    ASSERT_EQ(md_.num_tokens, 6);
  }
  ConsumerStep step(const SwaMetadata& md) const { return {md, input_, 4}; }

  testing::TestBatch batch_ = [] {
    testing::TestBatch b(4);
    b.add_request(11, 1, {7, 3, 9}).add_request(6, 2, {5, 11}).add_request(3, 3, {1});
    return b;
  }();
  BatchInput input_ = batch_.input();
  std::unique_ptr<MetadataBuilder> builder_;
  SwaMetadata md_;
};

// A fuzzed num_decodes of INT32_MAX made the combined prefill's first request
// num_decodes + chunk.start overflow int32 (combined_prefill_shape checked no counts).
TEST_F(MetadataCounts, NumDecodesPastNumReqsIsAnErrorBeforeTheChunkArithmetic) {
  SwaMetadata md = md_;
  md.num_decodes = kInt32Max;
  const ChunkPlanEntry chunk{1, 2, 0, 10};
  const std::vector<std::string> message = {"metadata", "num_decodes + num_prefills <= num_reqs 3",
                                            "got 2147483647 + 2"};
  EXPECT_TRUE(IsInvalidArgument(combined_prefill_shape(md, chunk, 0).status(), message));
  Row out(8 * 128, kPoison), lens(8, kPoison);
  const IndexView view{out.data(), lens.data(), 8, 128, 128, 0, MemorySpace::kHost};
  EXPECT_TRUE(IsInvalidArgument(build_combined_prefill(step(md), chunk, 1, {}, view), message));
  EXPECT_EQ(out, Row(8 * 128, kPoison));
  EXPECT_EQ(lens, Row(8, kPoison));
  // The uncorrupted metadata still plans and builds the chunk.
  SPARSE_SWA_ASSERT_OK(combined_prefill_shape(md_, chunk, 0).status());
}

TEST_F(MetadataCounts, EveryConsumerChecksTheCounts) {
  Row out(8 * 128, kPoison), lens(8, kPoison);
  const IndexView view{out.data(), lens.data(), 8, 128, 128, 0, MemorySpace::kHost};
  const Row table = {0, 1, 2, 3, 4, 5};
  const CompressedCache cache{{table.data(), 3, 2, 2, MemorySpace::kHost}, 2, 4};
  const Row local = {0, 1};
  const MatrixView<const int32_t> local_view{local.data(), 1, 2, 2, MemorySpace::kHost};
  const Row global = {5, 6}, global_lens = {2};
  const ConstIndexView global_view{global.data(),     global_lens.data(), 1, 2, 2, 0,
                                   MemorySpace::kHost};
  struct Case {
    const char* what;
    void (*corrupt)(SwaMetadata*);
    std::vector<std::string> message;
  };
  const std::vector<Case> cases = {
      {"num_reqs INT32_MIN",
       [](SwaMetadata* m) { m->num_reqs = kInt32Min; },
       {"num_reqs, num_tokens >= 0", "got -2147483648, 6"}},
      {"num_tokens -1",
       [](SwaMetadata* m) { m->num_tokens = -1; },
       {"num_reqs, num_tokens >= 0", "got 3, -1"}},
      {"num_prefills INT32_MAX",
       [](SwaMetadata* m) { m->num_prefills = kInt32Max; },
       {"num_decodes + num_prefills <= num_reqs 3", "got 1 + 2147483647"}},
      {"num_prefill_tokens INT32_MAX",
       [](SwaMetadata* m) { m->num_prefill_tokens = kInt32Max; },
       {"num_decode_tokens + num_prefill_tokens = num_tokens 6", "got 1 + 2147483647"}},
      {"num_tokens past the arrays",
       [](SwaMetadata* m) {
         m->num_tokens = 7;
         m->num_prefill_tokens = 6;
       },
       {"metadata.token_to_req_indices / is_valid_token", "expected >= 7", "got 6 / 6"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    SwaMetadata md = md_;
    c.corrupt(&md);
    EXPECT_TRUE(
        IsInvalidArgument(compressed_topk_to_global(md, 0, local_view, cache, view), c.message));
    EXPECT_TRUE(IsInvalidArgument(copy_global_topk(md, 0, global_view, view), c.message));
    EXPECT_TRUE(IsInvalidArgument(build_mixed_matrix(step(md), {}, view), c.message));
    EXPECT_TRUE(
        IsInvalidArgument(combined_prefill_shape(md, {1, 2, 0, 10}, 0).status(), c.message));
    EXPECT_TRUE(
        IsInvalidArgument(build_combined_prefill(step(md), {1, 2, 0, 10}, 1, {}, view), c.message));
    EXPECT_TRUE(IsInvalidArgument(check_prefill_topk(step(md), 1, {}), c.message));
    EXPECT_EQ(out, Row(8 * 128, kPoison));
    EXPECT_EQ(lens, Row(8, kPoison));
  }
}

// query_start_loc's expected size, num_reqs + 1, overflowed int32 inside the error message.
TEST_F(MetadataCounts, NumReqsInt32MaxIsNamedWithoutOverflow) {
  SwaMetadata md = md_;
  md.num_reqs = kInt32Max;
  Row out(8 * 8, kPoison), lens(8, kPoison);
  EXPECT_TRUE(IsInvalidArgument(
      build_mixed_matrix(step(md), {}, {out.data(), lens.data(), 8, 8, 8, 0, MemorySpace::kHost}),
      {"batch: expected the metadata's 2147483647 requests (2147483648 query_start_loc entries)",
       "got 3 seq_lens"}));
}

// total_width is int64: total_width * (end - start) overflowed int64 before the int32 check.
TEST_F(MetadataCounts, ChunkTotalWidthPastInt32IsAnError) {
  for (int64_t m : {int64_t{1} << 62, std::numeric_limits<int64_t>::max()}) {
    EXPECT_TRUE(IsInvalidArgument(combined_prefill_shape(md_, {0, 2, 0, m}, 0).status(),
                                  {"chunk.total_width", "expected <= 2147483647"}));
  }
}

// The prefill top-k plus a prefill view width near INT32_MAX: the shape's width passed int32.
TEST_F(MetadataCounts, CombinedPrefillWidthPastInt32IsAnError) {
  SwaMetadata md = md_;
  md.prefill_swa.width = kInt32Max - 8;
  md.prefill_swa.row_stride = kInt32Max;
  EXPECT_TRUE(IsInvalidArgument(combined_prefill_shape(md, {0, 2, 0, 10}, 0).status(),
                                {"prefill_topk", "rows wider than int32"}));
}

// S + P of the mixed matrix summed in int32; the public shape saturates, the build rejects.
TEST_F(MetadataCounts, MixedMatrixRowPastInt32IsAnError) {
  const MixedMatrixShape shape = mixed_matrix_shape(kInt32Max, kInt32Max, 0);
  EXPECT_EQ(shape.swa_width, kInt32Max);
  EXPECT_EQ(shape.row_width, kInt32Max / 4 * 4);
  EXPECT_EQ(mixed_matrix_shape(5, 3, 7).row_width, 16);  // round_up(5 + 8, 4)

  SwaMetadata md = md_;
  md.decode_swa.width = kInt32Max - 2;  // lens stay <= width; no row is read before the error
  md.decode_swa.row_stride = kInt32Max;
  const Row table = {0, 1, 2, 3, 4, 5};
  const Row decode_local = {0, 1, 2, 3};
  std::vector<Row> prefill(5, Row{0, 1, 2, 3});
  Row prefill_flat;
  for (const Row& r : prefill) prefill_flat.insert(prefill_flat.end(), r.begin(), r.end());
  const CompressedTopk topk{{{table.data(), 3, 2, 2, MemorySpace::kHost}, 2, 4},
                            {decode_local.data(), 1, 4, 4, MemorySpace::kHost},
                            {},
                            {prefill_flat.data(), 5, 4, 4, MemorySpace::kHost}};
  Row out(8 * 8, kPoison), lens(8, kPoison);
  EXPECT_TRUE(IsInvalidArgument(
      build_mixed_matrix(step(md), topk, {out.data(), lens.data(), 8, 8, 8, 0, MemorySpace::kHost}),
      {"mixed matrix: row_width", "S 2147483645 + P 4", "overflows int32"}));
  EXPECT_EQ(out, Row(8 * 8, kPoison));
}

// The chunk plan's budget W + max_num_batched_tokens (+ compressed entries) divided a constant:
// W = -1 with one batched token made it 0 (a division by zero), W = 0 clamped to [0, -1].
TEST_F(MetadataCounts, ChunkPlanConstantsAreChecked) {
  SwaMetadata md = md_;
  md.window_size = -1;
  md.max_num_batched_tokens = 1;
  EXPECT_TRUE(IsInvalidArgument(prefill_chunk_plan(md, 1, 4).status(),
                                {"metadata.window_size", "expected >= 1", "got -1"}));
  md = md_;
  md.max_model_len = std::numeric_limits<int64_t>::max();
  EXPECT_TRUE(IsInvalidArgument(prefill_chunk_plan(md, 128, 4).status(),
                                {"metadata.max_model_len", "got 9223372036854775807"}));
  md = md_;
  md.max_num_batched_tokens = -5;
  EXPECT_TRUE(IsInvalidArgument(prefill_chunk_plan(md, 1, 4).status(),
                                {"metadata.max_num_batched_tokens", "got -5"}));
  Row ql(md_.prefill_query_lens_host.begin(), md_.prefill_query_lens_host.end());
  ql[1] = 4;  // seq_len 3
  md = md_;
  md.prefill_query_lens_host = ql;
  EXPECT_TRUE(IsInvalidArgument(prefill_chunk_plan(md, 1, 4).status(),
                                {"metadata.prefill_query_lens_host[1]", "= 3", "got 4"}));
}

}  // namespace
}  // namespace sparse_swa
