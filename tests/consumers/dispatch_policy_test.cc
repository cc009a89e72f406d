// SPDX-License-Identifier: Apache-2.0
// Dispatch-width policy: choose_width, the built-in policies and validate_config.
#include "sparse_swa/dispatch_policy.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/status_matchers.h"

namespace sparse_swa {
namespace {

using testing::IsInvalidArgument;

DispatchPolicy builtin(const std::string& name) {
  auto p = builtin_policy(name);
  if (!p.ok()) throw std::runtime_error(p.status().to_string());
  return p.value();
}

DispatchPolicy only_widths(std::vector<int32_t> widths) {
  DispatchPolicy p;
  p.name = "test_policy";
  DispatchRule r;
  r.topk = AcceptedValues::list(std::move(widths));
  p.rules.push_back(r);
  return p;
}

// DSV4-Flash-like: W = 128, B = 64, C4A + C128A layers, max_model_len 64K.
BuilderConfig flash_config() {
  BuilderConfig c;
  c.window_size = 128;
  c.block_size = 64;
  c.max_num_batched_tokens = 8192;
  c.max_num_seqs = 256;
  c.max_model_len = 65536;
  c.compress_ratios = {1, 4, 128};
  return c;
}

BuilderConfig dspark(BuilderConfig c, int32_t k) {
  c.speculative_method = SpeculativeMethod::kDspark;
  c.parallel_drafting = true;
  c.num_speculative_tokens = k;
  return c;
}

// 133 needed entries -> 192 on SM120 (an instantiated width), 256 for a 256-only kernel,
// and a clear error listing the accepted widths when nothing >= 133 is accepted.
TEST(ChooseWidth, Width133) {
  EXPECT_EQ(choose_width(133, builtin("flashinfer_sm120_decode"), {64}).value(), 192);
  EXPECT_EQ(choose_width(133, only_widths({256})).value(), 256);
  EXPECT_TRUE(IsInvalidArgument(
      choose_width(133, only_widths({64, 128})).status(),
      {"test_policy", "no accepted topk width >= 133", "accepted topk widths: {64, 128}"}));
}

TEST(ChooseWidth, FlashMlaDependsOnHeads) {
  const DispatchPolicy p = builtin("flashmla_sparse_decode");
  EXPECT_EQ(choose_width(133, p, {64}).value(), 192);
  EXPECT_EQ(choose_width(133, p, {128}).value(), 256);
  EXPECT_EQ(choose_width(128, p, {128}).value(), 128);
  EXPECT_EQ(choose_width(133, p).value(), 192);  // heads unspecified: any rule
  EXPECT_TRUE(
      IsInvalidArgument(choose_width(133, p, {32}).status(),
                        {"flashmla_sparse_decode", "heads 32", "accepted topk widths: none"}));
}

TEST(ChooseWidth, AnyWidthPoliciesAndMixedRows) {
  EXPECT_EQ(choose_width(133, builtin("rocm_ragged")).value(), 133);
  EXPECT_EQ(choose_width(133, builtin("sparse_swa")).value(), 133);
  EXPECT_EQ(choose_width(133, builtin("flashinfer_sm100"), {64}).value(), 136);  // row % 4
  EXPECT_TRUE(IsInvalidArgument(choose_width(0, builtin("sparse_swa")).status(),
                                {"needed", "expected >= 1", "got 0"}));
}

TEST(ChooseWidth, Topk1024And2048) {
  const DispatchPolicy sm120 = builtin("flashinfer_sm120_decode");
  EXPECT_EQ(choose_width(1024, sm120, {128}).value(), 1024);
  EXPECT_TRUE(IsInvalidArgument(choose_width(2048, sm120, {128}).status(),
                                {"no accepted topk width >= 2048", "{128, 192, 256, 512, 1024}"}));
  EXPECT_EQ(choose_width(2048, builtin("flashmla_sparse_decode"), {128}).value(), 2048);
  EXPECT_EQ(choose_width(2047, builtin("flashmla_sparse_decode"), {64}).value(), 2048);
}

TEST(ChooseWidth, PredicatePolicy) {
  DispatchPolicy p;
  p.name = "envelope";
  p.predicate = [](const DispatchTuple& t) { return t.topk >= 160 && t.topk % 32 == 0; };
  p.predicate_description = "topk >= 160, multiple of 32";
  EXPECT_EQ(choose_width(133, p).value(), 160);
  EXPECT_EQ(choose_width(161, p).value(), 192);
  p.max_topk = 150;
  EXPECT_TRUE(IsInvalidArgument(choose_width(133, p).status(),
                                {"envelope", "(<= 150)", "topk >= 160, multiple of 32"}));
  // Rules and a predicate together: the smallest rule width the predicate also accepts.
  DispatchPolicy q = only_widths({128, 192, 256});
  q.predicate = [](const DispatchTuple& t) { return t.topk != 192; };
  EXPECT_EQ(choose_width(133, q).value(), 256);
}

TEST(ChooseWidth, ExtraTopkRestrictsRules) {
  const DispatchPolicy p = builtin("flashinfer_sm120_decode");
  EXPECT_EQ(choose_width(100, p, {64, 0, 64, 512, 64}).value(), 128);
  EXPECT_FALSE(choose_width(100, p, {64, 0, 64, 100, 64}).ok());  // extra not a multiple of 64
}

TEST(BuiltinPolicies, NamesAndUnknown) {
  for (const std::string& name : builtin_policy_names()) {
    auto p = builtin_policy(name);
    ASSERT_TRUE(p.ok()) << name;
    EXPECT_EQ(p.value().name, name);
  }
  EXPECT_TRUE(IsInvalidArgument(builtin_policy("flashmla").status(),
                                {"consumer", "flashmla_sparse_decode", "got \"flashmla\""}));
  EXPECT_FALSE(DispatchPolicy{}.accepts({64, 128}));  // no rules: accepts nothing
}

TEST(ValidateConfig, CausalFlashConfigPassesEveryKernel) {
  for (const std::string& name : builtin_policy_names()) {
    SCOPED_TRACE(name);
    SPARSE_SWA_EXPECT_OK(validate_config(flash_config(), builtin(name), {64, 256, 512}));
  }
}

TEST(ValidateConfig, EnumeratesEveryTupleOfTheConfig) {
  const BuilderConfig c = dspark(flash_config(), 5);
  auto tuples = enumerate_dispatch_tuples(c, builtin("flashmla_sparse_decode"), {64, 256, 512});
  SPARSE_SWA_ASSERT_OK(tuples.status());
  // swaonly, c4a, c128a x {causal W, non-causal Wn}; FlashMLA decode reads no prefill rows.
  ASSERT_EQ(tuples.value().size(), 6u);
  EXPECT_EQ(tuples.value()[0].source, "decode causal swaonly");
  EXPECT_EQ(tuples.value()[0].tuple, (DispatchTuple{64, 128, 64, 0, 0}));
  EXPECT_EQ(tuples.value()[3].source, "decode non-causal (dspark) c4a");
  EXPECT_EQ(tuples.value()[3].tuple, (DispatchTuple{64, 192, 64, 512, 64}));
  // C128A: extra_topk = round_up(ceil(65536 / 128), 128) = 512, page 256 / 128 = 2.
  EXPECT_EQ(tuples.value()[5].tuple, (DispatchTuple{64, 192, 64, 512, 2}));
  for (const TupleCheck& t : tuples.value()) EXPECT_TRUE(t.accepted) << t.source;
}

// FlashMLA's 128-head kernel needs topk % 128 == 0; DSpark's Wn = 192 is rejected at
// start-up, naming the tuple.
TEST(ValidateConfig, FlashMla128HeadsRejectsDsparkWidth192) {
  const BuilderConfig c = dspark(flash_config(), 5);
  EXPECT_TRUE(
      IsInvalidArgument(validate_config(c, builtin("flashmla_sparse_decode"), {128, 256, 512}),
                        {"flashmla_sparse_decode rejects decode non-causal (dspark) swaonly",
                         "heads 128, topk 192", "accepted:", "multiples of 128"}));
  SPARSE_SWA_EXPECT_OK(validate_config(c, builtin("flashinfer_sm120_decode"), {64, 256, 512}));
}

TEST(ValidateConfig, VisionPrefillRowsWidth) {
  BuilderConfig c = flash_config();
  c.max_image_tokens = 1024;  // W + Mi = 1152 (a vision config with Mi = 1024)
  auto tuples = enumerate_dispatch_tuples(c, builtin("sparse_swa"), {64, 256, 512});
  SPARSE_SWA_ASSERT_OK(tuples.status());
  ASSERT_EQ(tuples.value().size(), 6u);  // causal decode + prefill, per layer type
  EXPECT_EQ(tuples.value()[1].source, "prefill vision (W + Mi) swaonly");
  EXPECT_EQ(tuples.value()[1].tuple.topk, 1152);
  // A separate-layout kernel that also reads prefill rows, with SM120's width set.
  DispatchPolicy p = builtin("flashinfer_sm120_decode");
  p.reads_prefill_rows = true;
  EXPECT_TRUE(IsInvalidArgument(validate_config(c, p, {64, 256, 512}),
                                {"rejects prefill vision (W + Mi) swaonly", "topk 1152"}));
  // The mixed layout folds prefill rows into S = max(W, W + Mi).
  auto mixed = enumerate_dispatch_tuples(c, builtin("flashinfer_sm100"), {64, 256, 512});
  SPARSE_SWA_ASSERT_OK(mixed.status());
  ASSERT_EQ(mixed.value().size(), 3u);
  EXPECT_EQ(mixed.value()[0].tuple.topk, 1152);
  EXPECT_EQ(mixed.value()[1].tuple.topk, 1152 + 512);
}

TEST(ValidateConfig, BadDeploymentShapeAndConfig) {
  EXPECT_TRUE(
      IsInvalidArgument(validate_config(flash_config(), builtin("sparse_swa"), {0, 256, 512}),
                        {"deployment.heads", "expected >= 1", "got 0"}));
  EXPECT_TRUE(
      IsInvalidArgument(validate_config(flash_config(), builtin("sparse_swa"), {64, 100, 512}),
                        {"deployment.attn_block_size", "compress ratio 128", "got 100"}));
  BuilderConfig bad = flash_config();
  bad.window_size = 0;
  EXPECT_TRUE(
      IsInvalidArgument(validate_config(bad, builtin("sparse_swa"), {}), {"config.window_size"}));
}

// choose_noncausal_width: the non-causal width through a policy, >= W + theta.
TEST(ChooseNoncausalWidth, FollowsThePolicy) {
  const BuilderConfig c = dspark(flash_config(), 5);  // theta 11: needs 139
  EXPECT_EQ(choose_noncausal_width(c, builtin("flashinfer_sm120_decode"), {64}).value(), 192);
  EXPECT_EQ(choose_noncausal_width(c, builtin("flashmla_sparse_decode"), {128}).value(), 256);
  EXPECT_EQ(choose_noncausal_width(c, builtin("sparse_swa"), {64}).value(), 139);
  EXPECT_TRUE(IsInvalidArgument(
      choose_noncausal_width(flash_config(), builtin("sparse_swa"), {64}).status(),
      {"config.speculative_method", "expected dspark", "got none"}));
}

TEST(AcceptedValues, Describe) {
  EXPECT_EQ(AcceptedValues::list({128, 192}).describe(), "{128, 192}");
  EXPECT_EQ(AcceptedValues::multiple_of(64).describe(), "multiples of 64");
  EXPECT_EQ(AcceptedValues::any().describe(), "any");
  EXPECT_EQ(AcceptedValues::multiple_of(64).smallest_at_least(1).value(), 64);
  EXPECT_FALSE(AcceptedValues::list({128}).smallest_at_least(129).has_value());
}

}  // namespace
}  // namespace sparse_swa
