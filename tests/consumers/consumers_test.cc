// SPDX-License-Identifier: Apache-2.0
// Index consumers (CPU reference): golden vectors of docs/semantics.md#worked-examples (examples
// 1 and 5), one regression test per width, threshold or stride failure a consumer can hit
// (docs/semantics.md#window-and-width), error paths, and randomized property tests against the
// builder's own rows. Expected values are hand-computed from the rules, never produced by this
// library.
#include "sparse_swa/consumers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "common/swa_formulas.h"
#include "sparse_swa/metadata_builder.h"
#include "support/host_output.h"
#include "support/status_matchers.h"
#include "testing/random_batch.h"
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

// A row-major host matrix.
struct Matrix {
  Matrix(std::vector<Row> r) : rows(r.size()), cols(r.empty() ? 0 : r[0].size()) {
    for (auto& row : r) data.insert(data.end(), row.begin(), row.end());
  }
  MatrixView<const int32_t> view() const {
    return {data.data(), rows, cols, cols, MemorySpace::kHost};
  }
  int64_t rows, cols;
  Row data;
};

Row iota_row(int32_t from, int32_t n) {
  Row r(n);
  for (int32_t i = 0; i < n; ++i) r[i] = from + i;
  return r;
}

// ------------------------------------------------------------------ Example 1

// W = 8, B = 4, MTP k = 1 (theta 2): decodes at positions 10 and 4, 5; a chunked prefill of
// positions 6..9.
BuilderConfig example1_config() {
  BuilderConfig c;
  c.window_size = 8;
  c.block_size = 4;
  c.max_num_batched_tokens = 16;
  c.max_num_seqs = 8;
  c.max_model_len = 64;
  c.speculative_method = SpeculativeMethod::kMtp;
  c.num_speculative_tokens = 1;
  c.compress_ratios = {1, 4};
  return c;
}

TestBatch example1_batch() {
  TestBatch b(4);
  b.add_request(11, 1, {7, 3, 9, 2})
      .add_request(6, 2, {5, 11, 6, 0})
      .add_request(10, 4, {1, 4, 8, 0});
  return b;
}

const std::vector<Row> kEx1DecodeRows = {{31, 12, 13, 14, 15, 36, 37, 38},
                                         {20, 21, 22, 23, 44, -1, -1, -1},
                                         {20, 21, 22, 23, 44, 45, -1, -1}};
const std::vector<Row> kEx1PrefillRows = {{4, 5, 6, 7, 16, 17, 18, -1},
                                          {4, 5, 6, 7, 16, 17, 18, 19},
                                          {5, 6, 7, 16, 17, 18, 19, 32},
                                          {6, 7, 16, 17, 18, 19, 32, 33}};

class Example1 : public ::testing::Test {
 protected:
  void SetUp() override {
    builder_ = cpu_builder(example1_config());
    SPARSE_SWA_ASSERT_OK(builder_->build(input_, &md_));
    ASSERT_EQ(md_.num_decode_tokens, 3);
    ASSERT_EQ(md_.num_prefill_tokens, 4);
  }
  ConsumerStep step() const { return {md_, input_, 4}; }

  TestBatch batch_ = example1_batch();
  BatchInput input_ = batch_.input();
  std::unique_ptr<MetadataBuilder> builder_;
  SwaMetadata md_;
  // Toy compressed cache: block size 2, req 0 -> [3, 5], req 1 -> [8, 9], req 2 -> [13, 21].
  Matrix cbt_{{{3, 5}, {8, 9}, {13, 21}}};
  CompressedCache c4a_cache() const { return {cbt_.view(), 2, 4}; }
  // Indexer local top-k (TOP_K = 2) of the prefill positions 6..9, as in docs example 1.
  Matrix prefill_topk_{{{0, -1}, {1, 0}, {0, 1}, {1, 0}}};
  // Decode local top-k (our own hand-made values): req0 [1, 2], req1 [0, -1] and [1, 0].
  Matrix decode_topk_{{{1, 2}, {0, -1}, {1, 0}}};
};

TEST_F(Example1, MixedMatrixSwaOnly) {
  CompressedTopk none;
  const MixedMatrixShape shape = mixed_matrix_shape(md_, none);
  EXPECT_EQ(shape.swa_width, 8);
  EXPECT_EQ(shape.compressed_width, 0);
  EXPECT_EQ(shape.row_width, 8);
  Output out(7, 8);
  std::vector<int32_t> swa_lens(7, kPoison);
  SPARSE_SWA_ASSERT_OK(build_mixed_matrix(step(), none, out.view(), swa_lens));
  for (int t = 0; t < 3; ++t) EXPECT_EQ(out.row(t), kEx1DecodeRows[t]) << "decode row " << t;
  for (int p = 0; p < 4; ++p) EXPECT_EQ(out.row(3 + p), kEx1PrefillRows[p]) << "prefill " << p;
  // lens count the whole SWA section (row 1 has -1 inside it); swa_lens are exact.
  EXPECT_EQ(out.lens, Row({8, 8, 8, 8, 8, 8, 8}));
  EXPECT_EQ(swa_lens, Row({8, 5, 6, 7, 8, 8, 8}));
}

