// SPDX-License-Identifier: Apache-2.0
// BuilderConfig for Python: a class with the JSON config's field names, and dict conversion.
#pragma once

#include <nanobind/nanobind.h>

#include "sparse_swa/config.h"

namespace sparse_swa::python {

namespace nb = nanobind;

// A BuilderConfig object or a dict with the JSON config's field names (missing fields keep the
// defaults; unknown names and wrong types raise ValueError naming the field). Not validated here.
BuilderConfig config_from_object(nb::handle obj);
nb::dict config_to_dict(const BuilderConfig& config);

void bind_config(nb::module_& m);

}  // namespace sparse_swa::python
