// SPDX-License-Identifier: Apache-2.0
// The builder's DSpark row width chosen through a consumer's dispatch policy, so the producer
// writes exactly the width the consumer kernel is instantiated for
// (docs/semantics.md#dspark-width).
#include <gtest/gtest.h>

#include "sparse_swa/dispatch_policy.h"
#include "sparse_swa/metadata_builder.h"
#include "testing/test_batch.h"

namespace sparse_swa {
namespace {

BuilderConfig dspark_config() {
  BuilderConfig c;
  c.window_size = 128;
  c.block_size = 64;
  c.max_num_batched_tokens = 256;
  c.max_num_seqs = 16;
  c.max_model_len = 8192;
  c.speculative_method = SpeculativeMethod::kDspark;
  c.num_speculative_tokens = 5;
  c.parallel_drafting = true;  // theta = 11: a row holds up to W + 11 = 139 entries
  return c;
}

TEST(NoncausalWidthPolicy, BuilderEmitsTheWidthTheConsumerAccepts) {
  BuilderConfig c = dspark_config();
  auto sm120 = builtin_policy("flashinfer_sm120_decode");
  ASSERT_TRUE(sm120.ok()) << sm120.status().to_string();
  DeploymentShape shape;
  shape.heads = 8;
  auto width = choose_noncausal_width(c, sm120.value(), shape);
  ASSERT_TRUE(width.ok()) << width.status().to_string();
  EXPECT_EQ(width.value(), 192);  // the smallest of {128, 192, 256, 512, 1024} >= 139
  c.noncausal_index_width = width.value();
  auto builder = MetadataBuilder::create(c);
  ASSERT_TRUE(builder.ok()) << builder.status().to_string();
  testing::TestBatch b(64);
  b.add_identity_request(500, 11).add_identity_request(40, 11).set_causal(false);
  SwaMetadata md;
  ASSERT_TRUE((*builder)->build(b.input(), &md).ok());
  EXPECT_EQ(md.decode_swa_width(), 192);
  EXPECT_EQ(md.decode_swa.window, 128);
  EXPECT_EQ(md.decode_swa.lens[0], 139);  // min(prefix 489, W) + 11, never truncated
  EXPECT_EQ(md.decode_swa.row(0)[138], 499);
  EXPECT_EQ(md.decode_swa.row(0)[139], -1);
  EXPECT_EQ(md.decode_swa.lens[11], 40);  // min(prefix 29, W) + 11
}

TEST(NoncausalWidthPolicy, A256OnlyPolicyGives256) {
  BuilderConfig c = dspark_config();
  auto flashmla = builtin_policy("flashmla_sparse_decode");
  ASSERT_TRUE(flashmla.ok());
  DeploymentShape shape;
  shape.heads = 128;  // FlashMLA h_q 128: top-k multiple of 128
  auto width = choose_noncausal_width(c, flashmla.value(), shape);
  ASSERT_TRUE(width.ok()) << width.status().to_string();
  EXPECT_EQ(width.value(), 256);
}

TEST(NoncausalWidthPolicy, WidthBelowWindowPlusThresholdIsRejected) {
  BuilderConfig c = dspark_config();
  c.noncausal_index_width = 138;
  const Status st = validate_config(c);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("config.noncausal_index_width: expected window_size + decode "
                              "threshold = 139"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("got 138"), std::string::npos) << st.message();
}

TEST(NoncausalWidthPolicy, WidthWithoutDsparkIsRejected) {
  BuilderConfig c = dspark_config();
  c.speculative_method = SpeculativeMethod::kMtp;
  c.noncausal_index_width = 192;
  const Status st = validate_config(c);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("only DSpark has non-causal rows"), std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace sparse_swa
