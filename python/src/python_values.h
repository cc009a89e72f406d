// Python scalars and lists in, with ValueErrors that name the field.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <string>

namespace sparse_swa::python {

namespace nb = nanobind;

// An int (not a bool) in [min, max].
int64_t int_from_python(nb::handle value, const std::string& field, int64_t min, int64_t max);
int32_t int32_from_python(nb::handle value, const std::string& field);
bool bool_from_python(nb::handle value, const std::string& field);
// "int", "numpy.ndarray", ...: the Python type name of `value` for messages.
std::string type_name_of(nb::handle value);

}  // namespace sparse_swa::python