TEST_F(Example1, MixedMatrixC4a) {
  CompressedTopk c4a;
  c4a.cache = c4a_cache();
  c4a.decode_local = decode_topk_.view();
  c4a.prefill_local = prefill_topk_.view();
  const MixedMatrixShape shape = mixed_matrix_shape(md_, c4a);
  EXPECT_EQ(shape.swa_width, 8);
  EXPECT_EQ(shape.compressed_width, 4);  // round_up(2, 4)
  EXPECT_EQ(shape.row_width, 12);
  Output out(7, 12);
  std::vector<int32_t> swa_lens(7, kPoison);
  SPARSE_SWA_ASSERT_OK(build_mixed_matrix(step(), c4a, out.view(), swa_lens));
  // Decode: req0 local 1 -> 3*2+1 = 7, 2 -> 5*2+0 = 10; req1 local 0 -> 16, 1 -> 17.
  EXPECT_EQ(out.row(0), Row({31, 12, 13, 14, 15, 36, 37, 38, 7, 10, -1, -1}));
  EXPECT_EQ(out.row(1), Row({20, 21, 22, 23, 44, -1, -1, -1, 16, -1, -1, -1}));
  EXPECT_EQ(out.row(2), Row({20, 21, 22, 23, 44, 45, -1, -1, 17, 16, -1, -1}));
  // Prefill rows: example 1's golden vectors.
  EXPECT_EQ(out.row(3), Row({4, 5, 6, 7, 16, 17, 18, -1, 26, -1, -1, -1}));
  EXPECT_EQ(out.row(4), Row({4, 5, 6, 7, 16, 17, 18, 19, 27, 26, -1, -1}));
  EXPECT_EQ(out.row(5), Row({5, 6, 7, 16, 17, 18, 19, 32, 26, 27, -1, -1}));
  EXPECT_EQ(out.row(6), Row({6, 7, 16, 17, 18, 19, 32, 33, 27, 26, -1, -1}));
  EXPECT_EQ(out.lens, Row({10, 9, 10, 9, 10, 10, 10}));
  EXPECT_EQ(swa_lens, Row({8, 5, 6, 7, 8, 8, 8}));
}

TEST_F(Example1, CombinedPrefillSwaOnly) {
  auto plan = prefill_chunk_plan(md_, 1, 4);
  SPARSE_SWA_ASSERT_OK(plan.status());
  ASSERT_EQ(plan.value(), std::vector<ChunkPlanEntry>({{0, 1, 0, 10}}));
  auto shape = combined_prefill_shape(md_, plan.value()[0], 0);
  SPARSE_SWA_ASSERT_OK(shape.status());
  EXPECT_EQ(shape.value().rows, 4);
  EXPECT_EQ(shape.value().width, 128);  // round_up(0 + 8, 128)
  Output out(4, 128);
  SPARSE_SWA_ASSERT_OK(build_combined_prefill(step(), plan.value()[0], 1, {}, out.view()));
  EXPECT_EQ(out.row(0), padded({0, 1, 2, 3, 4, 5, 6}, 128));
  EXPECT_EQ(out.row(1), padded(iota_row(0, 8), 128));
  EXPECT_EQ(out.row(2), padded(iota_row(1, 8), 128));
  EXPECT_EQ(out.row(3), padded(iota_row(2, 8), 128));
  EXPECT_EQ(out.lens, Row({7, 8, 8, 8}));
}

