// SPDX-License-Identifier: Apache-2.0
// Golden vectors of docs/semantics.md#worked-examples (examples 1-5). Every expected value below
// is written out by hand from the rules there (slot(r, p) = bt_r[p / B] * B + p % B), never
// produced by this library.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "sparse_swa/metadata_builder.h"
#include "support/metadata_snapshot.h"
#include "support/status_matchers.h"
#include "testing/test_batch.h"

namespace sparse_swa {
namespace {

using testing::cpu_builder;
using testing::lens_of;
using testing::row_of;
using testing::TestBatch;
using testing::to_vector;
using Row = std::vector<int32_t>;

// The examples' common setup: W = 8, B = 4.
const Row kBt0 = {7, 3, 9, 2};
const Row kBt1 = {5, 11, 6, 0};
const Row kBt2 = {1, 4, 8, 0};

BuilderConfig example_config(int32_t window, int32_t block, int32_t max_tokens = 16) {
  BuilderConfig c;
  c.window_size = window;
  c.block_size = block;
  c.max_num_batched_tokens = max_tokens;
  c.max_num_seqs = 8;
  c.max_model_len = 64;
  return c;
}

// `values` followed by -1 up to `width`.
Row padded(Row values, int32_t width) {
  values.resize(width, -1);
  return values;
}

std::vector<uint8_t> validity(const SwaMetadata& md) {
  return std::vector<uint8_t>(md.is_valid_token.begin(), md.is_valid_token.end());
}

// ---------------------------------------------------------------- Example 1

BuilderConfig example1_config() {
  BuilderConfig c = example_config(8, 4);  // max_num_batched_tokens 16, max_model_len 64
  c.speculative_method = SpeculativeMethod::kMtp;
  c.num_speculative_tokens = 1;  // theta = 2
  c.compress_ratios = {1, 4};
  return c;
}

TestBatch example1_batch() {
  TestBatch b(4);
  b.add_request(11, 1, kBt0)      // decode, position 10
      .add_request(6, 2, kBt1)    // MTP decode, positions 4, 5
      .add_request(10, 4, kBt2);  // chunked prefill, positions 6..9
  return b;
}

TEST(GoldenExample1, SlotMappingMatchesTheDocument) {
  EXPECT_EQ(example1_batch().slot_mapping, (std::vector<int64_t>{38, 44, 45, 18, 19, 32, 33}));
}

TEST(GoldenExample1, SplitMappingAndScalars) {
  auto builder = cpu_builder(example1_config());
  TestBatch batch = example1_batch();
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(batch.input(), &md));
  EXPECT_EQ(md.num_decodes, 2);
  EXPECT_EQ(md.num_prefills, 1);
  EXPECT_EQ(md.num_decode_tokens, 3);
  EXPECT_EQ(md.num_prefill_tokens, 4);
  EXPECT_EQ(md.num_tokens, 7);
  EXPECT_EQ(to_vector(md.token_to_req_indices), (Row{0, 1, 1, 2, 2, 2, 2}));
  EXPECT_EQ(validity(md), (std::vector<uint8_t>{1, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(md.max_decode_query_len, 2);  // min(4, theta = 2)
  EXPECT_EQ(md.decode_swa_width(), 8);
  EXPECT_EQ(md.tile_schedulers.sorted_names(), (std::vector<std::string>{"c4a", "swaonly"}));
  EXPECT_FALSE(md.has_image());
}

TEST(GoldenExample1, DecodeRows) {
  auto builder = cpu_builder(example1_config());
  TestBatch batch = example1_batch();
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(batch.input(), &md));
  ASSERT_EQ(md.decode_swa.rows, 3);
  EXPECT_EQ(md.decode_swa.width, 8);
  EXPECT_EQ(md.decode_swa.window, 8);
  EXPECT_EQ(lens_of(md.decode_swa), (Row{8, 5, 6}));
  EXPECT_EQ(row_of(md.decode_swa, 0), (Row{31, 12, 13, 14, 15, 36, 37, 38}));
  EXPECT_EQ(row_of(md.decode_swa, 1), (Row{20, 21, 22, 23, 44, -1, -1, -1}));
  EXPECT_EQ(row_of(md.decode_swa, 2), (Row{20, 21, 22, 23, 44, 45, -1, -1}));
}

TEST(GoldenExample1, PrefillRowsAndGatherLens) {
  auto builder = cpu_builder(example1_config());
  TestBatch batch = example1_batch();
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(batch.input(), &md));
  ASSERT_EQ(md.prefill_swa.rows, 4);
  EXPECT_EQ(md.prefill_swa.width, 8);  // W + Mi, Mi = 0
  EXPECT_EQ(lens_of(md.prefill_swa), (Row{7, 8, 8, 8}));
  EXPECT_EQ(row_of(md.prefill_swa, 0), (Row{4, 5, 6, 7, 16, 17, 18, -1}));
  EXPECT_EQ(row_of(md.prefill_swa, 1), (Row{4, 5, 6, 7, 16, 17, 18, 19}));
  EXPECT_EQ(row_of(md.prefill_swa, 2), (Row{5, 6, 7, 16, 17, 18, 19, 32}));
  EXPECT_EQ(row_of(md.prefill_swa, 3), (Row{6, 7, 16, 17, 18, 19, 32, 33}));
  EXPECT_EQ(to_vector(md.prefill_gather_lens), (Row{10}));  // 4 + min(6, 7)
  EXPECT_EQ(to_vector(md.prefill_seq_lens_host), (Row{10}));
  EXPECT_EQ(to_vector(md.prefill_query_lens_host), (Row{4}));
}

TEST(GoldenExample1, ChunkPlans) {
  auto builder = cpu_builder(example1_config());
  TestBatch batch = example1_batch();
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(batch.input(), &md));
  auto swa_only = prefill_chunk_plan(md, /*compress_ratio=*/1, /*chunk_size=*/4);
  ASSERT_TRUE(swa_only.ok()) << swa_only.status().to_string();
  EXPECT_EQ(swa_only.value(), (std::vector<ChunkPlanEntry>{{0, 1, 0, 10}}));
  auto c4a = prefill_chunk_plan(md, 4, 4);
  ASSERT_TRUE(c4a.ok()) << c4a.status().to_string();
  EXPECT_EQ(c4a.value(), (std::vector<ChunkPlanEntry>{{0, 1, 2, 12}}));  // N = 10 / 4
}

TEST(GoldenExample1, DecodeLensTailIsZeroedAfterABiggerStep) {
  auto builder = cpu_builder(example1_config());
  // A previous step with 12 decode tokens leaves lens in rows 3..11.
  TestBatch big(4);
  for (int r = 0; r < 6; ++r) big.add_request(9, 2, kBt0);
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(big.input(), &md));
  ASSERT_EQ(md.num_decode_tokens, 12);
  ASSERT_EQ(md.decode_swa.lens[11], 8);

