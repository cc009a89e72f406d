#include "status_exceptions.h"

#include <nanobind/nanobind.h>

namespace nb = nanobind;

namespace sparse_swa::python {

void raise_status(const Status& status) {
  PyObject* type = PyExc_RuntimeError;
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
      type = PyExc_ValueError;
      break;
    case StatusCode::kUnimplemented:
      type = PyExc_NotImplementedError;
      break;
    case StatusCode::kOk:  // a caller bug: raising on OK still names it
    case StatusCode::kUnavailable:
    case StatusCode::kInternal:
      break;
  }
  const std::string message =
      status.ok() ? std::string("raise_status called with OK") : status.message();
  PyErr_SetString(type, message.c_str());
  throw nb::python_error();
}

void raise_value_error(const std::string& message) {
  PyErr_SetString(PyExc_ValueError, message.c_str());
  throw nb::python_error();
}

}  // namespace sparse_swa::python
