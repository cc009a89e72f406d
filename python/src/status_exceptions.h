// SPDX-License-Identifier: Apache-2.0
// Library Status -> Python exception. The message is the library's, unchanged.
#pragma once

#include <initializer_list>
#include <string_view>
#include <utility>

#include "sparse_swa/status.h"

namespace sparse_swa::python {

// INVALID_ARGUMENT -> ValueError, UNIMPLEMENTED -> NotImplementedError,
// UNAVAILABLE / INTERNAL (anything else) -> RuntimeError. Throws nanobind::python_error.
[[noreturn]] void raise_status(const Status& status);

inline void throw_if_error(const Status& status) {
  if (!status.ok()) raise_status(status);
}

// `status` with each `from` in its message replaced by `to`: library field names
// ("params.swa_indices") become the Python argument's ("indices").
Status renamed_fields(const Status& status,
                      std::initializer_list<std::pair<std::string_view, std::string_view>> names);

// Raises ValueError(message): for bad arguments the binding itself detects (dtype, device, ...).
[[noreturn]] void raise_value_error(const std::string& message);

// The last resort for C++ exceptions out of a bound function (nanobind's python_error and its
// builtin exceptions are handled before): MemoryError for std::bad_alloc, RuntimeError with a
// message of ours for anything else, so no C++ exception text reaches the user.
void register_exception_translator();

}  // namespace sparse_swa::python