  TestBatch batch = example1_batch();
  SPARSE_SWA_ASSERT_OK(builder->build(batch.input(), &md));
  // decode_swa_lens[3:max_num_batched_tokens] = 0 (graph replays may read past Td).
  for (int i = 3; i < 16; ++i)
    EXPECT_EQ(md.decode_swa.lens[i], 0) << "decode_swa_lens[" << i << "]";
}

// ---------------------------------------------------------------- Example 2

TEST(GoldenExample2, PaddedDecodeOnlyBatch) {
  auto builder = cpu_builder(example_config(8, 4));
  TestBatch batch(4);
  batch
      .add_request(3, 1, kBt0)  // position 2
      .add_request(9, 1, kBt1)  // position 8
      .add_padding_request()
      .add_padding_request()
      .pad_tokens(2);
  ASSERT_EQ(batch.query_start_loc, (Row{0, 1, 2, 2, 2}));
  ASSERT_EQ(batch.seq_lens, (Row{3, 9, 0, 0}));
  ASSERT_EQ(batch.slot_mapping, (std::vector<int64_t>{30, 24, -1, -1}));

  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(batch.input(), &md));
  EXPECT_EQ(md.num_decodes, 4);
  EXPECT_EQ(md.num_prefills, 0);
  EXPECT_EQ(md.num_decode_tokens, 4);
  EXPECT_EQ(md.num_prefill_tokens, 0);
  EXPECT_EQ(to_vector(md.token_to_req_indices), (Row{0, 1, 0, 0}));
  EXPECT_EQ(validity(md), (std::vector<uint8_t>{1, 1, 0, 0}));
  EXPECT_EQ(lens_of(md.decode_swa), (Row{3, 8, 0, 0}));
  EXPECT_EQ(row_of(md.decode_swa, 0), (Row{28, 29, 30, -1, -1, -1, -1, -1}));
  EXPECT_EQ(row_of(md.decode_swa, 1), (Row{21, 22, 23, 44, 45, 46, 47, 24}));
  EXPECT_EQ(row_of(md.decode_swa, 2), Row(8, -1));
  EXPECT_EQ(row_of(md.decode_swa, 3), Row(8, -1));
  EXPECT_EQ(md.prefill_swa.rows, 0);
  EXPECT_TRUE(md.prefill_gather_lens.empty());
  EXPECT_EQ(md.max_decode_query_len, 1);
  EXPECT_FALSE(md.tile_schedulers.empty());
}

