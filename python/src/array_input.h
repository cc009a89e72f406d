// SPDX-License-Identifier: Apache-2.0
// Caller arrays in: any DLPack producer (numpy, torch, cupy, jax) is taken without a copy and
// checked for dtype, rank, unit inner stride and device. Mismatches raise ValueError naming the
// argument; shapes and values are the library's to check.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "sparse_swa/index_view.h"

namespace sparse_swa::python {

namespace nb = nanobind;
using InputArray = nb::ndarray<nb::ro>;

// The array library an object comes from; outputs are returned in the same one.
enum class Framework { kNumpy, kTorch, kCupy, kJax, kDlpack };
Framework framework_of(nb::handle obj);

enum class Device { kCpu, kCuda };
struct Place {
  Device device = Device::kCpu;
  int device_id = 0;
  bool operator==(const Place&) const = default;
};
std::string place_name(const Place& place);   // "cpu", "cuda:1"
std::string dtype_name(nb::dlpack::dtype d);  // "int32", "bfloat16", "uint8x4"

// ValueError unless every dimension is >= 0 and the element count (the product of the
// dimensions) and the byte extent (itemsize * sum of (dim - 1) * |stride|) fit int64: a DLPack
// export past that describes no real memory, and sizes computed from it would overflow.
void expect_countable(size_t ndim, const int64_t* shape, const int64_t* strides, size_t itemsize,
                      std::string_view field);
template <typename Array>
void expect_countable(const Array& a, std::string_view field) {
  expect_countable(a.ndim(), a.shape_ptr(), a.stride_ptr(), a.itemsize(), field);
}

// Imports `obj` through DLPack (or the buffer protocol). ValueError when it is not an array, or
// when its shape is not countable (expect_countable).
InputArray import_array(nb::handle obj, std::string_view field);
// The row stride of an array whose columns are dimension `last` (rows: dimension 0), checked:
// unit column stride, row stride >= columns; a single row reports its columns.
int64_t checked_row_stride(const InputArray& a, std::string_view field, size_t last);
// The same for an array written in place: a read-only one (e.g. a non-writeable numpy array) is
// a ValueError. Torch tensors go through torch._C._to_dlpack (no Python-level __dlpack__).
nb::ndarray<> import_writable_array(nb::handle obj, std::string_view field);
// The array's device: cpu or cuda; any other DLPack device raises ValueError.
Place place_of_device(int32_t device_type, int32_t device_id, std::string_view field);
template <typename Array>
Place place_of(const Array& a, std::string_view field) {
  return place_of_device(a.device_type(), a.device_id(), field);
}
// ValueError unless `actual` is `expected`; `why` ends the message ("like query_start_loc").
void expect_same_place(const Place& actual, std::string_view field, const Place& expected,
                       std::string_view why);
template <typename Array>
void expect_place(const Array& a, std::string_view field, const Place& expected,
                  std::string_view why) {
  expect_same_place(place_of(a, field), field, expected, why);
}

// ValueError unless `data` is `alignment`-byte aligned (a view offset into a buffer may not be).
void expect_aligned(const void* data, size_t alignment, std::string_view field);

// [n] contiguous vectors and [rows, cols] matrices with unit column stride (aligned data).
std::span<const int32_t> int32_vector(const InputArray& a, std::string_view field);
std::span<const int64_t> int64_vector(const InputArray& a, std::string_view field);
MatrixView<const int32_t> int32_matrix(const InputArray& a, std::string_view field,
                                       MemorySpace space);

}  // namespace sparse_swa::python