TEST_F(Example1, CombinedPrefillC4a) {
  auto plan = prefill_chunk_plan(md_, 4, 4);
  SPARSE_SWA_ASSERT_OK(plan.status());
  ASSERT_EQ(plan.value(), std::vector<ChunkPlanEntry>({{0, 1, 2, 12}}));
  Output out(4, 128);
  SPARSE_SWA_ASSERT_OK(
      build_combined_prefill(step(), plan.value()[0], 4, prefill_topk_.view(), out.view()));
  EXPECT_EQ(out.row(0, 10), Row({0, 2, 3, 4, 5, 6, 7, 8, -1, -1}));
  EXPECT_EQ(out.row(1, 10), Row({1, 0, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(out.row(2, 10), Row({0, 1, 3, 4, 5, 6, 7, 8, 9, 10}));
  EXPECT_EQ(out.row(3, 10), Row({1, 0, 4, 5, 6, 7, 8, 9, 10, 11}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out.row(i), padded(out.row(i, 10), 128));
  EXPECT_EQ(out.lens, Row({8, 10, 10, 10}));
}

TEST_F(Example1, RaggedDecodeRows) {
  ASSERT_EQ(ragged_capacity(md_.decode_swa), 24);
  Row indptr(4, kPoison), values(24, kPoison);
  SPARSE_SWA_ASSERT_OK(to_ragged(md_.decode_swa, {indptr.data(), 4, values.data(), 24}));
  EXPECT_EQ(indptr, Row({0, 8, 13, 19}));
  EXPECT_EQ(Row(values.begin(), values.begin() + 19),
            Row({31, 12, 13, 14, 15, 36, 37, 38, 20, 21, 22, 23, 44, 20, 21, 22, 23, 44, 45}));
}

TEST_F(Example1, CompressedTopkToGlobalDecode) {
  Output out(3, 4);  // wider than the top-k: the tail is -1
  SPARSE_SWA_ASSERT_OK(
      compressed_topk_to_global(md_, 0, decode_topk_.view(), c4a_cache(), out.view()));
  EXPECT_EQ(out.row(0), Row({7, 10, -1, -1}));
  EXPECT_EQ(out.row(1), Row({16, -1, -1, -1}));
  EXPECT_EQ(out.row(2), Row({17, 16, -1, -1}));
  EXPECT_EQ(out.lens, Row({2, 1, 2}));
}

TEST_F(Example1, CopyGlobalTopkC128a) {
  std::vector<int32_t> data = {100, 101, 7, 200, 9, 9, 300, 301, 302};
  std::vector<int32_t> lens = {2, 1, 3};
  ConstIndexView global{data.data(), lens.data(), 3, 3, 3, 0, MemorySpace::kHost};
  Output out(3, 4);
  SPARSE_SWA_ASSERT_OK(copy_global_topk(md_, 0, global, out.view()));
  EXPECT_EQ(out.row(0), Row({100, 101, -1, -1}));
  EXPECT_EQ(out.row(1), Row({200, -1, -1, -1}));
  EXPECT_EQ(out.row(2), Row({300, 301, 302, -1}));
  EXPECT_EQ(out.lens, Row({2, 1, 3}));
}

// Two prefill requests in one chunk: B (seq 3, ql 3) is chunk request b = 1, M = max(10, 3).
TEST(CombinedPrefillGolden, TwoRequestsInOneChunk) {
  TestBatch batch = example1_batch();
  batch.add_request(3, 3, {2});
  const BatchInput input = batch.input();
  auto builder = cpu_builder(example1_config());
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(input, &md));
  auto plan = prefill_chunk_plan(md, 1, 4);
  SPARSE_SWA_ASSERT_OK(plan.status());
  ASSERT_EQ(plan.value(), std::vector<ChunkPlanEntry>({{0, 2, 0, 10}}));
  Output out(7, 128);
  SPARSE_SWA_ASSERT_OK(build_combined_prefill({md, input, 4}, plan.value()[0], 1, {}, out.view()));
  EXPECT_EQ(out.row(4), padded({10}, 128));
  EXPECT_EQ(out.row(5), padded({10, 11}, 128));
  EXPECT_EQ(out.row(6), padded({10, 11, 12}, 128));
  EXPECT_EQ(out.lens, Row({7, 8, 8, 8, 1, 2, 3}));
}

// ------------------------------------------------------------------ Example 5

// A single prefill token at position 3 with logical W = 4 and a decode view padded to 8.
TEST(MixedMatrixGolden, LogicalWindowWithPaddedSwaWidth) {
  const Row qsl = {0, 1}, seq = {4}, bt = {0}, t2r = {0};
  const std::vector<uint8_t> valid = {1};
  Row prefill_rows = {0, 1, 2, 3}, prefill_lens = {4};
  const BatchInput batch{qsl, seq, {bt.data(), 1, 1, 1, MemorySpace::kHost}, {}, true, {}};
  SwaMetadata md;
  md.num_reqs = 1;
  md.num_tokens = 1;
  md.num_prefills = 1;
  md.num_prefill_tokens = 1;
  md.token_to_req_indices = t2r;
  md.is_valid_token = valid;
  md.decode_swa = {nullptr, nullptr, 0, 8, 8, 4, MemorySpace::kHost};  // padded S = 8
  md.prefill_swa = {prefill_rows.data(), prefill_lens.data(), 1, 4, 4, 4, MemorySpace::kHost};
  md.window_size = 4;
  const Row gather = {4};
  md.prefill_gather_lens = gather;
  Output out(1, 8);
  Row swa_lens(1, kPoison);
  SPARSE_SWA_ASSERT_OK(build_mixed_matrix({md, batch, 4}, {}, out.view(), swa_lens));
  EXPECT_EQ(out.row(0), Row({0, 1, 2, 3, -1, -1, -1, -1}));
  EXPECT_EQ(out.lens, Row({8}));
  EXPECT_EQ(swa_lens, Row({4}));
}

// Image span (1, 3), W = 4, Mi = 4, bt [10, 11], B = 4, seq 5: S = W + Mi = 8.
TEST(MixedMatrixGolden, ImageSpanWidensPrefillRows) {
  BuilderConfig c;
  c.window_size = 4;
  c.block_size = 4;
  c.max_num_batched_tokens = 8;
  c.max_num_seqs = 2;
  c.max_model_len = 16;
  c.max_image_tokens = 4;
  TestBatch batch(4);
  batch.add_request(5, 5, {10, 11}).add_image_span(0, 1, 3);
  const BatchInput input = batch.input();
  auto builder = cpu_builder(c);
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(input, &md));
  ASSERT_TRUE(md.has_image());

  Output out(5, 8);
  Row swa_lens(5, kPoison);
  SPARSE_SWA_ASSERT_OK(build_mixed_matrix({md, input, 4}, {}, out.view(), swa_lens));
  EXPECT_EQ(out.row(0), padded({40}, 8));
  for (int t = 1; t <= 3; ++t) EXPECT_EQ(out.row(t), padded({40, 41, 42, 43}, 8)) << t;
  EXPECT_EQ(out.row(4), padded({41, 42, 43, 44}, 8));
  EXPECT_EQ(out.lens, Row({8, 8, 8, 8, 8}));
  EXPECT_EQ(swa_lens, Row({1, 4, 4, 4, 4}));

  // The combine variant: lens [1, 4, 4, 4, 4], workspace rows 0..4 (N = 0, M = 5).
  auto plan = prefill_chunk_plan(md, 1, 4);
  SPARSE_SWA_ASSERT_OK(plan.status());
  ASSERT_EQ(plan.value(), std::vector<ChunkPlanEntry>({{0, 1, 0, 5}}));
  Output comb(5, 128);
  SPARSE_SWA_ASSERT_OK(build_combined_prefill({md, input, 4}, plan.value()[0], 1, {}, comb.view()));
  EXPECT_EQ(comb.lens, Row({1, 4, 4, 4, 4}));
  EXPECT_EQ(comb.row(0, 4), Row({0, -1, -1, -1}));
  EXPECT_EQ(comb.row(2, 4), Row({0, 1, 2, 3}));
  EXPECT_EQ(comb.row(4, 4), Row({1, 2, 3, 4}));
}

// ------------------------------------------------------------------ regression tests

BuilderConfig dspark_config(int32_t window, int32_t k) {
  BuilderConfig c;
  c.window_size = window;
  c.block_size = 64;
  c.max_num_batched_tokens = 64;
  c.max_num_seqs = 8;
  c.max_model_len = 4096;
  c.speculative_method = SpeculativeMethod::kDspark;
  c.parallel_drafting = true;
  c.num_speculative_tokens = k;
  return c;
}

// A host copy of `view` with every row widened to `width` (-1 padded).
struct Widened {
  Widened(const ConstIndexView& v, int32_t width)
      : data(v.rows * width, -1), lens(v.lens, v.lens + v.rows) {
    for (int64_t i = 0; i < v.rows; ++i) std::copy(v.row(i), v.row(i) + v.width, &data[i * width]);
    view = {data.data(), lens.data(), v.rows, width, width, v.window, MemorySpace::kHost};
  }
  Row data, lens;
  ConstIndexView view;
};

// DSpark rows of width 192 (and 256) for 7 decode tokens with W = 128 go through the mixed path
// intact; nothing is reshaped with the window (docs/semantics.md#window-and-width).
TEST(ConsumerRegression, DsparkSevenDecodeTokensThroughMixedPathWidth192And256) {
  const BuilderConfig c = dspark_config(128, 6);  // theta 13: W + theta = 141 -> Wn = 192
  TestBatch batch(64);
  batch.add_request(300, 7, {0, 1, 2, 3, 4}).set_causal(false);
  const BatchInput input = batch.input();
  auto builder = cpu_builder(c);
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(input, &md));
  ASSERT_EQ(md.num_decode_tokens, 7);
  ASSERT_EQ(md.decode_swa.width, 192);

  for (int32_t width : {192, 256}) {
    SCOPED_TRACE(width);
    Widened rows(md.decode_swa, width);
    SwaMetadata wide = md;
    wide.decode_swa = rows.view;
    const MixedMatrixShape shape = mixed_matrix_shape(wide, {});
    EXPECT_EQ(shape.swa_width, width);
    for (MixedMatrixForm form : {MixedMatrixForm::kFlashInferSm100, MixedMatrixForm::kVerbatim}) {
      Output out(7, shape.row_width);
      Row swa_lens(7, kPoison);
      SPARSE_SWA_ASSERT_OK(build_mixed_matrix({wide, input, 64}, {}, form, out.view(), swa_lens));
      for (int t = 0; t < 7; ++t) {
        // min(prefix 293, W 128) + 7 = 135 positions 165..299, slot == position (identity pages).
        // A full window (prefix >= W) is re-laid in place: the W context slots, then the block
        // from column W; only lens differ (W + ql for the SM100 kernel, S for the copy).
        EXPECT_EQ(out.row(t), padded(iota_row(165, 135), width)) << t;
        EXPECT_EQ(out.lens[t], form == MixedMatrixForm::kVerbatim ? width : 135);
        EXPECT_EQ(swa_lens[t], 135);
      }
    }
    Row indptr(8), values(ragged_capacity(rows.view));
    SPARSE_SWA_ASSERT_OK(
        to_ragged(rows.view, {indptr.data(), 8, values.data(), 7 * int64_t{width}}));
    EXPECT_EQ(indptr.back(), 7 * 135);
  }
}

// Non-causal rows hold up to W + query_len entries; a decode view narrower than that
// (rows reshaped or allocated with the window) is detected, never truncated.
TEST(ConsumerRegression, RowNarrowerThanWindowPlusKDetected) {
  const BuilderConfig c = dspark_config(128, 6);
  TestBatch batch(64);
  batch.add_request(300, 7, {0, 1, 2, 3, 4}).set_causal(false);
  const BatchInput input = batch.input();
  auto builder = cpu_builder(c);
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(input, &md));
  SwaMetadata narrow = md;
  narrow.decode_swa.width = 128;  // the window, as a consumer that confuses the two assumes
  narrow.decode_swa.row_stride = 192;
  Output out(7, 256);
  EXPECT_TRUE(IsInvalidArgument(build_mixed_matrix({narrow, input, 64}, {}, out.view()),
                                {"metadata.decode_swa", "expected >= 128 + 7 = 135", "got 128"}));
  // Rows whose lens exceed the width are rejected by every consumer that reads lens.
  EXPECT_TRUE(IsInvalidArgument(
      to_ragged(narrow.decode_swa, {out.data.data(), 8, out.data.data(), 7 * 256}),
      {"view.lens[0]", "expected 0..128", "got 135"}));
}