// ---------------------------------------------------------------- Example 3

BuilderConfig example3_config() {
  BuilderConfig c = example_config(8, 4);
  c.speculative_method = SpeculativeMethod::kDspark;
  c.num_speculative_tokens = 3;  // theta = 4, Wn = round_up(8 + 3, 64) = 64
  return c;
}

TestBatch example3_batch(bool causal) {
  TestBatch b(4);
  b.add_request(13, 3, kBt0)    // prefix 10
      .add_request(5, 3, kBt1)  // prefix 2
      .set_causal(causal);
  return b;
}

TEST(GoldenExample3, DsparkNonCausalRows) {
  auto builder = cpu_builder(example3_config());
  TestBatch batch = example3_batch(/*causal=*/false);
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(batch.input(), &md));
  EXPECT_EQ(md.num_decode_tokens, 6);
  EXPECT_EQ(md.num_prefill_tokens, 0);
  EXPECT_FALSE(md.causal);
  EXPECT_EQ(md.decode_swa_width(), 64);
  EXPECT_EQ(md.decode_swa.window, 8);
  EXPECT_EQ(lens_of(md.decode_swa), (Row{11, 11, 11, 5, 5, 5}));
  const Row req0 = padded({30, 31, 12, 13, 14, 15, 36, 37, 38, 39, 8}, 64);  // positions 2..12
  const Row req1 = padded({20, 21, 22, 23, 44}, 64);                         // positions 0..4
  for (int t = 0; t < 3; ++t) EXPECT_EQ(row_of(md.decode_swa, t), req0) << "token " << t;
  for (int t = 3; t < 6; ++t) EXPECT_EQ(row_of(md.decode_swa, t), req1) << "token " << t;
}

TEST(GoldenExample3, CausalContrast) {
  auto builder = cpu_builder(example3_config());
  TestBatch batch = example3_batch(/*causal=*/true);
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(batch.input(), &md));
  EXPECT_EQ(md.decode_swa_width(), 8);
  EXPECT_EQ(lens_of(md.decode_swa), (Row{8, 8, 8, 3, 4, 5}));
  EXPECT_EQ(row_of(md.decode_swa, 0), (Row{31, 12, 13, 14, 15, 36, 37, 38}));
  EXPECT_EQ(row_of(md.decode_swa, 1), (Row{12, 13, 14, 15, 36, 37, 38, 39}));
  EXPECT_EQ(row_of(md.decode_swa, 2), (Row{13, 14, 15, 36, 37, 38, 39, 8}));
  EXPECT_EQ(row_of(md.decode_swa, 3), padded({20, 21, 22}, 8));
  EXPECT_EQ(row_of(md.decode_swa, 4), padded({20, 21, 22, 23}, 8));
  EXPECT_EQ(row_of(md.decode_swa, 5), padded({20, 21, 22, 23, 44}, 8));
}

