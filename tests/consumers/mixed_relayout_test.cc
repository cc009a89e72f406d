// SPDX-License-Identifier: Apache-2.0
// The mixed matrix's FlashInfer SM100 form (docs/semantics.md#mixed-matrix), CPU reference:
// docs Example 3 re-laid by hand (SWA-only and C4A layers), the verbatim form beside it, the
// width bound and the other errors of a re-laid row, and random batches of every mode checked
// against the kernel contract the relayout exists for. Expected values are hand-computed from
// the rules, never produced by this library.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "sparse_swa/consumers.h"
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

// Example 3 (docs/semantics.md#example-3-dspark-draft): W = 8, B = 4, DSpark k = 3 (Wn = 64),
// request 0 seq 13 ql 3 (prefix 10), request 1 seq 5 ql 3 (prefix 2), causal = false.
class Example3 : public ::testing::Test {
 protected:
  void SetUp() override {
    BuilderConfig c;
    c.window_size = 8;
    c.block_size = 4;
    c.max_num_batched_tokens = 64;
    c.max_num_seqs = 8;
    c.max_model_len = 64;
    c.speculative_method = SpeculativeMethod::kDspark;
    c.num_speculative_tokens = 3;
    c.compress_ratios = {1, 4};
    batch_.add_request(13, 3, {7, 3, 9, 2}).add_request(5, 3, {5, 11, 6, 0}).set_causal(false);
    input_ = batch_.input();
    builder_ = cpu_builder(c);
    SPARSE_SWA_ASSERT_OK(builder_->build(input_, &md_));
    ASSERT_EQ(md_.decode_swa.width, 64);
    ASSERT_EQ(md_.num_decode_tokens, 6);
  }
  ConsumerStep step() const { return {md_, input_, 4}; }

  TestBatch batch_{4};
  BatchInput input_;
  std::unique_ptr<MetadataBuilder> builder_;
  SwaMetadata md_;
};

// Request 0 (prefix 10 >= W): wl = 8, sp = 3 for all three tokens, the row unchanged, lens 11.
// Request 1 (prefix 2): wl = 3, 4, 5 and sp = 2, 1, 0 for tokens 3, 4, 5.
TEST_F(Example3, Sm100FormReLaysNonCausalRows) {
  Output out(6, 64);
  Row swa_lens(6, kPoison);
  SPARSE_SWA_ASSERT_OK(build_mixed_matrix(step(), {}, out.view(), swa_lens));
  const Row req0 = padded({30, 31, 12, 13, 14, 15, 36, 37, 38, 39, 8}, 64);
  for (int t = 0; t < 3; ++t) EXPECT_EQ(out.row(t), req0) << t;
  EXPECT_EQ(out.row(3), padded({20, 21, 22, -1, -1, -1, -1, -1, 23, 44}, 64));
  EXPECT_EQ(out.row(4), padded({20, 21, 22, 23, -1, -1, -1, -1, 44}, 64));
  EXPECT_EQ(out.row(5), padded({20, 21, 22, 23, 44}, 64));
  EXPECT_EQ(out.lens, Row({11, 11, 11, 10, 9, 8}));
  EXPECT_EQ(swa_lens, Row({11, 11, 11, 5, 5, 5}));
}

// The verbatim form: the builder's rows as they are, lens = S = 64.
TEST_F(Example3, VerbatimFormCopiesRows) {
  Output out(6, 64);
  Row swa_lens(6, kPoison);
  SPARSE_SWA_ASSERT_OK(
      build_mixed_matrix(step(), {}, MixedMatrixForm::kVerbatim, out.view(), swa_lens));
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(out.row(t), padded({30, 31, 12, 13, 14, 15, 36, 37, 38, 39, 8}, 64)) << t;
  }
  for (int t = 3; t < 6; ++t) EXPECT_EQ(out.row(t), padded({20, 21, 22, 23, 44}, 64)) << t;
  EXPECT_EQ(out.lens, Row(6, 64));
  EXPECT_EQ(swa_lens, Row({11, 11, 11, 5, 5, 5}));
}