// A width the kernel library never instantiated is rounded up to one it did, or refused.
// (The policies live in dispatch_policy_test.cc; here the mixed matrix rounds 133 columns.)
TEST(ConsumerRegression, OddWidthRowsStayAligned) {
  const MixedMatrixShape s = mixed_matrix_shape(133, 0, 0);
  EXPECT_EQ(s.row_width, 136);  // the whole row a multiple of 4, not only the compressed part
  EXPECT_EQ(mixed_matrix_shape(130, 5, 2).compressed_width, 8);
  EXPECT_EQ(mixed_matrix_shape(130, 5, 2).row_width, 140);
}

// Softmax was diluted to 133/256 when the padded width was passed as the valid length: every
// exact count here is the number of valid keys, never the width.
TEST(ConsumerRegression, ValidLengthNeverEqualsPaddedWidth) {
  auto builder = cpu_builder(example1_config());
  TestBatch batch = example1_batch();
  const BatchInput input = batch.input();
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(input, &md));
  Output mixed(7, 8);
  Row swa_lens(7);
  SPARSE_SWA_ASSERT_OK(build_mixed_matrix({md, input, 4}, {}, mixed.view(), swa_lens));
  // Tokens 1, 2 and 3 have fewer than W valid keys.
  for (int t : {1, 2, 3}) {
    EXPECT_LT(swa_lens[t], 8) << t;
    const Row row = mixed.row(t);
    EXPECT_EQ(std::count_if(row.begin(), row.end(), [](int32_t v) { return v >= 0; }), swa_lens[t]);
  }
  Output comb(4, 128);
  SPARSE_SWA_ASSERT_OK(build_combined_prefill({md, input, 4}, {0, 1, 0, 10}, 1, {}, comb.view()));
  EXPECT_EQ(comb.lens[0], 7);
  Row indptr(4), values(24);
  SPARSE_SWA_ASSERT_OK(to_ragged(md.decode_swa, {indptr.data(), 4, values.data(), 24}));
  EXPECT_EQ(indptr[2] - indptr[1], 5);
  EXPECT_EQ(indptr[3] - indptr[2], 6);
}