TEST(GoldenExample3, InvalidTokenInsideTheDraftBlock) {
  auto builder = cpu_builder(example3_config());
  TestBatch batch = example3_batch(/*causal=*/false);
  batch.invalidate(2);
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(batch.input(), &md));
  EXPECT_EQ(lens_of(md.decode_swa), (Row{11, 11, 0, 5, 5, 5}));
  EXPECT_EQ(row_of(md.decode_swa, 2), Row(64, -1));
  const Row req0 = padded({30, 31, 12, 13, 14, 15, 36, 37, 38, 39, 8}, 64);
  EXPECT_EQ(row_of(md.decode_swa, 0), req0);
  EXPECT_EQ(row_of(md.decode_swa, 1), req0);
}

// ---------------------------------------------------------------- Example 4

TEST(GoldenExample4, ImageVisibilityA) {
  BuilderConfig c = example_config(8, 4);
  c.max_image_tokens = 6;  // prefill width 14
  auto builder = cpu_builder(c);
  TestBatch batch(4);
  batch.add_request(12, 12, {2, 6, 10}).add_image_span(0, 3, 7);
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(batch.input(), &md));
  ASSERT_EQ(md.num_prefill_tokens, 12);
  ASSERT_TRUE(md.has_image());
  EXPECT_EQ(md.prefill_swa.width, 14);
  EXPECT_EQ(to_vector(md.left_visible), (Row{0, 0, 0, 0, 1, 2, 3, 4, 0, 0, 0, 0}));
  EXPECT_EQ(to_vector(md.right_visible), (Row{0, 0, 0, 4, 3, 2, 1, 0, 0, 0, 0, 0}));
  EXPECT_EQ(lens_of(md.prefill_swa), (Row{1, 2, 3, 8, 8, 8, 8, 8, 8, 8, 8, 8}));
  EXPECT_EQ(row_of(md.prefill_swa, 0), padded({8}, 14));
  EXPECT_EQ(row_of(md.prefill_swa, 1), padded({8, 9}, 14));
  EXPECT_EQ(row_of(md.prefill_swa, 2), padded({8, 9, 10}, 14));
  const Row image = padded({8, 9, 10, 11, 24, 25, 26, 27}, 14);  // positions 0..7
  for (int p = 3; p <= 7; ++p) EXPECT_EQ(row_of(md.prefill_swa, p), image) << "pos " << p;
  EXPECT_EQ(row_of(md.prefill_swa, 8), padded({9, 10, 11, 24, 25, 26, 27, 40}, 14));
  EXPECT_EQ(row_of(md.prefill_swa, 9), padded({10, 11, 24, 25, 26, 27, 40, 41}, 14));
  EXPECT_EQ(row_of(md.prefill_swa, 10), padded({11, 24, 25, 26, 27, 40, 41, 42}, 14));
  EXPECT_EQ(row_of(md.prefill_swa, 11), padded({24, 25, 26, 27, 40, 41, 42, 43}, 14));
  EXPECT_EQ(to_vector(md.prefill_gather_lens), (Row{12}));  // not widened by images
}

