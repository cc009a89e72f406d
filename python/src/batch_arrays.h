// SPDX-License-Identifier: Apache-2.0
// One call's batch arrays: the caller's objects as given, and their checked zero-copy views.
#pragma once

#include <nanobind/nanobind.h>

#include <vector>

#include "array_input.h"
#include "sparse_swa/batch.h"

namespace sparse_swa::python {

namespace nb = nanobind;

// The caller's arrays, kept on the metadata as the reference keeps them; the draft update
// re-reads them after the engine advanced them in place.
struct BatchObjects {
  nb::object query_start_loc;      // [num_reqs + 1] int32
  nb::object seq_lens;             // [num_reqs] int32
  nb::object block_table;          // [>= num_reqs, max_blocks] int32, unit column stride
  nb::object slot_mapping;         // [num_tokens] int64, -1 = padding
  nb::object query_start_loc_cpu;  // None or a host [num_reqs + 1] int32
  nb::object seq_lens_cpu;         // None or a host [num_reqs] int32
  bool causal = true;
};

// The checked views. `input` points into the imported arrays, which this object keeps alive.
struct ImportedBatch {
  InputArray query_start_loc, seq_lens, block_table, slot_mapping;
  InputArray query_start_loc_cpu, seq_lens_cpu;
  Place place;                 // where the four batch arrays live
  Framework device_framework;  // of query_start_loc: the metadata's arrays
  Framework host_framework;    // of query_start_loc_cpu when given: the *_cpu outputs
  BatchInput input;            // image_spans left empty
};

// ValueError naming the argument on a non-array, wrong dtype or rank, non-unit inner stride, or
// arrays on different devices; with cuda arrays the two *_cpu host copies are required. A host
// copy given (not None) must have its array's length; an empty one is not taken for absent.
ImportedBatch import_batch(const BatchObjects& objects);

// {request index: [(start, end), ...]} (inclusive, absolute positions) or None.
std::vector<ImageSpan> image_spans_from_python(nb::handle spans);

}  // namespace sparse_swa::python