// A C4A layer: compressed block size 2, tables req 0 -> [3, 5], req 1 -> [8, 9], decode local
// top-k (TOP_K 2) [0, 1], [1, -1], [2, 0] and [0, -1], [-1, -1], [1, 0]: global slots
// 0 -> 6, 1 -> 7, 2 -> 10 (req 0), 0 -> 16, 1 -> 17 (req 1). P = 4, row width 68; the compressed
// entries follow the SWA entries at cs = W + sp, not at S.
TEST_F(Example3, Sm100FormPutsCompressedEntriesAfterTheSpill) {
  const Row cbt = {3, 5, 8, 9};
  const Row local = {0, 1, 1, -1, 2, 0, 0, -1, -1, -1, 1, 0};
  CompressedTopk topk;
  topk.cache = {{cbt.data(), 2, 2, 2, MemorySpace::kHost}, 2, 4};
  topk.decode_local = {local.data(), 6, 2, 2, MemorySpace::kHost};
  const MixedMatrixShape shape = mixed_matrix_shape(md_, topk);
  ASSERT_EQ(shape.row_width, 68);
  Output out(6, 68);
  SPARSE_SWA_ASSERT_OK(build_mixed_matrix(step(), topk, out.view()));
  const Row swa0 = {30, 31, 12, 13, 14, 15, 36, 37, 38, 39, 8};
  auto with = [](Row r, Row tail) {
    r.insert(r.end(), tail.begin(), tail.end());
    return padded(r, 68);
  };
  EXPECT_EQ(out.row(0), with(swa0, {6, 7}));
  EXPECT_EQ(out.row(1), with(swa0, {7, -1}));
  EXPECT_EQ(out.row(2), with(swa0, {10, 6}));
  EXPECT_EQ(out.row(3), with({20, 21, 22, -1, -1, -1, -1, -1, 23, 44}, {16, -1}));
  EXPECT_EQ(out.row(4), with({20, 21, 22, 23, -1, -1, -1, -1, 44}, {-1, -1}));
  EXPECT_EQ(out.row(5), with({20, 21, 22, 23, 44, -1, -1, -1}, {17, 16}));
  EXPECT_EQ(out.lens, Row({13, 12, 13, 11, 9, 10}));

  Output verbatim(6, 68);
  SPARSE_SWA_ASSERT_OK(
      build_mixed_matrix(step(), topk, MixedMatrixForm::kVerbatim, verbatim.view()));
  EXPECT_EQ(verbatim.row(3), with(padded({20, 21, 22, 23, 44}, 64), {16, -1}));
  EXPECT_EQ(verbatim.lens, Row({66, 65, 66, 65, 64, 66}));
}

// An invalid token inside a block keeps row -1 and lens 0; its neighbours are re-laid as before.
TEST(MixedRelayout, InvalidTokenInsideABlock) {
  BuilderConfig c;
  c.window_size = 8;
  c.block_size = 4;
  c.max_num_batched_tokens = 8;
  c.max_num_seqs = 2;
  c.max_model_len = 64;
  c.speculative_method = SpeculativeMethod::kDspark;
  c.num_speculative_tokens = 3;
  TestBatch batch(4);
  batch.add_request(5, 3, {5, 11, 6, 0}).set_causal(false).invalidate(1);
  const BatchInput input = batch.input();
  auto builder = cpu_builder(c);
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(input, &md));
  Output out(3, 64);
  SPARSE_SWA_ASSERT_OK(build_mixed_matrix({md, input, 4}, {}, out.view()));
  EXPECT_EQ(out.row(0), padded({20, 21, 22, -1, -1, -1, -1, -1, 23, 44}, 64));
  EXPECT_EQ(out.row(1), Row(64, -1));
  EXPECT_EQ(out.row(2), padded({20, 21, 22, 23, 44}, 64));
  EXPECT_EQ(out.lens, Row({10, 0, 8}));
}

// Hand-made metadata of one non-causal block, W = 8, identity pages: prefix 2, ql 3 (the
// builder's row 0 1 2 3 4, lens 5) in a decode view `width` wide.
struct OneBlock {
  explicit OneBlock(int32_t width, int32_t max_decode_query_len) {
    rows.assign(3 * width, -1);
    for (int t = 0; t < 3; ++t) {
      for (int j = 0; j < 5; ++j) rows[t * width + j] = j;
    }
    md.causal = false;
    md.num_reqs = 1;
    md.num_tokens = 3;
    md.num_decodes = 1;
    md.num_decode_tokens = 3;
    md.max_decode_query_len = max_decode_query_len;
    md.token_to_req_indices = t2r;
    md.is_valid_token = valid;
    md.decode_swa = {rows.data(), lens.data(), 3, width, width, 8, MemorySpace::kHost};
    md.prefill_swa = {nullptr, nullptr, 0, 8, 8, 8, MemorySpace::kHost};
    md.window_size = 8;
    batch = {qsl, seq, {bt.data(), 1, 2, 2, MemorySpace::kHost}, {}, false, {}};
  }
  ConsumerStep step() const { return {md, batch, 4}; }
  Row qsl = {0, 3}, seq = {5}, bt = {0, 1}, t2r = {0, 0, 0}, lens = {5, 5, 5}, rows;
  std::vector<uint8_t> valid = {1, 1, 1};
  SwaMetadata md;
  BatchInput batch;
};

