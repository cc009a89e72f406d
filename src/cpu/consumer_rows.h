// SPDX-License-Identifier: Apache-2.0
// Host helpers of the CPU consumers: a token's window checked against the batch, and the
// compressed-slot mapping (the CUDA kernels in src/cuda/consumers.cu apply the same rules).
#pragma once

#include <cstdint>

#include "common/swa_formulas.h"
#include "sparse_swa/consumers.h"

namespace sparse_swa::detail {

// Request, position and causal SWA window of a token (host arrays; clamped to the metadata's
// replay_start, docs/semantics.md#bounded-replay), or an error naming the token when the metadata
// is inconsistent with the batch (request out of range, negative prefix, replay_start outside
// [0, prefix], and with check_blocks a window outside the block table or with a negative block
// id; consumers that read no page pass false).
struct TokenWindow {
  int32_t request = 0;
  int32_t pos = 0;
  formulas::Window window{0, 0};
};
StatusOr<TokenWindow> host_token_window(const ConsumerStep& step, int32_t t, bool with_image,
                                        bool check_blocks = true);

// Global slot of local compressed index l of request r, or -1 when l is negative, past the
// compressed block table or reads a negative block id. Same rule on the GPU.
int32_t host_global_slot(const CompressedCache& cache, int32_t r, int32_t l);

}  // namespace sparse_swa::detail