TEST(GoldenExample4, ImageVisibilityBLeftAddPositive) {
  BuilderConfig c = example_config(4, 4);
  c.max_image_tokens = 8;  // prefill width 12
  auto builder = cpu_builder(c);
  TestBatch batch(4);
  batch.add_request(10, 10, {2, 6, 10}).add_image_span(0, 1, 8);
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(batch.input(), &md));
  ASSERT_TRUE(md.has_image());
  EXPECT_EQ(md.prefill_swa.width, 12);
  EXPECT_EQ(to_vector(md.left_visible), (Row{0, 0, 1, 2, 3, 4, 5, 6, 7, 0}));
  EXPECT_EQ(to_vector(md.right_visible), (Row{0, 7, 6, 5, 4, 3, 2, 1, 0, 0}));
  EXPECT_EQ(lens_of(md.prefill_swa), (Row{1, 9, 9, 9, 8, 8, 8, 8, 8, 4}));
  const Row first9 = padded({8, 9, 10, 11, 24, 25, 26, 27, 40}, 12);  // positions 0..8
  const Row from1 = padded({9, 10, 11, 24, 25, 26, 27, 40}, 12);      // positions 1..8
  EXPECT_EQ(row_of(md.prefill_swa, 0), padded({8}, 12));
  for (int p = 1; p <= 3; ++p) EXPECT_EQ(row_of(md.prefill_swa, p), first9) << "pos " << p;
  // pos 8: left 7 > W - 1, left_add = 4, start = 8 - 3 - 4 = 1.
  for (int p = 4; p <= 8; ++p) EXPECT_EQ(row_of(md.prefill_swa, p), from1) << "pos " << p;
  EXPECT_EQ(row_of(md.prefill_swa, 9), padded({26, 27, 40, 41}, 12));
}

// ---------------------------------------------------------------- Example 5

// Image spans visible in both directions: W = 4, width 8, two prefill requests.
TEST(GoldenExample5, ImageSpansTwoRequests) {
  BuilderConfig c = example_config(4, 4);
  c.max_image_tokens = 4;  // width 8
  auto builder = cpu_builder(c);
  TestBatch batch(4);
  batch.add_request(5, 5, {10, 11, 12})
      .add_request(3, 3, {20, 21, 22})
      .add_image_span(0, 1, 3)
      .add_image_span(1, 0, 1);
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(batch.input(), &md));
  ASSERT_EQ(md.num_prefill_tokens, 8);
  const Row r123 = padded({40, 41, 42, 43}, 8);
  for (int t = 1; t <= 3; ++t) EXPECT_EQ(row_of(md.prefill_swa, t), r123) << "row " << t;
  const Row r56 = padded({80, 81}, 8);
  EXPECT_EQ(row_of(md.prefill_swa, 5), r56);
  EXPECT_EQ(row_of(md.prefill_swa, 6), r56);
  // The other rows, by the causal rule: pos 0, pos 4, pos 2 of request 1.
  EXPECT_EQ(row_of(md.prefill_swa, 0), padded({40}, 8));
  EXPECT_EQ(row_of(md.prefill_swa, 4), padded({41, 42, 43, 44}, 8));
  EXPECT_EQ(row_of(md.prefill_swa, 7), padded({80, 81, 82}, 8));
  EXPECT_EQ(lens_of(md.prefill_swa), (Row{1, 4, 4, 4, 4, 2, 2, 3}));
}

// Image span (1, 3), W = 4, bt [[10, 11]]: the builder's rows (their lens, before the mixed
// matrix counts whole sections of 8, are the combined prefill's [1, 4, 4, 4, 4]).
TEST(GoldenExample5, ImageSpanSingleRequest) {
  BuilderConfig c = example_config(4, 4);
  c.max_image_tokens = 4;
  auto builder = cpu_builder(c);
  TestBatch batch(4);
  batch.add_request(5, 5, {10, 11}).add_image_span(0, 1, 3);
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(batch.input(), &md));
  EXPECT_EQ(row_of(md.prefill_swa, 0), padded({40}, 8));
  for (int t = 1; t <= 3; ++t) EXPECT_EQ(row_of(md.prefill_swa, t), padded({40, 41, 42, 43}, 8));
  EXPECT_EQ(row_of(md.prefill_swa, 4), padded({41, 42, 43, 44}, 8));
  EXPECT_EQ(lens_of(md.prefill_swa), (Row{1, 4, 4, 4, 4}));
}