// With parallel drafting the threshold is 1 + 2k for every consumer: they all take the
// split from the metadata, so a request of query length <= 1 + 2k is a decode everywhere.
TEST(ConsumerRegression, ParallelDraftingThresholdOnePlusTwoK) {
  BuilderConfig c = example1_config();
  c.num_speculative_tokens = 2;
  c.parallel_drafting = true;  // theta = 5 (1 + k would be 3)
  c.max_num_batched_tokens = 32;
  TestBatch batch(4);
  for (int32_t ql = 1; ql <= 6; ++ql) batch.add_request(8 + ql, ql, {1, 2, 3, 4});
  const BatchInput input = batch.input();
  auto builder = cpu_builder(c);
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(input, &md));
  ASSERT_EQ(md.num_decodes, 5);
  ASSERT_EQ(md.num_decode_tokens, 15);

  Output mixed(21, 8);
  SPARSE_SWA_ASSERT_OK(build_mixed_matrix({md, input, 4}, {}, mixed.view()));
  for (int t = 0; t < 15; ++t) {  // tokens of the ql 4 and 5 requests are decode rows
    const int32_t* d = md.decode_swa.row(t);
    EXPECT_EQ(mixed.row(t), Row(d, d + 8)) << t;
  }
  auto plan = prefill_chunk_plan(md, 1, 4);
  SPARSE_SWA_ASSERT_OK(plan.status());
  ASSERT_EQ(plan.value().size(), 1u);
  auto shape = combined_prefill_shape(md, plan.value()[0], 0);
  SPARSE_SWA_ASSERT_OK(shape.status());
  EXPECT_EQ(shape.value().rows, 6);  // only the ql 6 request
  Row indptr(16), values(15 * 8);
  SPARSE_SWA_ASSERT_OK(to_ragged(md.decode_swa, {indptr.data(), 16, values.data(), 15 * 8}));
  EXPECT_EQ(indptr[15], std::accumulate(md.decode_swa.lens, md.decode_swa.lens + 15, 0));
}

// One persistent, capacity-strided buffer serves every step; the shape is the builder's,
// not the batch's, so the stride a captured graph baked in stays right.
TEST(ConsumerRegression, CapacityStrideUnchangedAcrossSteps) {
  const BuilderConfig c = example1_config();
  auto builder = cpu_builder(c);
  Matrix cbt{{{3, 5, 6, 7}, {8, 9, 10, 11}, {13, 21, 22, 23}, {1, 2, 3, 4}}};
  const int64_t capacity_rows = c.max_num_batched_tokens;
  const int64_t stride = 16;  // capacity width, a multiple of 4
  Output out(capacity_rows, 12, stride);
  const int32_t* const base = out.data.data();
  std::vector<MixedMatrixShape> shapes;
  for (int step = 0; step < 3; ++step) {
    TestBatch batch(4);
    batch.add_request(11 + step, 1, {7, 3, 9, 2})
        .add_request(6 + 3 * step, 2 + step % 2, {5, 11, 6, 0});
    if (step != 1) batch.add_request(10 + step, 4 + step, {1, 4, 8, 0, 2});
    const BatchInput input = batch.input();
    SwaMetadata md;
    SPARSE_SWA_ASSERT_OK(builder->build(input, &md));
    std::vector<Row> dl(md.num_decode_tokens, Row{0, 1}), pl(md.num_prefill_tokens, Row{1, 0});
    Matrix decode_local(dl.empty() ? std::vector<Row>{} : dl);
    Matrix prefill_local(pl.empty() ? std::vector<Row>{} : pl);
    CompressedTopk c4a{{cbt.view(), 2, 4}, decode_local.view(), {}, prefill_local.view()};
    if (pl.empty()) c4a.prefill_local = {nullptr, 0, 2, 2, MemorySpace::kHost};
    shapes.push_back(mixed_matrix_shape(md, c4a));
    IndexView view = out.view();
    SPARSE_SWA_ASSERT_OK(build_mixed_matrix({md, input, 4}, c4a, view));
    EXPECT_EQ(view.data, base);
    EXPECT_EQ(view.row_stride, stride);
    // Row t lands t strides in, whatever this step's shape.
    for (int32_t t = 0; t < md.num_tokens; ++t) {
      const bool decode = t < md.num_decode_tokens;
      const int32_t* r =
          decode ? md.decode_swa.row(t) : md.prefill_swa.row(t - md.num_decode_tokens);
      EXPECT_EQ(out.row(t, 8), Row(r, r + 8)) << "step " << step << " token " << t;
    }
  }
  EXPECT_EQ(shapes[0].row_width, shapes[1].row_width);
  EXPECT_EQ(shapes[1].row_width, shapes[2].row_width);
  // A stride that is not a multiple of 4 would misalign rows.
  TestBatch batch = example1_batch();
  const BatchInput input = batch.input();
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(input, &md));
  Output odd(7, 8, 10);
  EXPECT_TRUE(IsInvalidArgument(build_mixed_matrix({md, input, 4}, {}, odd.view()),
                                {"out.row_stride", "multiple of 4", "got 10"}));
}

// Padded and invalid tokens give rows of -1 and lens 0 in every output (never a stale row).
TEST(ConsumerRegression, PaddedRowsAllMinusOneLensZero) {
  auto builder = cpu_builder(example1_config());
  TestBatch batch = example1_batch();
  batch.invalidate(1).invalidate(5).pad_tokens(2);
  const BatchInput input = batch.input();
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(input, &md));
  ASSERT_EQ(md.num_tokens, 9);
  ASSERT_EQ(md.num_prefill_tokens, 6);  // padding tokens trail the prefill tokens
  Matrix cbt{{{3, 5}, {8, 9}, {13, 21}}};
  Matrix decode_local{{{1, 2}, {0, 1}, {1, 0}}};
  Matrix prefill_local{{{0, 1}, {1, 0}, {0, 1}, {1, 0}, {0, 1}, {1, 0}}};
  CompressedTopk c4a{{cbt.view(), 2, 4}, decode_local.view(), {}, prefill_local.view()};

  Output mixed(9, 12);
  Row swa_lens(9, kPoison);
  SPARSE_SWA_ASSERT_OK(build_mixed_matrix({md, input, 4}, c4a, mixed.view(), swa_lens));
  for (int t : {1, 5, 7, 8}) {
    EXPECT_EQ(mixed.row(t), Row(12, -1)) << t;
    EXPECT_EQ(mixed.lens[t], 0) << t;
    EXPECT_EQ(swa_lens[t], 0) << t;
  }
  EXPECT_EQ(mixed.lens[0], 10);

  Output global(3, 2);
  SPARSE_SWA_ASSERT_OK(
      compressed_topk_to_global(md, 0, decode_local.view(), c4a.cache, global.view()));
  EXPECT_EQ(global.row(1), Row({-1, -1}));
  EXPECT_EQ(global.lens, Row({2, 0, 2}));

  Output comb(4, 128);
  SPARSE_SWA_ASSERT_OK(
      build_combined_prefill({md, input, 4}, {0, 1, 2, 12}, 4, prefill_local.view(), comb.view()));
  EXPECT_EQ(comb.row(2), Row(128, -1));  // token 5
  EXPECT_EQ(comb.lens, Row({8, 10, 0, 10}));

  Row indptr(4), values(24);
  SPARSE_SWA_ASSERT_OK(to_ragged(md.decode_swa, {indptr.data(), 4, values.data(), 24}));
  EXPECT_EQ(indptr, Row({0, 8, 8, 14}));
}

