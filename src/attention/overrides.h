// SPDX-License-Identifier: Apache-2.0
// What tests may force of the CUDA attention's plan and launch, and the entry point that takes
// it. Not public: every public call runs with the defaults; the tests reach each path the
// defaults leave to a few shapes (tests/attention/*_cuda_test.cc).
#pragma once

#include <cstdint>

#include "sparse_swa/attention.h"
#include "sparse_swa/status.h"

namespace sparse_swa::detail {

// Each field's default is what sparse_attention() does.
struct AttentionOverrides {
  bool few_heads = true;      // false: 1..16 heads on bf16 rows stay on the 64-row bf16 kernel
  bool decoded_keys = true;   // false: fp8_ds_mla caches are always read directly
  bool cluster_merge = true;  // false: every split goes through the merge kernel
  // > 0: at most this many CTAs for the kernels whose CTAs walk items (the bf16 pair and
  // few-heads kernels), so that each walks several; 0: one per SM.
  int32_t max_walking_ctas = 0;
};

// sparse_attention() with `overrides` (the same checks; the CPU reference ignores them).
Status sparse_attention_with(const SparseAttentionParams& params,
                             const AttentionOverrides& overrides, void* cuda_stream = nullptr);

}  // namespace sparse_swa::detail
