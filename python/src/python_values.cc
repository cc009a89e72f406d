#include "python_values.h"

#include "sparse_swa/status.h"
#include "status_exceptions.h"

namespace sparse_swa::python {

std::string type_name_of(nb::handle value) { return nb::type_name(value.type()).c_str(); }

int64_t int_from_python(nb::handle value, const std::string& field, int64_t min, int64_t max) {
  if (!PyLong_Check(value.ptr()) || PyBool_Check(value.ptr())) {
    raise_value_error(str_cat(field, ": expected an int, got ", type_name_of(value)));
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
  if (overflow != 0 || v < min || v > max) {
    raise_value_error(str_cat(field, ": expected an int in [", min, ", ", max, "], got ",
                              nb::str(value).c_str()));
  }
  return v;
}

int32_t int32_from_python(nb::handle value, const std::string& field) {
  return static_cast<int32_t>(int_from_python(value, field, INT32_MIN, INT32_MAX));
}

bool bool_from_python(nb::handle value, const std::string& field) {
  if (!PyBool_Check(value.ptr())) {
    raise_value_error(str_cat(field, ": expected a bool, got ", type_name_of(value)));
  }
  return value.ptr() == Py_True;
}

}  // namespace sparse_swa::python
