// SPDX-License-Identifier: Apache-2.0
// A poisoned host output matrix for the consumer tests: every entry a consumer must write starts
// as kPoison, so an entry it skips shows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "sparse_swa/index_view.h"

namespace sparse_swa::testing {

inline constexpr int32_t kPoison = 0x5a5a5a5a;

// [rows, width] int32 with a capacity stride (0 = width), lens [rows]; all kPoison at first.
struct HostOutput {
  HostOutput(int64_t rows, int32_t width, int64_t stride = 0)
      : rows(rows),
        width(width),
        stride(stride ? stride : width),
        data(rows * this->stride, kPoison),
        lens(rows, kPoison) {}
  IndexView view() {
    return {data.data(), lens.data(), rows, width, stride, 0, MemorySpace::kHost};
  }
  // The first n entries of row i (n < 0: the whole width).
  std::vector<int32_t> row(int64_t i, int32_t n = -1) const {
    const int32_t* r = data.data() + i * stride;
    return std::vector<int32_t>(r, r + (n < 0 ? width : n));
  }
  bool untouched() const {
    const auto poison = [](int32_t v) { return v == kPoison; };
    return std::all_of(data.begin(), data.end(), poison) &&
           std::all_of(lens.begin(), lens.end(), poison);
  }
  int64_t rows;
  int32_t width;
  int64_t stride;
  std::vector<int32_t> data, lens;
};

// `values` followed by -1 up to `width` entries.
inline std::vector<int32_t> padded(std::vector<int32_t> values, int32_t width) {
  values.resize(width, -1);
  return values;
}

}  // namespace sparse_swa::testing
