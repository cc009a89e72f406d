// SPDX-License-Identifier: Apache-2.0
#include "testing/presets.h"

namespace sparse_swa::testing {

BuilderConfig small_config(int32_t window, int32_t block, int32_t max_tokens, int32_t max_seqs,
                           int64_t max_model_len) {
  BuilderConfig c;
  c.window_size = window;
  c.block_size = block;
  c.max_num_batched_tokens = max_tokens;
  c.max_num_seqs = max_seqs;
  c.max_model_len = max_model_len;
  return c;
}

BuilderConfig with_mtp(BuilderConfig config, int32_t k, bool parallel) {
  config.speculative_method = SpeculativeMethod::kMtp;
  config.num_speculative_tokens = k;
  config.parallel_drafting = parallel;
  return config;
}

BuilderConfig with_dspark(BuilderConfig config, int32_t k, bool parallel) {
  config.speculative_method = SpeculativeMethod::kDspark;
  config.num_speculative_tokens = k;
  config.parallel_drafting = parallel;
  return config;
}

BuilderConfig with_images(BuilderConfig config, int32_t max_image_tokens) {
  config.max_image_tokens = max_image_tokens;
  return config;
}

BuilderConfig bench_config(bool dspark) {
  BuilderConfig c = small_config(/*window=*/128, /*block=*/256, /*max_tokens=*/16384,
                                 /*max_seqs=*/1024, /*max_model_len=*/65536);
  c.compress_ratios = {1, 4, 128};
  return dspark ? with_dspark(c, kBenchDsparkTokens) : c;
}

}  // namespace sparse_swa::testing
