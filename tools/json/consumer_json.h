// SPDX-License-Identifier: Apache-2.0
// The JSON form of one step's consumer-side matrices (`sparse-swa build --consumer NAME`): the
// mixed matrix, the ragged (CSR) forms, the FlashMLA combined prefill rows and the dispatch
// check, all computed by the consumer API (sparse_swa/consumers.h) on host metadata.
//
// A batch file carries no indexer top-k, so every matrix is the SWA-only layer's (compress ratio
// 1, no compressed entries); the object's "note" says so.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

#include "sparse_swa/batch.h"
#include "sparse_swa/config.h"
#include "sparse_swa/dispatch_policy.h"
#include "sparse_swa/metadata.h"
#include "sparse_swa/status.h"

namespace sparse_swa {

// The combined prefill rows are built per chunk of prefill_chunk_plan(md, ratio 1, chunk 4).
inline constexpr int32_t kConsumerChunkCompressRatio = 1;
inline constexpr int32_t kConsumerChunkSize = 4;

// {"name", "policy", "note", "mixed", "ragged", "prefill_ragged", "combined_prefill",
//  "dispatch"} for the built-in consumer `consumer` (builtin_policy_names()).
//   md:     host metadata built from `batch` with `config` (device metadata is rejected: copy it
//           to the host first, as the CLI's StepBuilder does for the CUDA backend)
//   shape:  deployment facts for validate_config (heads, attn block size, indexer top-k)
// "dispatch" reports validate_config's verdict and never fails the call; every other error
// (unknown consumer, metadata inconsistent with the batch) is returned.
StatusOr<nlohmann::ordered_json> consumer_to_json(std::string_view consumer,
                                                  const BuilderConfig& config,
                                                  const SwaMetadata& md, const BatchInput& batch,
                                                  const DeploymentShape& shape);

}  // namespace sparse_swa
