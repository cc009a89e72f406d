// SPDX-License-Identifier: Apache-2.0
#include "status_exceptions.h"

#include <nanobind/nanobind.h>

#include <exception>
#include <new>

namespace nb = nanobind;

namespace sparse_swa::python {

namespace {

// PyErr_SetString would replace a message that is not valid UTF-8 by a UnicodeDecodeError.
void set_error(PyObject* type, const std::string& message) {
  PyObject* text = PyUnicode_DecodeUTF8(message.data(), static_cast<Py_ssize_t>(message.size()),
                                        "backslashreplace");
  if (text == nullptr) {
    PyErr_Clear();
    PyErr_SetString(type, "sparse_swa: an error whose message cannot be shown");
    return;
  }
  PyErr_SetObject(type, text);
  Py_DECREF(text);
}

}  // namespace

Status renamed_fields(const Status& status,
                      std::initializer_list<std::pair<std::string_view, std::string_view>> names) {
  if (status.ok()) return status;
  std::string text(status.message());
  for (const auto& [from, to] : names) {
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at)) {
      text.replace(at, from.size(), to);
      at += to.size();
    }
  }
  return Status(status.code(), text);
}

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
  set_error(type, status.ok() ? std::string("raise_status called with OK") : status.message());
  throw nb::python_error();
}

void raise_value_error(const std::string& message) {
  set_error(PyExc_ValueError, message);
  throw nb::python_error();
}

void register_exception_translator() {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const std::bad_alloc&) {
      PyErr_SetString(PyExc_MemoryError, "sparse_swa: out of memory");
    } catch (...) {
      PyErr_SetString(PyExc_RuntimeError,
                      "sparse_swa: internal error in the Python binding (an unexpected C++ "
                      "exception); please report the call that raised it");
    }
  });
}

}  // namespace sparse_swa::python
