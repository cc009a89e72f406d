// SPDX-License-Identifier: Apache-2.0
// The index consumers for Python, on host or device metadata: md.mixed_matrix() and
// md.combined_prefill(...) (SWA-only or compressed layers),
// sparse_swa.compressed_topk_to_global(...) and sparse_swa.to_ragged(indices, lens). Outputs are
// new arrays the caller owns, made where the metadata lives (call_arrays.h), or the caller's own
// out= arrays.
#pragma once

#include <nanobind/nanobind.h>

#include <string_view>

#include "call_arrays.h"
#include "sparse_swa/consumers.h"

namespace sparse_swa::python {

namespace nb = nanobind;

// One layer's compressed inputs (consumers.h CompressedTopk) from the Python arguments; all
// None for an SWA-only layer (compress_ratio 1).
struct TopkArgs {
  nb::handle compress_ratio, block_table, block_size, decode_local, decode_global,
      decode_global_lens, prefill_local;
};
// The arrays live at the call's place; `table_name` and `size_name` are the Python names of the
// compressed cache's block table and block size.
CompressedTopk topk_from(const TopkArgs& a, const CallPlace& call,
                         std::string_view table_name = "block_table",
                         std::string_view size_name = "block_size");

// `status` with CompressedTopk's field names (topk.cache.block_table, ...) replaced by the
// Python argument names, the compressed cache's block table and block size as given.
Status topk_names(const Status& status, std::string_view table_name = "block_table",
                  std::string_view size_name = "block_size");

// The mixed matrix's form from its Python spelling ("flashinfer_sm100" or "verbatim"); ValueError
// naming `form` otherwise.
MixedMatrixForm mixed_form_from(nb::handle value);

void bind_consumers(nb::module_& m);

}  // namespace sparse_swa::python
