// SPDX-License-Identifier: Apache-2.0
// The human-readable form of one built step, shared by `build --format table` and `demo`.
#pragma once

#include <ostream>
#include <vector>

#include "json/batch_json.h"
#include "sparse_swa/config.h"
#include "sparse_swa/metadata.h"
#include "sparse_swa/status.h"

namespace sparse_swa::cli {

// Config-derived widths, the decode/prefill split, one line per request and per token (its
// position, slot, lens / width and the row's valid entries, runs written a..b) and the chunk
// plans. `md` must be host metadata built from `file`'s batch with `derived`.
Status print_metadata_table(std::ostream& os, const BatchFile& file, const DerivedConfig& derived,
                            const SwaMetadata& md, const std::vector<ChunkPlanResult>& plans);

}  // namespace sparse_swa::cli
