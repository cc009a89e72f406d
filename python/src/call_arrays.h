// SPDX-License-Identifier: Apache-2.0
// One call's arrays on one place (host, or one CUDA device): checked views of any DLPack array,
// outputs allocated in the caller's framework, the CUDA stream a call launches on, and the
// attention workspace cache. Every mismatch is a ValueError naming the Python argument.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string_view>

#include "array_input.h"
#include "sparse_swa/index_view.h"

namespace sparse_swa::python {

// The element types the bound operations take.
enum class Elem { kBool, kUint8, kUint16, kBf16, kInt32, kInt64, kFloat32 };
nb::dlpack::dtype dlpack_dtype(Elem e);
const char* elem_name(
    Elem e);  // "bool", "uint8", "uint16", "bfloat16", "int32", "int64", "float32"

// The place every array of a call must share: set by its first array (`anchor`, e.g. "q").
// It also keeps the call's imported arrays (their DLPack exports) alive until the call returns,
// so views of them stay valid whatever the producer does when an export is released.
struct CallPlace {
  Place place;
  const char* anchor = "";
  Framework framework = Framework::kNumpy;  // of the anchor: outputs are made in it
  nb::handle anchor_obj;
  MemorySpace space() const {
    return place.device == Device::kCuda ? MemorySpace::kDevice : MemorySpace::kHost;
  }
  bool on_device() const { return place.device == Device::kCuda; }

  // sparse_attention imports 10 arrays, the consumers over plain arrays up to 17.
  static constexpr size_t kMaxKept = 20;
  mutable std::array<InputArray, kMaxKept> kept;
  mutable std::array<nb::ndarray<>, 4> kept_writable;
  mutable size_t num_kept = 0, num_kept_writable = 0;
};

// Imports the anchor array and sets the call's place from it.
const InputArray& import_anchor(nb::handle obj, const char* field, CallPlace* call);
// The same for an anchor written in place (encode_kv's cache).
const nb::ndarray<>& import_writable_anchor(nb::handle obj, const char* field, CallPlace* call);
// Imports `obj` and checks it lives at the call's place ("expected device cuda:0 like q"). The
// array lives as long as `call`.
const InputArray& import_at(nb::handle obj, std::string_view field, const CallPlace& call);
// The same for an array written in place: read-only arrays are a ValueError.
const nb::ndarray<>& import_writable_at(nb::handle obj, std::string_view field,
                                        const CallPlace& call);

// `a` as [shape(0), product of the other dimensions] with C-contiguous rows, any row stride
// >= the row size, of one of `elems` (ValueError naming `field` otherwise). Returns the element
// type found.
struct FlatMatrix {
  void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;
  Elem elem = Elem::kUint8;
};
template <typename Array>
FlatMatrix flat_matrix(const Array& a, std::string_view field, std::initializer_list<Elem> elems,
                       size_t ndim);
template <typename T>
MatrixView<T> typed(const FlatMatrix& m, MemorySpace space) {
  return {static_cast<T*>(m.data), m.rows, m.cols, m.stride, space};
}
// A contiguous [n] vector of `elem`.
template <typename Array>
std::span<const std::byte> flat_vector(const Array& a, std::string_view field, Elem elem);
template <typename T, typename Array>
std::span<const T> vector_of(const Array& a, std::string_view field, Elem elem) {
  const auto bytes = flat_vector(a, field, elem);
  return {reinterpret_cast<const T*>(bytes.data()), bytes.size() / sizeof(T)};
}

// An index matrix: [rows, W] or the builder's [rows, 1, W] int32, unit column stride, any row
// stride >= W.
MatrixView<const int32_t> index_rows(const InputArray& a, std::string_view field,
                                     MemorySpace space);

// A new C-contiguous array of `shape` at the call's place, in the anchor's framework (numpy on
// the host unless the anchor is a torch tensor; torch or cupy on a device; other device
// frameworks need the output given, named by `out_field`), and its data pointer. Host arrays
// are filled with `fill_byte`; device arrays are left uninitialised (the CUDA kernels write
// every element of their outputs, so no fill has to be ordered before them).
struct NewArray {
  nb::object array;
  void* data = nullptr;
};
// A shape past int64 bytes is a ValueError naming `size_field`, the input it comes from.
NewArray new_array(const CallPlace& call, Elem elem, std::initializer_list<size_t> shape,
                   std::string_view out_field, std::string_view size_field, int fill_byte = 0);

// The cudaStream_t a call launches on (nullptr on the host): `stream` None -> torch's current
// stream on the call's device when the anchor is a torch tensor, else `fallback`; an int; an
// object with .cuda_stream (torch, cupy) or __cuda_stream__() (the CUDA stream protocol).
void* stream_from(nb::handle stream, const CallPlace& call, void* fallback);

// The attention workspace of (device, stream), allocated once (sparse_attention_max_workspace_
// bytes on the current device) and kept for the life of the module. {nullptr, 0} when none can
// be made now (no device, or the stream is capturing a graph: never allocated inside a capture).
std::pair<void*, int64_t> attention_workspace(int device_id, void* stream);

}  // namespace sparse_swa::python
