// SPDX-License-Identifier: Apache-2.0
// MetadataBuilder for Python: build() on numpy/torch/cupy/jax arrays, the CPU backend for host
// arrays and the CUDA backend for device arrays, each created on first use.
#pragma once

#include <nanobind/nanobind.h>

namespace sparse_swa::python {

void bind_builder(nanobind::module_& m);

}  // namespace sparse_swa::python
