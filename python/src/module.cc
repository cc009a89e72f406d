// SPDX-License-Identifier: Apache-2.0
// The _sparse_swa extension: a thin binding of the sparse_swa library (see sparse_swa/__init__.py).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <new>
#include <stdexcept>
#include <string>
#include <typeinfo>

#include "attention_binding.h"
#include "builder_binding.h"
#include "config_binding.h"
#include "consumer_arrays_binding.h"
#include "consumers_binding.h"
#include "dispatch_binding.h"
#include "metadata_binding.h"
#include "sparse_swa/metadata_builder.h"
#include "sparse_swa/version.h"
#include "status_exceptions.h"

namespace nb = nanobind;

namespace {

// Test hook: raises the exception a library Status of `code` maps to.
void raise_status_for_tests(const std::string& code, const std::string& message) {
  using sparse_swa::StatusCode;
  StatusCode c = StatusCode::kInternal;
  if (code == "INVALID_ARGUMENT") {
    c = StatusCode::kInvalidArgument;
  } else if (code == "UNIMPLEMENTED") {
    c = StatusCode::kUnimplemented;
  } else if (code == "UNAVAILABLE") {
    c = StatusCode::kUnavailable;
  } else if (code != "INTERNAL") {
    sparse_swa::python::raise_value_error(
        "code: expected INVALID_ARGUMENT, UNIMPLEMENTED, "
        "UNAVAILABLE or INTERNAL, got " +
        code);
  }
  sparse_swa::python::raise_status(sparse_swa::Status(c, message));
}

// Test hook: throws a C++ exception of `kind` out of a bound function (the translator's case).
void throw_cpp_exception_for_tests(const std::string& kind) {
  if (kind == "bad_alloc") throw std::bad_alloc();
  if (kind == "bad_cast") throw std::bad_cast();
  if (kind == "length_error") throw std::length_error("basic_string: construction from null");
  throw 42;  // not a std::exception at all
}

}  // namespace

NB_MODULE(_sparse_swa, m) {
  m.doc() = "sparse_swa: DeepSeek-V4 sparse sliding-window attention metadata (C++/CUDA core).";
  sparse_swa::python::register_exception_translator();
  sparse_swa::python::bind_config(m);
  sparse_swa::python::bind_metadata(m);
  sparse_swa::python::bind_builder(m);
  sparse_swa::python::bind_consumers(m);
  sparse_swa::python::bind_consumer_arrays(m);
  sparse_swa::python::bind_attention(m);
  sparse_swa::python::bind_dispatch(m);
  m.def("cuda_available", &sparse_swa::cuda_backend_available,
        "True when this build has the CUDA backend and a CUDA device is usable.");
  m.attr("_has_cuda_backend") = bool(SPARSE_SWA_PYTHON_HAS_CUDA);
  m.attr("__version__") = SPARSE_SWA_VERSION_STRING;
  m.def("_raise_status", &raise_status_for_tests, nb::arg("code"), nb::arg("message"));
  m.def("_throw_cpp_exception", &throw_cpp_exception_for_tests, nb::arg("kind"));
}
