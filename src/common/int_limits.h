// SPDX-License-Identifier: Apache-2.0
// Integer limits shared by both backends (host and device code).
#pragma once

#include <cstdint>
#include <limits>

namespace sparse_swa {

// The largest int32 value, as int64 so that products and sums can be compared against it.
inline constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

}  // namespace sparse_swa
