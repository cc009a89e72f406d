// SPDX-License-Identifier: Apache-2.0
// An independent checker of one step's SWA metadata, written from the behaviour spec
// (docs/semantics.md) without the library's formulas: the fuzz targets
// use it to decide whether a successful build() is right. Every function returns "" when all
// invariants hold, else a description of the first violation.
#pragma once

#include <string>
#include <vector>

#include "sparse_swa/batch.h"
#include "sparse_swa/config.h"
#include "sparse_swa/metadata.h"

namespace sparse_swa::fuzz {

// The split, token mapping, validity, every decode and prefill row (lens <= width, the window's
// slot ids as a prefix then -1, invalid tokens lens 0 and all -1, causal rows never below the
// request's replay_start), visibility, gather lens, replay_start and the FlashInfer decode lens.
// `after_draft_update`: the state after update_draft_decode_rows over the same batch (padding
// decode tokens then map to the last request; the rows keep the build's mode).
std::string check_metadata(const BuilderConfig& config, const BatchInput& batch,
                           const SwaMetadata& md, bool after_draft_update = false);

// A chunk plan: contiguous chunks covering the prefill requests, N and M the maxima of the
// chunk, every multi-request chunk inside the area budget and each chunk maximal (greedy).
std::string check_chunk_plan(const SwaMetadata& md, int64_t compress_ratio, int64_t chunk_size,
                             bool has_compressed, const std::vector<ChunkPlanEntry>& plan);

// A plain-data copy of the metadata's views, to compare two builds.
struct MetadataCopy {
  std::vector<int32_t> ints;  // every scalar, row, lens and per-token array in a fixed order
  bool operator==(const MetadataCopy&) const = default;
};
MetadataCopy copy_metadata(const SwaMetadata& md);

}  // namespace sparse_swa::fuzz
