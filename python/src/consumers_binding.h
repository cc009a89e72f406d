// SPDX-License-Identifier: Apache-2.0
// The index consumers for Python (SWA-only forms on host metadata): md.mixed_matrix(),
// md.combined_prefill(...) and sparse_swa.to_ragged(indices, lens). Outputs are new numpy arrays
// the caller owns (the library writes into them through views).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "sparse_swa/status.h"
#include "status_exceptions.h"

namespace sparse_swa::python {

namespace nb = nanobind;

// A new C-contiguous numpy array of `shape`, filled with `fill`, and its data pointer. The
// memory belongs to the array (freed with it). Shared by the attention binding. A shape whose
// bytes pass int64 is a ValueError naming `field` (the input it comes from), before allocating.
template <typename T>
std::pair<nb::object, T*> new_host_array(std::string_view field,
                                         std::initializer_list<size_t> shape, T fill) {
  size_t n = 1, bytes = 0;
  bool fits = true;
  for (size_t s : shape) fits = fits && !__builtin_mul_overflow(n, s, &n);
  fits = fits && !__builtin_mul_overflow(n, sizeof(T), &bytes) && bytes <= size_t{INT64_MAX};
  if (!fits) {
    std::string dims;
    for (size_t s : shape) dims += str_cat(dims.empty() ? "" : ", ", s);
    raise_value_error(
        str_cat(field, ": the output's shape [", dims, "] has more bytes than int64 can count"));
  }
  T* data = new T[n == 0 ? 1 : n];
  for (size_t i = 0; i < n; ++i) data[i] = fill;
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<T*>(p); });
  nb::ndarray<nb::numpy, T> array(data, shape, owner);
  return {array.cast(), data};
}

void bind_consumers(nb::module_& m);

}  // namespace sparse_swa::python
