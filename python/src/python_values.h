// SPDX-License-Identifier: Apache-2.0
// Python scalars and strings in, with ValueErrors that name the field ("FIELD: expected ...,
// got ..."), and safe text of Python objects for messages.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace sparse_swa::python {

namespace nb = nanobind;

// An int in [min, max]: a Python int, a numpy integer scalar or any other __index__ object; never
// a bool (Python or numpy).
int64_t int_from_python(nb::handle value, std::string_view field, int64_t min, int64_t max);
int32_t int32_from_python(nb::handle value, std::string_view field);
// True / False or a numpy bool scalar; never an int.
bool bool_from_python(nb::handle value, std::string_view field);
// A float, an int or a numpy float / integer scalar, within the float32 range (inf and nan pass).
float float_from_python(nb::handle value, std::string_view field);
// A str as UTF-8. ValueError for a non-str, a str UTF-8 cannot encode (lone surrogates) and a
// str holding NUL (C++ would read it as a shorter name).
std::string string_from_python(nb::handle value, std::string_view field);

// "int", "numpy.ndarray", ...: the Python type name of `value` for messages.
std::string type_name_of(nb::handle value);
// repr() of a str, str() of anything else, cut to 64 printable bytes: "'cpu\\x00'", "64.0".
std::string value_text(nb::handle value);
// `value` for a message: "None", "float 64.0", "str 'cpu\\x00'", "list" (the text only for
// numbers and strings, cut to 64 bytes).
std::string describe(nb::handle value);
// A str's UTF-8 for a message: what UTF-8 cannot hold is backslash-escaped, never an error.
std::string message_text(nb::handle str);

}  // namespace sparse_swa::python
