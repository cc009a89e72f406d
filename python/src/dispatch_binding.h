// SPDX-License-Identifier: Apache-2.0
// The dispatch-width policy's private functions for sparse_swa.dispatch (host only).
#pragma once

#include <nanobind/nanobind.h>

namespace sparse_swa::python {

void bind_dispatch(nanobind::module_& m);

}  // namespace sparse_swa::python