// Token 0 has wl = 3, sp = 2: its relayout needs W + sp = 10 columns. A 9-wide view (which the
// host check W + max_decode_query_len = 9 accepts, since the metadata understates the block) is
// an error naming the width; 10 columns are enough.
TEST(MixedRelayout, RowNeedingMoreColumnsThanSIsAnError) {
  OneBlock narrow(9, 1);
  Output out(3, 12);
  EXPECT_TRUE(IsInvalidArgument(
      build_mixed_matrix(narrow.step(), {}, out.view()),
      {"metadata.decode_swa.width: the relaid non-causal row of token 0 (request 0, query_len 3, "
       "prefix 2) needs window_size + spill = 8 + 2 = 10 SWA columns, expected <= the mixed "
       "matrix's S = 9, got 10"}));
  EXPECT_TRUE(out.untouched());
  // The verbatim form needs no more than the row.
  SPARSE_SWA_ASSERT_OK(
      build_mixed_matrix(narrow.step(), {}, MixedMatrixForm::kVerbatim, out.view()));
  EXPECT_EQ(out.lens, Row({9, 9, 9}));

  OneBlock enough(10, 1);
  Output fits(3, 12);
  SPARSE_SWA_ASSERT_OK(build_mixed_matrix(enough.step(), {}, fits.view()));
  EXPECT_EQ(fits.row(0), padded({0, 1, 2, -1, -1, -1, -1, -1, 3, 4}, 12));
  EXPECT_EQ(fits.lens, Row({10, 9, 8}));
}

// A row that is not the builder's non-causal row (its lens differ from min(prefix, W) + ql, as
// causal rows written into the non-causal view would) cannot be re-laid.
TEST(MixedRelayout, RowThatIsNotTheNonCausalRowIsAnError) {
  OneBlock block(16, 3);
  block.lens = {3, 4, 5};  // the causal lens of positions 2, 3, 4
  block.md.decode_swa.lens = block.lens.data();
  Output out(3, 16);
  EXPECT_TRUE(IsInvalidArgument(
      build_mixed_matrix(block.step(), {}, out.view()),
      {"metadata.decode_swa.lens[0]: expected the non-causal row's min(prefix, window_size) + "
       "query_len = min(2, 8) + 3 = 5, got 3"}));
  EXPECT_TRUE(out.untouched());
  SPARSE_SWA_ASSERT_OK(
      build_mixed_matrix(block.step(), {}, MixedMatrixForm::kVerbatim, out.view()));
}

TEST(MixedRelayout, TokenOutsideItsRequestOrShortSeqLenIsAnError) {
  OneBlock block(16, 3);
  block.qsl = {0, 2};  // token 2 now lies past its request's tokens
  block.batch.query_start_loc = block.qsl;
  Output out(3, 16);
  EXPECT_TRUE(IsInvalidArgument(
      build_mixed_matrix(block.step(), {}, out.view()),
      {"token 2: maps to request 0 but batch.query_start_loc gives that request tokens [0, 2)"}));
  OneBlock short_seq(16, 3);
  short_seq.seq = {2};
  short_seq.batch.seq_lens = short_seq.seq;
  EXPECT_TRUE(IsInvalidArgument(build_mixed_matrix(short_seq.step(), {}, out.view()),
                                {"batch.seq_lens[0]: expected >= query length 3, got 2"}));
  EXPECT_TRUE(out.untouched());
}

