// The _sparse_swa extension: a thin binding of the sparse_swa library (see sparse_swa/__init__.py).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "attention_binding.h"
#include "builder_binding.h"
#include "config_binding.h"
#include "consumers_binding.h"
#include "metadata_binding.h"
#include "sparse_swa/metadata_builder.h"
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

}  // namespace

NB_MODULE(_sparse_swa, m) {
  m.doc() = "sparse_swa: DeepSeek-V4 sparse sliding-window attention metadata (C++/CUDA core).";
  sparse_swa::python::bind_config(m);
  sparse_swa::python::bind_metadata(m);
  sparse_swa::python::bind_builder(m);
  sparse_swa::python::bind_consumers(m);
  sparse_swa::python::bind_attention(m);
  m.def("cuda_available", &sparse_swa::cuda_backend_available,
        "True when this build has the CUDA backend and a CUDA device is usable.");
  m.attr("has_cuda_backend") = bool(SPARSE_SWA_PYTHON_HAS_CUDA);
  m.attr("__version__") = SPARSE_SWA_VERSION;
  m.def("_raise_status", &raise_status_for_tests, nb::arg("code"), nb::arg("message"));
}
