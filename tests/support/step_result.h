// SPDX-License-Identifier: Apache-2.0
// What one step of the concurrency tests gives (the metadata, the SWA-only mixed matrix, the
// ragged decode rows, an attention over the decode rows), and how two runs of it are compared.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "support/metadata_snapshot.h"

namespace sparse_swa::testing {

struct StepResult {
  MetadataSnapshot md;
  std::vector<int32_t> mixed, mixed_lens, indptr, values;
  std::vector<uint16_t> out;
  std::vector<float> lse;
  std::string error;  // empty when every call succeeded
};

// "" when a and b are equal, else what differs first.
inline std::string first_step_difference(const StepResult& a, const StepResult& b) {
  if (a.error != b.error) return "error: " + a.error + " vs " + b.error;
  if (std::string d = first_difference(a.md, b.md); !d.empty()) return d;
  if (a.mixed != b.mixed || a.mixed_lens != b.mixed_lens) return "mixed";
  if (a.indptr != b.indptr || a.values != b.values) return "ragged";
  if (a.out != b.out || a.lse != b.lse) return "attention";
  return "";
}

}  // namespace sparse_swa::testing