// Top-k widths 1024 and 2048 (DSV4 indexers) through every path.
TEST(ConsumerRegression, Topk1024And2048ThroughEveryPath) {
  for (int32_t topk : {1024, 2048}) {
    SCOPED_TRACE(topk);
    BuilderConfig c = example1_config();
    c.max_model_len = 4 * topk + 64;
    auto builder = cpu_builder(c);
    TestBatch batch(4);
    const int32_t seq = 4 * topk + 40;  // (pos + 1) / 4 >= topk for the prefill tokens
    std::vector<int32_t> pages(seq / 4 + 1);
    std::iota(pages.begin(), pages.end(), 0);
    batch.add_request(seq, 1, pages).add_request(seq, 2, pages).add_request(seq, 4, pages);
    const BatchInput input = batch.input();
    SwaMetadata md;
    SPARSE_SWA_ASSERT_OK(builder->build(input, &md));
    // Identity compressed pages (block size 64): global == local.
    const int32_t cbs = 64, cblocks = seq / 4 / cbs + 1;
    std::vector<Row> cbt_rows(3, iota_row(0, cblocks));
    Matrix cbt(cbt_rows);
    std::vector<Row> local_rows(4, Row(topk));
    for (int i = 0; i < 4; ++i) local_rows[i] = iota_row(i, topk);  // all valid, < seq / 4
    local_rows[0][topk - 1] = -1;
    Matrix decode_local(std::vector<Row>(local_rows.begin(), local_rows.begin() + 3));
    Matrix prefill_local(local_rows);
    CompressedCache cache{cbt.view(), cbs, 4};

    Output global(3, topk);
    SPARSE_SWA_ASSERT_OK(
        compressed_topk_to_global(md, 0, decode_local.view(), cache, global.view()));
    EXPECT_EQ(global.lens, Row({topk - 1, topk, topk}));
    EXPECT_EQ(global.row(1), iota_row(1, topk));

    CompressedTopk c4a{cache, decode_local.view(), {}, prefill_local.view()};
    const MixedMatrixShape shape = mixed_matrix_shape(md, c4a);
    EXPECT_EQ(shape.row_width, 8 + topk);
    Output mixed(7, shape.row_width);
    SPARSE_SWA_ASSERT_OK(build_mixed_matrix({md, input, 4}, c4a, mixed.view()));
    EXPECT_EQ(mixed.lens,
              Row({8 + topk - 1, 8 + topk, 8 + topk, 8 + topk, 8 + topk, 8 + topk, 8 + topk}));
    const Row last = mixed.row(6);
    EXPECT_EQ(Row(last.begin() + 8, last.end()), iota_row(3, topk));

    auto plan = prefill_chunk_plan(md, 4, 4);
    SPARSE_SWA_ASSERT_OK(plan.status());
    auto cshape = combined_prefill_shape(md, plan.value()[0], topk);
    SPARSE_SWA_ASSERT_OK(cshape.status());
    EXPECT_EQ(cshape.value().width, formulas::round_up(topk + 8, 128));
    Output comb(4, cshape.value().width);
    SPARSE_SWA_ASSERT_OK(build_combined_prefill({md, input, 4}, plan.value()[0], 4,
                                                prefill_local.view(), comb.view()));
    EXPECT_EQ(comb.lens, Row({topk + 8, topk + 8, topk + 8, topk + 8}));
    EXPECT_EQ(comb.row(0, 2), Row({0, 1}));

    Output dense(3, topk);
    SPARSE_SWA_ASSERT_OK(
        compressed_topk_to_global(md, 0, decode_local.view(), cache, dense.view()));
    ConstIndexView dv = dense.view();
    Row indptr(4), values(ragged_capacity(dv));
    SPARSE_SWA_ASSERT_OK(to_ragged(dv, {indptr.data(), 4, values.data(), 3 * int64_t{topk}}));
    EXPECT_EQ(indptr, Row({0, topk - 1, 2 * topk - 1, 3 * topk - 1}));
  }
}