// Chunk plan: seq [80, 96, 112, 128, 144], ql 4 each, W = 64, max_model_len 1024,
// max_num_batched_tokens 128, ratio 4, chunk 4 => [(0, 5, 36, 103)].
TEST(GoldenExample5, ChunkPlanFiveRequests) {
  BuilderConfig c = example_config(64, 16, /*max_tokens=*/128);
  c.max_model_len = 1024;
  c.compress_ratios = {4};
  auto builder = cpu_builder(c);
  TestBatch batch(16);
  for (int32_t seq : {80, 96, 112, 128, 144}) batch.add_identity_request(seq, 4);
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(batch.input(), &md));
  ASSERT_EQ(md.num_prefills, 5);
  auto plan = prefill_chunk_plan(md, 4, 4);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan.value(), (std::vector<ChunkPlanEntry>{{0, 5, 36, 103}}));
  EXPECT_EQ(to_vector(md.prefill_gather_lens), (Row{67, 67, 67, 67, 67}));  // 4 + min(p, 63)
}

// DSpark non-causal rows with identity block tables: rows = range(max(prefix - W, 0), seq).
struct DsparkCase {
  std::vector<int32_t> seq_lens;
  std::vector<int32_t> query_lens;
  int32_t window;
  int32_t block;
  int32_t num_speculative_tokens;
  int32_t expected_width;  // Wn (docs/semantics.md#dspark-width)
};

class GoldenDsparkIdentityTables : public ::testing::TestWithParam<DsparkCase> {};

TEST_P(GoldenDsparkIdentityTables, IdentityBlockTables) {
  const DsparkCase& p = GetParam();
  BuilderConfig c = example_config(p.window, p.block, /*max_tokens=*/32);
  c.max_model_len = 1024;
  c.speculative_method = SpeculativeMethod::kDspark;
  c.num_speculative_tokens = p.num_speculative_tokens;
  auto builder = cpu_builder(c);
  TestBatch batch(p.block);
  for (size_t r = 0; r < p.seq_lens.size(); ++r)
    batch.add_identity_request(p.seq_lens[r], p.query_lens[r]);
  batch.set_causal(false);
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(batch.input(), &md));
  ASSERT_EQ(md.decode_swa_width(), p.expected_width);
  int32_t t = 0;
  for (size_t r = 0; r < p.seq_lens.size(); ++r) {
    const int32_t prefix = p.seq_lens[r] - p.query_lens[r];
    Row expected;
    for (int32_t pos = std::max(prefix - p.window, 0); pos < p.seq_lens[r]; ++pos)
      expected.push_back(pos);
    const int32_t n = static_cast<int32_t>(expected.size());
    for (int32_t i = 0; i < p.query_lens[r]; ++i, ++t) {
      EXPECT_EQ(md.decode_swa.lens[t], n) << "token " << t;
      EXPECT_EQ(row_of(md.decode_swa, t), padded(expected, p.expected_width)) << "token " << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GoldenDsparkIdentityTables,
    ::testing::Values(
        // seq [20, 10], q [4, 4], W 8, B 4: lens 12 (8..19) and 10 (0..9).
        DsparkCase{{20, 10}, {4, 4}, 8, 4, 3, 64},
        // seq [130], q [7], W 128, B 16: prefix 123 < W => positions 0..129, lens 130.
        DsparkCase{{130}, {7}, 128, 16, 7, 192},
        // seq [64, 33, 9], q [3, 3, 3], W 16, B 8: lens 19, 19, 9.
        DsparkCase{{64, 33, 9}, {3, 3, 3}, 16, 8, 3, 64}),
    [](const ::testing::TestParamInfo<DsparkCase>& info) {  // e.g. seq_20_10_W8_B4
      std::string name = "seq";
      for (int32_t s : info.param.seq_lens) name += "_" + std::to_string(s);
      return name + "_W" + std::to_string(info.param.window) + "_B" +
             std::to_string(info.param.block);
    });

}  // namespace
}  // namespace sparse_swa
