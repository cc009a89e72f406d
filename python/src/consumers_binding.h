// SPDX-License-Identifier: Apache-2.0
// The index consumers for Python, on host or device metadata: md.mixed_matrix() and
// md.combined_prefill(...) (SWA-only or compressed layers),
// sparse_swa.compressed_topk_to_global(...) and sparse_swa.to_ragged(indices, lens). Outputs are
// new arrays the caller owns, made where the metadata lives (call_arrays.h), or the caller's own
// out= arrays.
#pragma once

#include <nanobind/nanobind.h>

namespace sparse_swa::python {

namespace nb = nanobind;

void bind_consumers(nb::module_& m);

}  // namespace sparse_swa::python
