// SPDX-License-Identifier: Apache-2.0
#include "array_output.h"

#include "sparse_swa/status.h"

namespace sparse_swa::python {

namespace {

// Zero-size arrays of a null view still need a non-null pointer for some consumers' checks.
alignas(8) int64_t empty_storage = 0;

template <typename Fw, typename T>
nb::object wrap(const ArrayOut& out, T* data, std::initializer_list<size_t> shape,
                std::initializer_list<int64_t> strides) {
  const int device_type =
      out.place.device == Device::kCuda ? nb::device::cuda::value : nb::device::cpu::value;
  nb::ndarray<Fw, T> array(data, shape, out.owner, strides, nb::dtype<T>(), device_type,
                           out.place.device_id);
  return array.cast(nb::rv_policy::reference);
}

// torch._C._from_dlpack: a capsule to a tensor in one C call, where nanobind's torch export goes
// through the Python-level torch.utils.dlpack.from_dlpack (microseconds per array). None when
// torch has no such function; torch must already be imported (the caller passed a tensor).
nb::handle torch_from_dlpack() {
  static const nb::handle fn =
      nb::getattr(nb::module_::import_("torch._C"), "_from_dlpack", nb::none()).release();
  return fn;
}

template <typename T>
nb::object wrap_torch(const ArrayOut& out, T* data, std::initializer_list<size_t> shape,
                      std::initializer_list<int64_t> strides) {
  if (torch_from_dlpack().is_none()) return wrap<nb::pytorch>(out, data, shape, strides);
  // nanobind's own ndarray object, whose __dlpack__ is C: its capsule goes to torch directly.
  nb::object array = wrap<nb::array_api>(out, data, shape, strides);
  nb::object capsule = array.attr("__dlpack__")();
  return torch_from_dlpack()(capsule);
}

}  // namespace

template <typename T>
nb::object export_array(const ArrayOut& out, const T* data, std::initializer_list<size_t> shape,
                        std::initializer_list<int64_t> strides) {
  T* ptr = const_cast<T*>(data);
  if (ptr == nullptr) ptr = reinterpret_cast<T*>(&empty_storage);  // only ever zero-size
  switch (out.framework) {
    case Framework::kNumpy:
      return wrap<nb::numpy>(out, ptr, shape, strides);
    case Framework::kTorch:
      return wrap_torch(out, ptr, shape, strides);
    case Framework::kCupy:
      return wrap<nb::cupy>(out, ptr, shape, strides);
    case Framework::kJax:
      return wrap<nb::jax>(out, ptr, shape, strides);
    case Framework::kDlpack:
      break;
  }
  return wrap<nb::array_api>(out, ptr, shape, strides);
}

template nb::object export_array<int32_t>(const ArrayOut&, const int32_t*,
                                          std::initializer_list<size_t>,
                                          std::initializer_list<int64_t>);
template nb::object export_array<bool>(const ArrayOut&, const bool*, std::initializer_list<size_t>,
                                       std::initializer_list<int64_t>);

nb::object copy_array(nb::handle array) {
  if (array.is_none()) return nb::none();
  if (nb::hasattr(array, "clone")) return array.attr("clone")();  // torch
  if (nb::hasattr(array, "copy")) return array.attr("copy")();    // numpy, cupy, jax
  nb::object np = nb::module_::import_("numpy");
  return np.attr("array")(array, nb::arg("copy") = true);
}

}  // namespace sparse_swa::python
