// SPDX-License-Identifier: Apache-2.0
#include "array_input.h"

#include "python_values.h"
#include "sparse_swa/status.h"
#include "status_exceptions.h"

namespace sparse_swa::python {

namespace {

template <typename T>
void expect_dtype(const InputArray& a, std::string_view field) {
  const nb::dlpack::dtype want = nb::dtype<T>();
  if (a.dtype() != want) {
    raise_value_error(str_cat(field, ": expected dtype ", dtype_name(want), ", got ",
                              dtype_name(a.dtype()), " (arrays are taken without conversion)"));
  }
}

void expect_ndim(const InputArray& a, std::string_view field, size_t ndim) {
  if (a.ndim() != ndim) {
    raise_value_error(str_cat(field, ": expected ", ndim, " dimension", ndim == 1 ? "" : "s",
                              ", got ", a.ndim()));
  }
}

template <typename T>
const T* aligned_data(const InputArray& a, std::string_view field) {
  expect_aligned(a.data(), alignof(T), field);
  return static_cast<const T*>(a.data());
}

template <typename T>
std::span<const T> contiguous_vector(const InputArray& a, std::string_view field) {
  expect_dtype<T>(a, field);
  expect_ndim(a, field, 1);
  const size_t n = a.shape(0);
  if (n > 1 && a.stride(0) != 1) {
    raise_value_error(
        str_cat(field, ": expected a contiguous array (stride 1), got stride ", a.stride(0)));
  }
  return {n == 0 ? nullptr : aligned_data<T>(a, field), n};
}

}  // namespace

std::string dtype_name(nb::dlpack::dtype d) {
  std::string base;
  switch (static_cast<nb::dlpack::dtype_code>(d.code)) {
    case nb::dlpack::dtype_code::Int:
      base = "int";
      break;
    case nb::dlpack::dtype_code::UInt:
      base = "uint";
      break;
    case nb::dlpack::dtype_code::Float:
      base = "float";
      break;
    case nb::dlpack::dtype_code::Bfloat:
      base = "bfloat";
      break;
    case nb::dlpack::dtype_code::Complex:
      base = "complex";
      break;
    case nb::dlpack::dtype_code::Bool:
      return "bool";
    default:
      base = str_cat("dtype-code-", static_cast<int>(d.code), "-");
  }
  return str_cat(base, static_cast<int>(d.bits), d.lanes > 1 ? str_cat("x", d.lanes) : "");
}

void expect_aligned(const void* data, size_t alignment, std::string_view field) {
  if (reinterpret_cast<uintptr_t>(data) % alignment != 0) {
    raise_value_error(str_cat(field, ": expected ", alignment, "-byte aligned data"));
  }
}

void expect_countable(size_t ndim, const int64_t* shape, const int64_t* strides, size_t itemsize,
                      std::string_view field) {
  // "2, 3": for the messages only (a string stream per call costs microseconds).
  auto dims = [&] {
    std::string text;
    for (size_t d = 0; d < ndim; ++d) text += str_cat(d == 0 ? "" : ", ", shape[d]);
    return text;
  };
  int64_t count = 1, extent = 0;  // extent: the largest element offset, in elements
  bool fits = true;
  for (size_t d = 0; d < ndim && fits; ++d) {
    if (shape[d] < 0) {
      raise_value_error(str_cat(field, ": expected dimensions >= 0, got shape [", dims(), "]"));
    }
    fits = !__builtin_mul_overflow(count, shape[d], &count);
  }
  if (fits && count > 0) {
    for (size_t d = 0; d < ndim && fits; ++d) {
      // Strides absent (null) mean C-contiguous: the extent is then count - 1.
      const int64_t stride = strides == nullptr ? 0 : strides[d];
      int64_t step = 0;
      fits = stride != INT64_MIN &&
             !__builtin_mul_overflow(shape[d] - 1, stride < 0 ? -stride : stride, &step) &&
             !__builtin_add_overflow(extent, step, &extent);
    }
    if (strides == nullptr) extent = count - 1;
    int64_t bytes = 0;
    fits = fits && !__builtin_add_overflow(extent, int64_t{1}, &bytes) &&
           !__builtin_mul_overflow(bytes, static_cast<int64_t>(itemsize), &bytes);
  }
  if (!fits) {
    raise_value_error(str_cat(field, ": shape [", dims(), "] (itemsize ", itemsize,
                              ") has more elements or bytes than int64 can count"));
  }
}

namespace {

Framework framework_of_type(nb::handle type) {
  nb::object module = nb::getattr(type, "__module__", nb::none());
  if (!nb::isinstance<nb::str>(module)) return Framework::kDlpack;
  const std::string name = message_text(module);
  auto is = [&](std::string_view pkg) {
    return name.substr(0, pkg.size()) == pkg &&
           (name.size() == pkg.size() || name[pkg.size()] == '.');
  };
  if (is("numpy")) return Framework::kNumpy;
  if (is("torch")) return Framework::kTorch;
  if (is("cupy")) return Framework::kCupy;
  if (is("jax") || is("jaxlib")) return Framework::kJax;
  return Framework::kDlpack;
}

// torch._C._to_dlpack: one C call, where Tensor.__dlpack__ runs Python (several microseconds
// per array). None when torch has no such function.
nb::handle torch_to_dlpack() {
  static const nb::handle fn =
      nb::getattr(nb::module_::import_("torch._C"), "_to_dlpack", nb::none()).release();
  return fn;
}

}  // namespace

Framework framework_of(nb::handle obj) {
  // A few recently seen types (kept alive, so an address is never reused by another type).
  struct Seen {
    nb::object type;
    Framework framework;
  };
  static Seen* seen = new Seen[8];  // never freed: no destructor after the interpreter is gone
  static size_t next = 0;
  nb::handle type = obj.type();
  for (size_t i = 0; i < 8; ++i) {
    if (seen[i].type.is(type)) return seen[i].framework;
  }
  const Framework f = framework_of_type(type);
  seen[next] = {nb::borrow(type), f};
  next = (next + 1) % 8;
  return f;
}

std::string place_name(const Place& place) {
  return place.device == Device::kCpu ? std::string("cpu") : str_cat("cuda:", place.device_id);
}

namespace {

// Imports through torch._C._to_dlpack when `obj` is a torch tensor; false when that path does
// not apply or fails (the general path then reports it).
template <typename Array>
bool try_torch_import(nb::handle obj, Array& a) {
  if (framework_of(obj) != Framework::kTorch || torch_to_dlpack().is_none()) return false;
  PyObject* capsule = PyObject_CallOneArg(torch_to_dlpack().ptr(), obj.ptr());
  if (capsule == nullptr) {
    PyErr_Clear();  // e.g. a tensor that requires grad
    return false;
  }
  const bool ok = nb::try_cast(nb::handle(capsule), a, /*convert=*/false);
  Py_DECREF(capsule);
  return ok;
}

template <typename Array>
Array import_any(nb::handle obj, std::string_view field, const char* writable) {
  Array a;
  if (!try_torch_import(obj, a) && !nb::try_cast(obj, a, /*convert=*/false)) {
    if (nb::hasattr(obj, "__dlpack__")) {
      raise_value_error(str_cat(field, ": its ", writable, "DLPack export failed (",
                                type_name_of(obj),
                                "; a torch tensor that requires grad needs .detach())"));
    }
    raise_value_error(str_cat(field, ": expected ", *writable ? "a writable " : "an ",
                              "array supporting DLPack or the buffer protocol "
                              "(numpy, torch, cupy, jax), got ",
                              type_name_of(obj)));
  }
  expect_countable(a, field);
  return a;
}

}  // namespace

InputArray import_array(nb::handle obj, std::string_view field) {
  return import_any<InputArray>(obj, field, "");
}

nb::ndarray<> import_writable_array(nb::handle obj, std::string_view field) {
  return import_any<nb::ndarray<>>(obj, field, "writable ");
}

Place place_of_device(int32_t device_type, int32_t device_id, std::string_view field) {
  if (device_type == nb::device::cpu::value) return {Device::kCpu, 0};
  if (device_type == nb::device::cuda::value) return {Device::kCuda, device_id};
  raise_value_error(
      str_cat(field, ": expected a cpu or cuda array, got DLPack device type ", device_type));
}

void expect_same_place(const Place& actual, std::string_view field, const Place& expected,
                       std::string_view why) {
  if (!(actual == expected)) {
    raise_value_error(str_cat(field, ": expected device ", place_name(expected), " ", why, ", got ",
                              place_name(actual)));
  }
}

int64_t checked_row_stride(const InputArray& a, std::string_view field, size_t last) {
  const int64_t rows = static_cast<int64_t>(a.shape(0));
  const int64_t cols = static_cast<int64_t>(a.shape(last));
  if (rows > 0 && cols > 1 && a.stride(last) != 1) {
    raise_value_error(
        str_cat(field, ": expected rows with unit column stride, got stride ", a.stride(last)));
  }
  if (rows <= 1) return cols;  // a single row's stride is never used; DLPack may report anything
  const int64_t stride = a.stride(0);
  if (stride < cols) {
    raise_value_error(
        str_cat(field, ": expected a row stride >= ", cols, " columns, got ", stride));
  }
  return stride;
}

std::span<const int32_t> int32_vector(const InputArray& a, std::string_view field) {
  return contiguous_vector<int32_t>(a, field);
}

std::span<const int64_t> int64_vector(const InputArray& a, std::string_view field) {
  return contiguous_vector<int64_t>(a, field);
}

MatrixView<const int32_t> int32_matrix(const InputArray& a, std::string_view field,
                                       MemorySpace space) {
  expect_dtype<int32_t>(a, field);
  expect_ndim(a, field, 2);
  const int64_t rows = static_cast<int64_t>(a.shape(0));
  const int64_t cols = static_cast<int64_t>(a.shape(1));
  const int64_t stride = checked_row_stride(a, field, 1);
  const int32_t* data = rows * cols == 0 ? nullptr : aligned_data<int32_t>(a, field);
  if (rows > 0 && data == nullptr) data = static_cast<const int32_t*>(a.data());
  return {data, rows, cols, stride, space};
}

}  // namespace sparse_swa::python
