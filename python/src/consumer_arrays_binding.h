// SPDX-License-Identifier: Apache-2.0
// The index consumers over plain arrays, for callers that hold a step's metadata as arrays
// rather than as an SwaMetadata object (the torch.ops.sparse_swa consumer ops of
// sparse_swa/torch_ops.py, whose schemas can carry only tensors and scalars). Each entry point
// takes exactly the metadata arrays and scalars its consumer reads, under the names of
// SwaMetadata's Python attributes, builds the library's SwaMetadata / BatchInput views over them
// (no copy) and runs the same library call as md.mixed_matrix(), md.combined_prefill() and
// compressed_topk_to_global(md, ...), with the same checks.
#pragma once

#include <nanobind/nanobind.h>

namespace sparse_swa::python {

namespace nb = nanobind;

void bind_consumer_arrays(nb::module_& m);

}  // namespace sparse_swa::python
