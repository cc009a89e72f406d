// SPDX-License-Identifier: Apache-2.0
#include "call_arrays.h"

#include <nanobind/stl/pair.h>

#include <cstring>
#include <map>
#include <memory>
#include <utility>

#include "python_values.h"
#include "sparse_swa/attention.h"
#include "sparse_swa/status.h"
#include "status_exceptions.h"

namespace sparse_swa::python {

nb::dlpack::dtype dlpack_dtype(Elem e) {
  switch (e) {
    case Elem::kBool:
      return nb::dtype<bool>();
    case Elem::kUint8:
      return nb::dtype<uint8_t>();
    case Elem::kUint16:
      return nb::dtype<uint16_t>();
    case Elem::kBf16:
      return {static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
    case Elem::kInt32:
      return nb::dtype<int32_t>();
    case Elem::kInt64:
      return nb::dtype<int64_t>();
    case Elem::kFloat32:
      break;
  }
  return nb::dtype<float>();
}

const char* elem_name(Elem e) {
  switch (e) {
    case Elem::kBool:
      return "bool";
    case Elem::kUint8:
      return "uint8";
    case Elem::kUint16:
      return "uint16";
    case Elem::kBf16:
      return "bfloat16";
    case Elem::kInt32:
      return "int32";
    case Elem::kInt64:
      return "int64";
    case Elem::kFloat32:
      break;
  }
  return "float32";
}

namespace {

size_t elem_size(Elem e) {
  switch (e) {
    case Elem::kBool:
    case Elem::kUint8:
      return 1;
    case Elem::kUint16:
    case Elem::kBf16:
      return 2;
    case Elem::kInt64:
      return 8;
    default:
      return 4;
  }
}

template <typename Array>
Elem expect_elem(const Array& a, std::string_view field, std::initializer_list<Elem> elems) {
  std::string wanted;
  for (Elem e : elems) {
    if (a.dtype() == dlpack_dtype(e)) return e;
    wanted += str_cat(wanted.empty() ? "" : " or ", elem_name(e));
  }
  raise_value_error(str_cat(field, ": expected dtype ", wanted, ", got ", dtype_name(a.dtype()),
                            " (arrays are taken without conversion)"));
}

}  // namespace

namespace {

// The message is built only on a mismatch (a string stream costs about a microsecond).
template <typename Array>
void expect_call_place(const Array& a, std::string_view field, const CallPlace& call) {
  const Place actual = place_of(a, field);
  if (!(actual == call.place)) {
    expect_same_place(actual, field, call.place, str_cat("like ", call.anchor));
  }
}

template <typename Array, size_t N>
const Array& keep(Array a, std::array<Array, N>& kept, size_t& count) {
  if (count == N) raise_value_error("sparse_swa: too many arrays in one call (internal limit)");
  kept[count] = std::move(a);
  return kept[count++];
}

}  // namespace

const InputArray& import_anchor(nb::handle obj, const char* field, CallPlace* call) {
  const InputArray& a = keep(import_array(obj, field), call->kept, call->num_kept);
  call->place = place_of(a, field);
  call->anchor = field;
  call->framework = framework_of(obj);
  call->anchor_obj = obj;
  return a;
}

const nb::ndarray<>& import_writable_anchor(nb::handle obj, const char* field, CallPlace* call) {
  const nb::ndarray<>& a =
      keep(import_writable_array(obj, field), call->kept_writable, call->num_kept_writable);
  call->place = place_of(a, field);
  call->anchor = field;
  call->framework = framework_of(obj);
  call->anchor_obj = obj;
  return a;
}

const InputArray& import_at(nb::handle obj, std::string_view field, const CallPlace& call) {
  const InputArray& a = keep(import_array(obj, field), call.kept, call.num_kept);
  expect_call_place(a, field, call);
  return a;
}

const nb::ndarray<>& import_writable_at(nb::handle obj, std::string_view field,
                                        const CallPlace& call) {
  const nb::ndarray<>& a =
      keep(import_writable_array(obj, field), call.kept_writable, call.num_kept_writable);
  expect_call_place(a, field, call);
  return a;
}

template <typename Array>
FlatMatrix flat_matrix(const Array& a, std::string_view field, std::initializer_list<Elem> elems,
                       size_t ndim) {
  FlatMatrix m;
  m.elem = expect_elem(a, field, elems);
  if (a.ndim() != ndim) {
    raise_value_error(str_cat(field, ": expected ", ndim, " dimensions, got ", a.ndim()));
  }
  expect_countable(a, field);        // before any product of the dimensions
  const bool empty = a.size() == 0;  // any strides; nothing is read
  int64_t cols = 1;
  for (size_t d = ndim; d-- > 1;) {
    if (!empty && a.shape(d) > 1 && a.stride(d) != cols) {
      raise_value_error(str_cat(field, ": expected C-contiguous rows, got stride ", a.stride(d),
                                " in dimension ", d));
    }
    cols *= static_cast<int64_t>(a.shape(d));
  }
  m.rows = static_cast<int64_t>(ndim == 0 ? 1 : a.shape(0));
  m.cols = cols;
  m.stride = m.rows > 1 && !empty ? a.stride(0) : cols;
  if (m.stride < cols) {
    raise_value_error(str_cat(field, ": expected a row stride >= ", cols, ", got ", m.stride));
  }
  if (!empty) expect_aligned(a.data(), elem_size(m.elem), field);
  m.data = empty ? nullptr : const_cast<void*>(static_cast<const void*>(a.data()));
  return m;
}

template FlatMatrix flat_matrix<InputArray>(const InputArray&, std::string_view,
                                            std::initializer_list<Elem>, size_t);
template FlatMatrix flat_matrix<nb::ndarray<>>(const nb::ndarray<>&, std::string_view,
                                               std::initializer_list<Elem>, size_t);

template <typename Array>
std::span<const std::byte> flat_vector(const Array& a, std::string_view field, Elem elem) {
  const FlatMatrix m = flat_matrix(a, field, {elem}, 1);
  if (m.rows > 1 && m.stride != 1) {
    raise_value_error(
        str_cat(field, ": expected a contiguous array (stride 1), got stride ", m.stride));
  }
  return {static_cast<const std::byte*>(m.data), static_cast<size_t>(m.rows) * elem_size(elem)};
}

template std::span<const std::byte> flat_vector<InputArray>(const InputArray&, std::string_view,
                                                            Elem);
template std::span<const std::byte> flat_vector<nb::ndarray<>>(const nb::ndarray<>&,
                                                               std::string_view, Elem);

MatrixView<const int32_t> index_rows(const InputArray& a, std::string_view field,
                                     MemorySpace space) {
  if (a.ndim() == 3 && a.shape(1) != 1) {
    raise_value_error(str_cat(field, ": expected [rows, width] or [rows, 1, width], got [",
                              a.shape(0), ", ", a.shape(1), ", ", a.shape(2), "]"));
  }
  if (a.ndim() != 2 && a.ndim() != 3) {
    raise_value_error(str_cat(field, ": expected [rows, width] or [rows, 1, width], got ", a.ndim(),
                              " dimensions"));
  }
  expect_elem(a, field, {Elem::kInt32});
  expect_countable(a, field);
  const int64_t rows = static_cast<int64_t>(a.shape(0));
  const size_t last = a.ndim() - 1;
  const int64_t cols = static_cast<int64_t>(a.shape(last));
  const int64_t stride = checked_row_stride(a, field, last);
  if (cols > INT32_MAX) {
    raise_value_error(
        str_cat(field, ": expected a width (columns) <= ", INT32_MAX, ", got ", cols));
  }
  const bool empty = rows * cols == 0;
  if (!empty) expect_aligned(a.data(), 4, field);
  // Zero-width rows still need the array's own pointer: the library wants one when rows > 0.
  const void* data = empty && rows == 0 ? nullptr : a.data();
  return {static_cast<const int32_t*>(data), rows, cols, stride, space};
}

namespace {

// Module-level objects looked up once and kept for the life of the process (never released:
// a static destructor would run after the interpreter is gone).
nb::handle cached(const char* module, const char* attr) {
  return nb::object(nb::module_::import_(module).attr(attr)).release();
}

nb::handle torch_dtype(Elem e) {
  // In the order of Elem.
  static const nb::handle dtypes[] = {cached("torch", "bool"),   cached("torch", "uint8"),
                                      cached("torch", "uint16"), cached("torch", "bfloat16"),
                                      cached("torch", "int32"),  cached("torch", "int64"),
                                      cached("torch", "float32")};
  return dtypes[static_cast<int>(e)];
}

nb::tuple shape_tuple(std::initializer_list<size_t> shape) {
  PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(shape.size()));
  if (t == nullptr) throw nb::python_error();
  Py_ssize_t i = 0;
  for (size_t s : shape) PyTuple_SET_ITEM(t, i++, PyLong_FromSize_t(s));
  return nb::steal<nb::tuple>(t);
}

}  // namespace

NewArray new_array(const CallPlace& call, Elem elem, std::initializer_list<size_t> shape,
                   std::string_view out_field, std::string_view size_field, int fill_byte) {
  size_t n = 1, bytes = 0;
  bool fits = true;
  for (size_t s : shape) fits = fits && !__builtin_mul_overflow(n, s, &n);
  fits = fits && !__builtin_mul_overflow(n, elem_size(elem), &bytes) && bytes <= size_t{INT64_MAX};
  if (!fits) {
    std::string dims;
    for (size_t s : shape) dims += str_cat(dims.empty() ? "" : ", ", s);
    raise_value_error(str_cat(size_field, ": the output's shape [", dims,
                              "] has more bytes than int64 can count"));
  }
  nb::object array;
  if (call.framework == Framework::kTorch) {
    static const nb::handle empty = cached("torch", "empty");
    // device: the CUDA ordinal (an int is cuda:N to torch) or "cpu", not the anchor's .device
    // (a new torch.device object per call).
    nb::object device =
        call.on_device() ? nb::object(nb::int_(call.place.device_id)) : nb::object(nb::str("cpu"));
    array =
        empty(shape_tuple(shape), nb::arg("dtype") = torch_dtype(elem), nb::arg("device") = device);
  } else if (call.framework == Framework::kCupy && call.on_device()) {
    nb::object cupy = nb::module_::import_("cupy");
    nb::object device = cupy.attr("cuda").attr("Device")(call.place.device_id);
    device.attr("__enter__")();
    array =
        cupy.attr("empty")(shape_tuple(shape), elem == Elem::kBf16 ? "uint16" : elem_name(elem));
    device.attr("__exit__")(nb::none(), nb::none(), nb::none());
  } else if (!call.on_device()) {
    static const nb::handle empty = cached("numpy", "empty");
    if (elem == Elem::kBf16) elem = Elem::kUint16;  // numpy has no bfloat16: its bits
    array = empty(shape_tuple(shape), elem_name(elem));
  } else {
    raise_value_error(str_cat(out_field,
                              ": required for device arrays that are not torch or cupy "
                              "(",
                              call.anchor, " is on ", place_name(call.place), ")"));
  }
  nb::ndarray<> a = import_writable_array(array, out_field);
  NewArray out{array, a.size() == 0 ? nullptr : a.data()};
  if (!call.on_device() && out.data != nullptr) std::memset(out.data, fill_byte, bytes);
  return out;
}

namespace {

// torch._C._cuda_getCurrentRawStream(device): the current stream without a Stream object.
nb::handle torch_current_raw_stream() {
  static const nb::handle fn =
      nb::getattr(nb::module_::import_("torch._C"), "_cuda_getCurrentRawStream", nb::none())
          .release();
  return fn;
}

void* stream_value(nb::handle value, std::string_view what) {
  return reinterpret_cast<void*>(
      static_cast<uintptr_t>(int_from_python(value, what, 0, INT64_MAX)));
}

}  // namespace

void* stream_from(nb::handle stream, const CallPlace& call, void* fallback) {
  if (stream.is_none()) {
    if (!call.on_device()) return nullptr;
    if (call.framework != Framework::kTorch) return fallback;
    if (!torch_current_raw_stream().is_none()) {
      return stream_value(torch_current_raw_stream()(call.place.device_id), "stream");
    }
    nb::object cuda = nb::module_::import_("torch").attr("cuda");
    return stream_value(cuda.attr("current_stream")(call.place.device_id).attr("cuda_stream"),
                        "stream");
  }
  if (PyLong_Check(stream.ptr()) || PyIndex_Check(stream.ptr())) {
    return stream_value(stream, "stream");
  }
  if (nb::hasattr(stream, "cuda_stream")) {
    return stream_value(stream.attr("cuda_stream"), "stream.cuda_stream");
  }
  if (nb::hasattr(stream, "__cuda_stream__")) {
    nb::object r = stream.attr("__cuda_stream__")();
    if (nb::isinstance<nb::tuple>(r) && nb::len(r) == 2) return stream_value(r[1], "stream");
    return stream_value(r, "stream.__cuda_stream__()");
  }
  raise_value_error(
      str_cat("stream: expected None, an int (a cudaStream_t) or a stream object "
              "(.cuda_stream or __cuda_stream__()), got ",
              type_name_of(stream)));
}

std::pair<void*, int64_t> attention_workspace(int device_id, void* stream) {
  // Never freed: a kernel may still be using a workspace when the module goes away.
  static auto* cache = new std::map<std::pair<int, void*>, std::unique_ptr<AttentionWorkspace>>();
  auto it = cache->find({device_id, stream});
  if (it == cache->end()) {
    auto created = AttentionWorkspace::create(stream);
    if (!created.ok()) return {nullptr, 0};  // fewer splits, never a failure; tried again later
    it = cache->emplace(std::pair{device_id, stream}, std::move(created).value()).first;
  }
  return {it->second->data(), it->second->bytes()};
}

}  // namespace sparse_swa::python