// A -1 (or an index past the request's compressed entries) inside the first topk_len
// entries is masked to -1 in place, still counted in lens; check_prefill_topk names it.
TEST_F(Example1, NegativeInsideCompressedPrefixIsMasked) {
  Matrix bad{{{0, -1}, {-1, 0}, {0, 7}, {1, 0}}};  // pos7 entry 0 and pos8 entry 1
  Output out(4, 128);
  SPARSE_SWA_ASSERT_OK(build_combined_prefill(step(), {0, 1, 2, 12}, 4, bad.view(), out.view()));
  EXPECT_EQ(out.row(1, 10), Row({-1, 0, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(out.row(2, 10), Row({0, -1, 3, 4, 5, 6, 7, 8, 9, 10}));
  EXPECT_EQ(out.lens, Row({8, 10, 10, 10}));
  EXPECT_TRUE(IsInvalidArgument(
      check_prefill_topk(step(), 4, bad.view()),
      {"prefill_local[1][0]", "token 4", "position 7", "[0, 2)", "topk_len = 2", "got -1"}));
  SPARSE_SWA_EXPECT_OK(check_prefill_topk(step(), 4, prefill_topk_.view()));
}

// ------------------------------------------------------------------ error paths

TEST_F(Example1, OutputTooSmallNamesWhatIsNeeded) {
  CompressedTopk c4a{c4a_cache(), decode_topk_.view(), {}, prefill_topk_.view()};
  Output narrow(7, 11, 12);
  EXPECT_TRUE(IsInvalidArgument(build_mixed_matrix(step(), c4a, narrow.view()),
                                {"out.width", "expected >= 12", "7 x 12", "got 11"}));
  Output short_rows(6, 12);
  EXPECT_TRUE(IsInvalidArgument(build_mixed_matrix(step(), c4a, short_rows.view()),
                                {"out.rows", "expected >= 7", "got 6"}));
  Output comb(4, 64);
  EXPECT_TRUE(IsInvalidArgument(
      build_combined_prefill(step(), {0, 1, 2, 12}, 4, prefill_topk_.view(), comb.view()),
      {"out.width", "expected >= 128", "got 64"}));
  Row indptr(4), values(20);
  EXPECT_TRUE(IsInvalidArgument(to_ragged(md_.decode_swa, {indptr.data(), 4, values.data(), 20}),
                                {"out.capacity", "3 x 8 = 24", "got 20"}));
  EXPECT_TRUE(IsInvalidArgument(to_ragged(md_.decode_swa, {indptr.data(), 3, values.data(), 24}),
                                {"out.indptr_size", "rows + 1 = 4", "got 3"}));
  Output global(2, 2);
  EXPECT_TRUE(IsInvalidArgument(
      compressed_topk_to_global(md_, 0, decode_topk_.view(), c4a_cache(), global.view()),
      {"out.rows", "expected >= 3", "got 2"}));
}

TEST_F(Example1, BadChunksAndInputsAreErrors) {
  Output out(4, 128);
  EXPECT_TRUE(IsInvalidArgument(
      build_combined_prefill(step(), {0, 1, 2, 11}, 4, prefill_topk_.view(), out.view()),
      {"chunk.total_width", "N + gather_len = 2 + 10", "got 11"}));
  EXPECT_TRUE(IsInvalidArgument(
      build_combined_prefill(step(), {0, 1, 1, 12}, 4, prefill_topk_.view(), out.view()),
      {"chunk.compressed_width", "seq_len / ratio = 10 / 4", "got 1"}));
  EXPECT_TRUE(IsInvalidArgument(build_combined_prefill(step(), {0, 2, 0, 10}, 1, {}, out.view()),
                                {"chunk", "end <= num_prefills 1", "got [0, 2)"}));
  EXPECT_TRUE(IsInvalidArgument(
      build_combined_prefill(step(), {0, 1, 0, 10}, 1, prefill_topk_.view(), out.view()),
      {"compress_ratio 1", "got 2 columns"}));
  EXPECT_TRUE(IsInvalidArgument(build_combined_prefill(step(), {0, 1, 2, 12}, 3, {}, out.view()),
                                {"compress_ratio", "{1, 2, 4, 128}", "got 3"}));
  // A C4A layer without its decode top-k.
  CompressedTopk missing{c4a_cache(), {}, {}, prefill_topk_.view()};
  Output mixed(7, 12);
  EXPECT_TRUE(IsInvalidArgument(build_mixed_matrix(step(), missing, mixed.view()),
                                {"3 decode tokens", "decode_local or decode_global"}));
  // Compressed inputs on an SWA-only layer.
  CompressedTopk swa_only{{}, decode_topk_.view(), {}, {}};
  EXPECT_TRUE(
      IsInvalidArgument(build_mixed_matrix(step(), swa_only, mixed.view()), {"compress_ratio 1"}));
  EXPECT_FALSE(compressed_block_size(256, 3).ok());
  EXPECT_EQ(compressed_block_size(256, 4).value(), 64);
  EXPECT_EQ(compressed_block_size(256, 128).value(), 2);
  EXPECT_TRUE(IsInvalidArgument(compressed_block_size(100, 128).status(),
                                {"attn_block_size", "compress ratio 128", "got 100"}));
}

TEST_F(Example1, InconsistentMetadataIsAnErrorAndWritesNothing) {
  Row t2r(md_.token_to_req_indices.begin(), md_.token_to_req_indices.end());
  t2r[4] = 7;
  SwaMetadata bad = md_;
  bad.token_to_req_indices = t2r;
  Output out(7, 8);
  EXPECT_TRUE(IsInvalidArgument(build_mixed_matrix({bad, input_, 4}, {}, out.view()),
                                {"metadata.token_to_req_indices[4]", "expected 0..2", "got 7"}));
  EXPECT_EQ(out.data, Row(7 * 8, kPoison));
  t2r[4] = 0;  // request 0 owns only token 0
  EXPECT_TRUE(IsInvalidArgument(build_mixed_matrix({bad, input_, 4}, {}, out.view()),
                                {"token 4", "request 0", "tokens [0, 1)"}));
  // A block table too narrow for a window.
  TestBatch narrow = example1_batch();
  narrow.max_block_table_cols = 2;
  const BatchInput ni = narrow.input();
  EXPECT_TRUE(IsInvalidArgument(build_mixed_matrix({md_, ni, 4}, {}, out.view()),
                                {"batch.block_table", "page 2", "2 columns"}));
  EXPECT_EQ(out.data, Row(7 * 8, kPoison));
}

TEST_F(Example1, DeviceViewsNeedTheCudaBackend) {
  if (cuda_backend_available()) GTEST_SKIP() << "a CUDA device is present";
  SwaMetadata dev = md_;
  dev.space = MemorySpace::kDevice;
  Output out(7, 8);
  // Host output for device metadata: a space mismatch, named.
  EXPECT_TRUE(IsInvalidArgument(build_mixed_matrix({dev, input_, 4}, {}, out.view()),
                                {"metadata.decode_swa", "expected device memory", "got host"}));
  // All views "device" (never dereferenced here): no backend can run them on this machine.
  dev.decode_swa.space = dev.prefill_swa.space = MemorySpace::kDevice;
  BatchInput batch = input_;
  batch.block_table.space = MemorySpace::kDevice;
  IndexView view = out.view();
  view.space = MemorySpace::kDevice;
  const Status st = build_mixed_matrix({dev, batch, 4}, {}, view);
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kInternal)
      << st.to_string();
  EXPECT_EQ(out.data, Row(7 * 8, kPoison));
}

// ------------------------------------------------------------------ randomized properties

// Every consumer against the builder's own rows, on random batches of every mode, a third of
// them with bounded replay (pages below the replay start freed).
TEST(ConsumerProperties, RandomBatchesAgreeWithBuilderRows) {
  testing::RandomBatch gen(20261129, testing::builder_test_options());
  int checked_prefill_rows = 0, replayed_prefill_rows = 0;
  for (int iter = 0; iter < 300; ++iter) {
    testing::RandomCase rc = gen.next();
    SCOPED_TRACE(rc.describe());
    auto builder = cpu_builder(rc.config);
    const BatchInput input = rc.batch.input();
    SwaMetadata md;
    SPARSE_SWA_ASSERT_OK(builder->build(input, &md));
    const ConsumerStep step{md, input, rc.config.block_size};
    const int32_t t_count = md.num_tokens, td = md.num_decode_tokens;

    // Mixed matrix, SWA-only layer, verbatim form: decode rows copied, prefill rows recomputed
    // == builder rows (the SM100 form: ConsumerProperties.RelaidRowsKeepTheKernelContract).
    const MixedMatrixShape shape = mixed_matrix_shape(md, {});
    Output mixed(t_count, shape.row_width, formulas::round_up(shape.row_width + 4, 4));
    Row swa_lens(t_count, kPoison);
    SPARSE_SWA_ASSERT_OK(
        build_mixed_matrix(step, {}, MixedMatrixForm::kVerbatim, mixed.view(), swa_lens));
    for (int32_t t = 0; t < t_count; ++t) {
      const bool valid = md.is_valid_token[t];
      const ConstIndexView& v = t < td ? md.decode_swa : md.prefill_swa;
      const int64_t i = t < td ? t : t - td;
      const int32_t n = valid ? v.lens[i] : 0;
      ASSERT_EQ(swa_lens[t], n) << "token " << t;
      ASSERT_EQ(mixed.lens[t], valid ? shape.swa_width : 0) << "token " << t;
      ASSERT_EQ(mixed.row(t, n), Row(v.row(i), v.row(i) + n)) << "token " << t;
      for (int32_t j = n; j < shape.row_width; ++j) ASSERT_EQ(mixed.row(t)[j], -1);
      checked_prefill_rows += t >= td;
      if (t >= td && valid) {  // a window the replay start clipped
        const int32_t r = md.token_to_req_indices[t];
        const int32_t pos = rc.batch.prefix_len(r) + t - input.query_start_loc[r];
        replayed_prefill_rows += md.replay_start[r] > pos - (md.window_size - 1);
      }
    }

    // Ragged of both views: the dense prefixes, packed.
    for (const ConstIndexView* v : {&md.decode_swa, &md.prefill_swa}) {
      Row indptr(v->rows + 1, kPoison), values(std::max<int64_t>(ragged_capacity(*v), 1));
      SPARSE_SWA_ASSERT_OK(
          to_ragged(*v, {indptr.data(), v->rows + 1, values.data(), ragged_capacity(*v)}));
      for (int64_t i = 0; i < v->rows; ++i) {
        ASSERT_EQ(indptr[i + 1] - indptr[i], v->lens[i]);
        ASSERT_TRUE(std::equal(v->row(i), v->row(i) + v->lens[i], values.begin() + indptr[i]));
      }
    }

    // Combined prefill of every chunk: each SWA entry maps back to the builder's slot.
    auto plan = prefill_chunk_plan(md, 1, 4);
    SPARSE_SWA_ASSERT_OK(plan.status());
    for (const ChunkPlanEntry& chunk : plan.value()) {
      auto cs = combined_prefill_shape(md, chunk, 0);
      SPARSE_SWA_ASSERT_OK(cs.status());
      Output comb(cs.value().rows, cs.value().width);
      SPARSE_SWA_ASSERT_OK(build_combined_prefill(step, chunk, 1, {}, comb.view()));
      int32_t first = td;
      for (int32_t p = 0; p < chunk.start; ++p) first += md.prefill_query_lens_host[p];
      for (int32_t i = 0; i < cs.value().rows; ++i) {
        const int32_t t = first + i, p = t - td;
        const int32_t r = md.token_to_req_indices[t];
        const int32_t b = r - md.num_decodes - chunk.start;
        const int32_t gather_start = input.seq_lens[r] - md.prefill_gather_lens[r - md.num_decodes];
        const int32_t n = md.is_valid_token[t] ? md.prefill_swa.lens[p] : 0;
        // The combined row is the builder row's tail inside the gathered range (an image-widened
        // window may start before gather_start); map each entry back to its position.
        const int32_t len = comb.lens[i];
        ASSERT_LE(len, n) << "token " << t;
        int32_t k = 0;
        for (; k < len; ++k) {
          const int32_t e = comb.row(i)[k];
          ASSERT_GE(e, chunk.total_width * b + chunk.compressed_width);
          ASSERT_LT(e, chunk.total_width * (b + 1));
          const int32_t position =
              e - chunk.total_width * b - chunk.compressed_width + gather_start;
          const int64_t slot = rc.batch.slot(r, position);
          ASSERT_EQ(slot, md.prefill_swa.row(p)[n - len + k]) << "token " << t << " entry " << k;
        }
        for (; k < comb.width; ++k) ASSERT_EQ(comb.row(i)[k], -1);
      }
    }
  }
  EXPECT_GT(checked_prefill_rows, 1000);
  EXPECT_GT(replayed_prefill_rows, 100);
}

}  // namespace
}  // namespace sparse_swa
