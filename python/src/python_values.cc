// SPDX-License-Identifier: Apache-2.0
#include "python_values.h"

#include <cfloat>
#include <cmath>
#include <cstring>

#include "sparse_swa/status.h"
#include "status_exceptions.h"

namespace sparse_swa::python {

namespace {

bool is_numpy_scalar(nb::handle value) {
  const char* name = Py_TYPE(value.ptr())->tp_name;
  return std::strncmp(name, "numpy.", 6) == 0 && std::strcmp(name, "numpy.ndarray") != 0;
}

bool is_bool_like(nb::handle value) {
  const char* name = Py_TYPE(value.ptr())->tp_name;
  return PyBool_Check(value.ptr()) || std::strcmp(name, "numpy.bool") == 0 ||
         std::strcmp(name, "numpy.bool_") == 0;
}

}  // namespace

std::string message_text(nb::handle str) {
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(str.ptr(), &size);
  if (data != nullptr) return std::string(data, static_cast<size_t>(size));
  PyErr_Clear();
  nb::object bytes = nb::steal(PyUnicode_AsEncodedString(str.ptr(), "utf-8", "backslashreplace"));
  if (!bytes.is_valid()) {
    PyErr_Clear();
    return "<text that cannot be shown>";
  }
  return std::string(PyBytes_AS_STRING(bytes.ptr()),
                     static_cast<size_t>(PyBytes_GET_SIZE(bytes.ptr())));
}

std::string value_text(nb::handle value) {
  PyObject* text =
      PyUnicode_Check(value.ptr()) ? PyObject_Repr(value.ptr()) : PyObject_Str(value.ptr());
  if (text == nullptr) {
    PyErr_Clear();  // e.g. an int past Python's digit limit for str()
    return str_cat("<", type_name_of(value), " object>");
  }
  return printable_excerpt(message_text(nb::steal(text)));
}

std::string type_name_of(nb::handle value) { return message_text(nb::type_name(value.type())); }

std::string describe(nb::handle value) {
  if (value.is_none()) return "None";
  const bool has_text = PyLong_Check(value.ptr()) || PyFloat_Check(value.ptr()) ||
                        PyUnicode_Check(value.ptr()) || is_numpy_scalar(value);
  return has_text ? str_cat(type_name_of(value), " ", value_text(value)) : type_name_of(value);
}

int64_t int_from_python(nb::handle value, std::string_view field, int64_t min, int64_t max) {
  if (is_bool_like(value) || !PyIndex_Check(value.ptr())) {
    raise_value_error(str_cat(field, ": expected an int, got ", describe(value)));
  }
  nb::object index = nb::steal(PyNumber_Index(value.ptr()));
  if (!index.is_valid()) {
    PyErr_Clear();
    raise_value_error(str_cat(field, ": expected an int, got ", describe(value)));
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    overflow = 1;
  }
  if (overflow != 0 || v < min || v > max) {
    raise_value_error(
        str_cat(field, ": expected an int in [", min, ", ", max, "], got ", value_text(index)));
  }
  return v;
}

int32_t int32_from_python(nb::handle value, std::string_view field) {
  return static_cast<int32_t>(int_from_python(value, field, INT32_MIN, INT32_MAX));
}

bool bool_from_python(nb::handle value, std::string_view field) {
  if (!is_bool_like(value)) {
    raise_value_error(str_cat(field, ": expected a bool, got ", describe(value)));
  }
  const int truth = PyObject_IsTrue(value.ptr());
  if (truth < 0) {
    PyErr_Clear();
    raise_value_error(str_cat(field, ": expected a bool, got ", describe(value)));
  }
  return truth == 1;
}

float float_from_python(nb::handle value, std::string_view field) {
  const bool numeric = PyFloat_Check(value.ptr()) || PyIndex_Check(value.ptr()) ||
                       std::strncmp(Py_TYPE(value.ptr())->tp_name, "numpy.float", 11) == 0;
  if (is_bool_like(value) || !numeric) {
    raise_value_error(str_cat(field, ": expected a float, got ", describe(value)));
  }
  const double v = PyFloat_AsDouble(value.ptr());
  if (v == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();  // an int too large for a double
    raise_value_error(str_cat(field, ": expected a float32 value, got ", describe(value)));
  }
  if (std::isfinite(v) && std::fabs(v) > FLT_MAX) {
    raise_value_error(str_cat(field, ": expected a float32 value (|x| <= ", FLT_MAX, "), got ",
                              value_text(value)));
  }
  return static_cast<float>(v);
}

std::string string_from_python(nb::handle value, std::string_view field) {
  if (!PyUnicode_Check(value.ptr())) {
    raise_value_error(str_cat(field, ": expected a str, got ", describe(value)));
  }
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(value.ptr(), &size);
  if (data == nullptr) {
    PyErr_Clear();
    raise_value_error(str_cat(field, ": expected a str UTF-8 can encode, got ", value_text(value),
                              " (a lone surrogate)"));
  }
  std::string text(data, static_cast<size_t>(size));
  if (text.find('\0') != std::string::npos) {
    raise_value_error(
        str_cat(field, ": expected a str without NUL characters, got ", value_text(value)));
  }
  return text;
}

}  // namespace sparse_swa::python
