// SPDX-License-Identifier: Apache-2.0
// Builder configs shared by the tests, the benchmarks and the CLI: a small config with its
// capacities set, the speculative and vision variants of one, and the reference bench's config.
#pragma once

#include <cstdint>

#include "sparse_swa/config.h"

namespace sparse_swa::testing {

// Window W, page size B and the capacity fields; speculative method none, no images, the
// compress ratios left empty ({1}).
BuilderConfig small_config(int32_t window, int32_t block, int32_t max_tokens = 64,
                           int32_t max_seqs = 8, int64_t max_model_len = int64_t{1} << 20);
// `config` with k speculative tokens of MTP or DSpark drafting (parallel drafting optional).
BuilderConfig with_mtp(BuilderConfig config, int32_t k, bool parallel = false);
BuilderConfig with_dspark(BuilderConfig config, int32_t k, bool parallel = false);
// `config` with image spans of up to `max_image_tokens` tokens (a vision checkpoint).
BuilderConfig with_images(BuilderConfig config, int32_t max_image_tokens);

// The shapes of the reference script's bench (vllm_swa_builder.py bench): W = 128, B = 256,
// 16384 tokens, 1024 requests, max_model_len 65536, compress ratios {1, 4, 128}; DSpark k = 5.
inline constexpr int32_t kBenchDsparkTokens = 5;
BuilderConfig bench_config(bool dspark);

}  // namespace sparse_swa::testing
