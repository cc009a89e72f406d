// SPDX-License-Identifier: Apache-2.0
// BuilderConfig validation (one error per field, message names it) and the derived values:
// decode threshold, prefill width, the DSpark non-causal width rule and the layer types.
#include "sparse_swa/config.h"

#include <gtest/gtest.h>

#include <climits>
#include <string>
#include <vector>

#include "sparse_swa/metadata_builder.h"
#include "support/status_matchers.h"

namespace sparse_swa {
namespace {

using testing::IsInvalidArgument;
using Names = std::vector<std::string>;

BuilderConfig valid_config() {
  BuilderConfig c;
  c.window_size = 128;
  c.block_size = 64;
  c.max_num_batched_tokens = 256;
  c.max_num_seqs = 16;
  c.max_model_len = 4096;
  return c;
}

BuilderConfig speculative(SpeculativeMethod method, int32_t k, bool parallel, int32_t window) {
  BuilderConfig c = valid_config();
  c.window_size = window;
  c.speculative_method = method;
  c.num_speculative_tokens = k;
  c.parallel_drafting = parallel;
  return c;
}

TEST(ConfigValidation, ValidConfigPasses) {
  SPARSE_SWA_EXPECT_OK(validate_config(valid_config()));
  SPARSE_SWA_EXPECT_OK(validate_config(speculative(SpeculativeMethod::kDspark, 5, true, 128)));
}

struct FieldCase {
  const char* name;
  void (*mutate)(BuilderConfig&);
  std::vector<std::string> fragments;
};

class ConfigFieldErrors : public ::testing::TestWithParam<FieldCase> {};

TEST_P(ConfigFieldErrors, MessageNamesTheField) {
  BuilderConfig c = valid_config();
  GetParam().mutate(c);
  const Status st = validate_config(c);
  ASSERT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  size_t from = 0;
  for (const std::string& f : GetParam().fragments) {
    const size_t at = st.message().find(f, from);
    ASSERT_NE(at, std::string::npos) << "\"" << st.message() << "\" lacks \"" << f << "\"";
    from = at + f.size();
  }
  // create() refuses the same config with the same message.
  auto builder = MetadataBuilder::create(c);
  ASSERT_FALSE(builder.ok());
  EXPECT_EQ(builder.status().message(), st.message());
}

INSTANTIATE_TEST_SUITE_P(
    Fields, ConfigFieldErrors,
    ::testing::Values(FieldCase{"window_size",
                                [](BuilderConfig& c) { c.window_size = 0; },
                                {"config.window_size", "expected >= 1", "got 0"}},
                      FieldCase{"block_size",
                                [](BuilderConfig& c) { c.block_size = -4; },
                                {"config.block_size", "expected >= 1", "got -4"}},
                      FieldCase{"max_num_batched_tokens",
                                [](BuilderConfig& c) { c.max_num_batched_tokens = 0; },
                                {"config.max_num_batched_tokens", "expected >= 1", "got 0"}},
                      FieldCase{"max_num_seqs",
                                [](BuilderConfig& c) { c.max_num_seqs = 0; },
                                {"config.max_num_seqs", "expected >= 1", "got 0"}},
                      FieldCase{"max_model_len",
                                [](BuilderConfig& c) { c.max_model_len = 0; },
                                {"config.max_model_len", "expected >= 1", "got 0"}},
                      FieldCase{
                          "max_model_len_too_big",
                          [](BuilderConfig& c) { c.max_model_len = int64_t{INT32_MAX} + 1; },
                          {"config.max_model_len", "expected <= 2147483647", "got 2147483648"}},
                      FieldCase{"num_speculative_tokens",
                                [](BuilderConfig& c) {
                                  c.speculative_method = SpeculativeMethod::kMtp;
                                  c.num_speculative_tokens = -1;
                                },
                                {"config.num_speculative_tokens", "expected >= 0", "got -1"}},
                      FieldCase{"speculative_tokens_with_method_none",
                                [](BuilderConfig& c) { c.num_speculative_tokens = 2; },
                                {"config.num_speculative_tokens",
                                 "expected 0 with speculative_method none", "got 2"}},
                      FieldCase{"parallel_drafting_with_method_none",
                                [](BuilderConfig& c) { c.parallel_drafting = true; },
                                {"config.parallel_drafting", "expected false", "got true"}},
                      FieldCase{"max_image_tokens",
                                [](BuilderConfig& c) { c.max_image_tokens = -1; },
                                {"config.max_image_tokens", "expected >= 0", "got -1"}},
                      FieldCase{"compress_ratio_3",
                                [](BuilderConfig& c) {
                                  c.compress_ratios = {1, 3};
                                },
                                {"config.compress_ratios[1]", "{1, 2, 4, 128}", "got 3"}},
                      FieldCase{"compress_ratio_0",
                                [](BuilderConfig& c) { c.compress_ratios = {0}; },
                                {"config.compress_ratios[0]", "{1, 2, 4, 128}", "got 0"}},
                      FieldCase{"compress_ratio_64",
                                [](BuilderConfig& c) {
                                  c.compress_ratios = {4, 128, 64};
                                },
                                {"config.compress_ratios[2]", "got 64"}},
                      FieldCase{"row_width",
                                [](BuilderConfig& c) { c.max_image_tokens = 1 << 24; },
                                {"config", "widest index row", "got 16777344"}},
                      FieldCase{"buffer_size",
                                [](BuilderConfig& c) {
                                  c.max_num_batched_tokens = 1 << 24;
                                  c.max_image_tokens = 1024;
                                },
                                {"config.max_num_batched_tokens", "16777216", "width 1152"}}),
    [](const ::testing::TestParamInfo<FieldCase>& info) { return std::string(info.param.name); });

TEST(ConfigParse, SpeculativeMethodNames) {
  for (auto m : {SpeculativeMethod::kNone, SpeculativeMethod::kMtp, SpeculativeMethod::kDspark}) {
    auto parsed = parse_speculative_method(speculative_method_name(m));
    ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
    EXPECT_EQ(parsed.value(), m);
  }
  EXPECT_STREQ(speculative_method_name(SpeculativeMethod::kDspark), "dspark");
}

TEST(ConfigParse, UnknownSpeculativeMethod) {
  EXPECT_TRUE(IsInvalidArgument(parse_speculative_method("eagle").status(),
                                {"config.speculative_method", "none, mtp, dspark", "\"eagle\""}));
  EXPECT_TRUE(IsInvalidArgument(parse_speculative_method("").status(),
                                {"config.speculative_method", "got \"\""}));
  EXPECT_TRUE(IsInvalidArgument(parse_speculative_method("MTP").status(), {"\"MTP\""}));
}

TEST(ConfigParse, LayerTypeForRatio) {
  EXPECT_EQ(layer_type_for_ratio(1, "f").value(), LayerType::kSwaOnly);
  EXPECT_EQ(layer_type_for_ratio(2, "f").value(), LayerType::kC2A);
  EXPECT_EQ(layer_type_for_ratio(4, "f").value(), LayerType::kC4A);
  EXPECT_EQ(layer_type_for_ratio(128, "f").value(), LayerType::kC128A);
  EXPECT_TRUE(IsInvalidArgument(layer_type_for_ratio(256, "some.field").status(),
                                {"some.field", "{1, 2, 4, 128}", "got 256"}));
  EXPECT_STREQ(layer_type_name(LayerType::kC128A), "c128a");
  EXPECT_STREQ(layer_type_name(LayerType::kSwaOnly), "swaonly");
}

// ---------------------------------------------------------------- derived values

TEST(ConfigDerived, DecodeThreshold) {
  EXPECT_EQ(derive_config(valid_config()).decode_threshold, 1);
  EXPECT_EQ(derive_config(speculative(SpeculativeMethod::kMtp, 1, false, 128)).decode_threshold, 2);
  EXPECT_EQ(derive_config(speculative(SpeculativeMethod::kMtp, 3, false, 128)).decode_threshold, 4);
  // Parallel drafting: theta = 1 + 2k (k = 5 -> 11, k = 7 -> 15).
  EXPECT_EQ(derive_config(speculative(SpeculativeMethod::kDspark, 5, true, 128)).decode_threshold,
            11);
  EXPECT_EQ(derive_config(speculative(SpeculativeMethod::kMtp, 7, true, 128)).decode_threshold, 15);
}

TEST(ConfigDerived, PrefillIndexWidth) {
  BuilderConfig c = valid_config();
  EXPECT_EQ(derive_config(c).prefill_index_width, 128);
  c.max_image_tokens = 384;
  EXPECT_EQ(derive_config(c).prefill_index_width, 512);
  c.max_image_tokens = 1024;  // a vision config with Mi = 1024: 128 + 1024
  EXPECT_EQ(derive_config(c).prefill_index_width, 1152);
}

TEST(ConfigDerived, NonCausalWidthOnlyForDspark) {
  const DerivedConfig mtp = derive_config(speculative(SpeculativeMethod::kMtp, 5, false, 128));
  EXPECT_FALSE(mtp.is_dspark);
  EXPECT_EQ(mtp.noncausal_index_width, 0);
  const DerivedConfig ds = derive_config(speculative(SpeculativeMethod::kDspark, 5, false, 128));
  EXPECT_TRUE(ds.is_dspark);
  EXPECT_EQ(ds.noncausal_index_width, 192);  // DSV4-Flash K5 with alignment 64
}

struct WidthCase {
  int32_t window;
  int32_t k;
  bool parallel;
  int32_t reference;  // round_up(W + k, 64)
  int32_t ours;       // max(reference, round_up(W + theta, 64))
};

class ConfigNonCausalWidth : public ::testing::TestWithParam<WidthCase> {};

TEST_P(ConfigNonCausalWidth, ReferenceAndRaisedRule) {
  const WidthCase& p = GetParam();
  EXPECT_EQ(reference_noncausal_width(p.window, p.k), p.reference);
  const DerivedConfig d =
      derive_config(speculative(SpeculativeMethod::kDspark, p.k, p.parallel, p.window));
  EXPECT_EQ(d.noncausal_index_width, p.ours);
  // Every non-causal row fits: min(prefix, W) + q <= W + theta.
  EXPECT_GE(d.noncausal_index_width, p.window + d.decode_threshold);
}

INSTANTIATE_TEST_SUITE_P(
    Widths, ConfigNonCausalWidth,
    ::testing::Values(WidthCase{8, 3, false, 64, 64},      // docs example 3 (DSpark draft)
                      WidthCase{128, 5, false, 192, 192},  // DSV4-Flash K5
                      WidthCase{128, 7, false, 192, 192},  // K7
                      WidthCase{128, 5, true, 192, 192},   // theta 11: 139 -> 192
                      WidthCase{123, 5, false, 128, 192},  // W + k = 128 exactly: raised
                      WidthCase{123, 5, true, 128, 192},   // theta 11
                      WidthCase{59, 5, false, 64, 128},    // W + k = 64, W + theta = 65
                      WidthCase{60, 4, false, 64, 128},    // W + k = 64, theta 5
                      WidthCase{100, 20, true, 128, 192},  // theta 41: 141 -> 192
                      WidthCase{1, 0, false, 64, 64}),     // k = 0: theta 1
    [](const ::testing::TestParamInfo<WidthCase>& info) {  // e.g. W123_k5_parallel
      return "W" + std::to_string(info.param.window) + "_k" + std::to_string(info.param.k) +
             (info.param.parallel ? "_parallel" : "");
    });

TEST(ConfigDerived, LayerTypes) {
  BuilderConfig c = valid_config();
  EXPECT_EQ(derive_config(c).layer_types.sorted_names(), Names{"swaonly"});  // empty = {1}
  c.compress_ratios = {1, 4, 128};
  EXPECT_EQ(derive_config(c).layer_types.sorted_names(), (Names{"c128a", "c4a", "swaonly"}));
  c.compress_ratios = {128, 4, 4};
  EXPECT_EQ(derive_config(c).layer_types.sorted_names(), (Names{"c128a", "c4a"}));
  c.compress_ratios = {2};
  const LayerTypeSet types = derive_config(c).layer_types;
  EXPECT_EQ(types.sorted_names(), Names{"c2a"});
  EXPECT_TRUE(types.contains(LayerType::kC2A));
  EXPECT_FALSE(types.contains(LayerType::kSwaOnly));
}

TEST(ConfigDerived, BuilderExposesConfigAndDerived) {
  auto builder = testing::cpu_builder(speculative(SpeculativeMethod::kDspark, 5, true, 123));
  EXPECT_EQ(builder->config().window_size, 123);
  EXPECT_EQ(builder->derived().decode_threshold, 11);
  EXPECT_EQ(builder->derived().noncausal_index_width, 192);
  EXPECT_EQ(builder->backend(), Backend::kCpu);
  EXPECT_STREQ(backend_name(Backend::kCpu), "cpu");
}

TEST(ConfigBackend, CudaBackendWithoutADeviceIsUnavailable) {
  if (cuda_backend_available()) GTEST_SKIP() << "a CUDA device is present";
  auto builder = MetadataBuilder::create(valid_config(), Backend::kCuda);
  ASSERT_FALSE(builder.ok());
  EXPECT_EQ(builder.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(builder.status().message().find("backend cuda"), std::string::npos)
      << builder.status().message();
}

}  // namespace
}  // namespace sparse_swa
