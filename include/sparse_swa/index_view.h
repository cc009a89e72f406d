// SPDX-License-Identifier: Apache-2.0
// Views over index matrices and plain matrices. A view carries its own shape, so a consumer
// never pairs a pointer with a width passed beside it: reshaping DSpark rows with the window
// instead of their width is the failure this rules out (docs/semantics.md#window-and-width).
#pragma once

#include <cstdint>
#include <string_view>
#include <type_traits>

#include "sparse_swa/status.h"

namespace sparse_swa {

enum class MemorySpace { kHost, kDevice };

// Row-major matrix: element (i, j) at data[i * stride + j], j < cols, stride >= cols.
template <typename T>
struct MatrixView {
  T* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;  // elements between row starts
  MemorySpace space = MemorySpace::kHost;

  T* row(int64_t i) const { return data + i * stride; }
  template <typename U,
            typename = std::enable_if_t<std::is_same_v<U, const T> && !std::is_const_v<T>>>
  operator MatrixView<U>() const {  // NOLINT: adding const is always safe
    return {data, rows, cols, stride, space};
  }
};

// Index rows and their valid counts.
//   data: [rows, row_stride] int32; columns [0, width) are the row, -1 = empty
//   lens: [rows] int32; row i's valid entries are data[i][0, lens[i]), 0 <= lens[i] <= width
// `window` is the logical sliding window the rows were built with. It is never a width: a
// DSpark non-causal row is wider than the window, a vision prefill row is W + max_image_tokens.
template <typename T>
struct BasicIndexView {
  static_assert(std::is_same_v<std::remove_const_t<T>, int32_t>);
  T* data = nullptr;
  T* lens = nullptr;
  int64_t rows = 0;
  int32_t width = 0;
  int64_t row_stride = 0;
  int32_t window = 0;
  MemorySpace space = MemorySpace::kHost;

  T* row(int64_t i) const { return data + i * row_stride; }
  template <typename U,
            typename = std::enable_if_t<std::is_same_v<U, const T> && !std::is_const_v<T>>>
  operator BasicIndexView<U>() const {  // NOLINT: adding const is always safe
    return {data, lens, rows, width, row_stride, window, space};
  }
};
using IndexView = BasicIndexView<int32_t>;
using ConstIndexView = BasicIndexView<const int32_t>;

// Checks the shape of a view (non-null pointers when rows > 0, width >= 0, stride >= width) and,
// for host views, that every 0 <= lens[i] <= width. `name` prefixes the messages.
Status check_index_view(const ConstIndexView& view, std::string_view name);

}  // namespace sparse_swa