TEST(MixedRelayout, FormNames) {
  EXPECT_STREQ(mixed_matrix_form_name(MixedMatrixForm::kFlashInferSm100), "flashinfer_sm100");
  EXPECT_STREQ(mixed_matrix_form_name(MixedMatrixForm::kVerbatim), "verbatim");
  for (MixedMatrixForm f : {MixedMatrixForm::kFlashInferSm100, MixedMatrixForm::kVerbatim}) {
    auto parsed = parse_mixed_matrix_form(mixed_matrix_form_name(f));
    SPARSE_SWA_ASSERT_OK(parsed.status());
    EXPECT_EQ(parsed.value(), f);
  }
  EXPECT_TRUE(
      IsInvalidArgument(parse_mixed_matrix_form("sm100").status(),
                        {"form: expected \"flashinfer_sm100\" or \"verbatim\", got 'sm100'"}));
  OneBlock block(16, 3);
  Output out(3, 16);
  EXPECT_TRUE(IsInvalidArgument(
      build_mixed_matrix(block.step(), {}, static_cast<MixedMatrixForm>(7), out.view()),
      {"form: expected kFlashInferSm100 or kVerbatim, got 7"}));
}

// Random batches of every mode, SM100 form, SWA-only layer. Each valid row: lens <= S and -1 from
// lens on; a re-laid row shows, by an independent computation from positions, the context-and-
// block slots with no -1 in the kernel's key ranges [0, min(W, pos + 1)) and [W, lens); causal
// decode rows and prefill rows are the verbatim form's. A third of the batches replay (DSpark
// rows ignore it).
TEST(MixedRelayout, RandomBatchesKeepTheKernelContract) {
  testing::RandomBatch gen(20261214, testing::builder_test_options());
  int64_t relaid_rows = 0, partial_windows = 0;
  for (int iter = 0; iter < 400; ++iter) {
    testing::RandomCase rc = iter % 2 ? gen.next(testing::BatchMode::kDsparkNonCausal) : gen.next();
    SCOPED_TRACE(rc.describe());
    auto builder = cpu_builder(rc.config);
    const BatchInput input = rc.batch.input();
    SwaMetadata md;
    SPARSE_SWA_ASSERT_OK(builder->build(input, &md));
    const ConsumerStep step{md, input, rc.config.block_size};
    const MixedMatrixShape shape = mixed_matrix_shape(md, {});
    const int32_t s = shape.swa_width, w = md.window_size, td = md.num_decode_tokens;
    Output sm100(md.num_tokens, shape.row_width), verbatim(md.num_tokens, shape.row_width);
    Row swa_lens(md.num_tokens, kPoison);
    SPARSE_SWA_ASSERT_OK(build_mixed_matrix(step, {}, sm100.view(), swa_lens));
    SPARSE_SWA_ASSERT_OK(build_mixed_matrix(step, {}, MixedMatrixForm::kVerbatim, verbatim.view()));
    for (int32_t t = 0; t < md.num_tokens; ++t) {
      const Row got = sm100.row(t);
      const int32_t len = sm100.lens[t];
      if (!md.is_valid_token[t]) {
        ASSERT_EQ(len, 0);
        ASSERT_EQ(got, Row(shape.row_width, -1));
        continue;
      }
      ASSERT_LE(len, s) << "token " << t;
      for (int32_t j = len; j < shape.row_width; ++j) ASSERT_EQ(got[j], -1) << t << " " << j;
      if (t >= td || md.causal) {
        ASSERT_EQ(got, verbatim.row(t)) << "token " << t;
        ASSERT_EQ(len, verbatim.lens[t]) << "token " << t;
        continue;
      }
      const int32_t r = md.token_to_req_indices[t];
      const int32_t qs = input.query_start_loc[r];
      const int32_t ql = input.query_start_loc[r + 1] - qs, ctx = input.seq_lens[r] - ql;
      const int32_t pos = ctx + (t - qs), start = std::max(ctx - w, 0);
      const int32_t wl = std::min(pos + 1, w), sp = std::min(ctx, w) + ql - wl;
      ASSERT_EQ(len, w + sp) << "token " << t;
      ASSERT_EQ(swa_lens[t], wl + sp) << "token " << t;
      for (int32_t j = 0; j < len; ++j) {
        const int32_t p = j < wl ? start + j : j < w ? -1 : start + wl + (j - w);
        const int32_t want = p < 0 ? -1 : static_cast<int32_t>(rc.batch.slot(r, p));
        ASSERT_EQ(got[j], want) << "token " << t << " column " << j;
        const bool key = j < std::min(w, pos + 1) || j >= w;
        if (key) ASSERT_GE(got[j], 0) << "token " << t << " column " << j;
      }
      ++relaid_rows;
      partial_windows += wl < w;
    }
  }
  EXPECT_GT(relaid_rows, 500);
  EXPECT_GT(partial_windows, 20);
}

}  // namespace
}  // namespace sparse_swa
