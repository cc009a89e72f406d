// SPDX-License-Identifier: Apache-2.0
// Library memory out: views wrapped as arrays of the caller's framework without a copy. The
// `owner` object (the Python MetadataBuilder) is kept alive by every array that aliases it.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <initializer_list>

#include "array_input.h"

namespace sparse_swa::python {

struct ArrayOut {
  Framework framework = Framework::kNumpy;
  Place place;
  nb::handle owner;
};

// A view of `data` with `shape` and element `strides`, writable (consumers may update rows in
// place, as the reference's tensors allow). A null `data` is allowed for zero-size arrays.
template <typename T>
nb::object export_array(const ArrayOut& out, const T* data, std::initializer_list<size_t> shape,
                        std::initializer_list<int64_t> strides);

// An owned copy of an exported array, made by its own framework (clone() or copy()).
nb::object copy_array(nb::handle array);

}  // namespace sparse_swa::python
