// SPDX-License-Identifier: Apache-2.0
// The KV cache codec and the sparse attention for Python, on host (numpy) arrays: page_layout,
// encode_kv, decode_kv and sparse_attention (CPU backend; device arrays raise
// NotImplementedError for now).
#pragma once

#include <nanobind/nanobind.h>

namespace sparse_swa::python {

void bind_attention(nanobind::module_& m);

}  // namespace sparse_swa::python
