// SPDX-License-Identifier: Apache-2.0
// The FlashInfer SM100 relayout of one non-causal (DSpark) decode row in the mixed matrix
// (docs/semantics.md#mixed-matrix), shared by the CPU reference and the CUDA kernel.
//
// The builder's non-causal row of a request with ctx cached tokens and a block of ql tokens holds
// min(ctx, W) + ql slots, positions [max(ctx - W, 0), ctx + ql). The kernel reads columns
// [0, min(W, pos + 1)) and [W, lens) as keys, so block token i (pos = ctx + i) gets
//   columns [0, wl)      row entries [0, wl)          wl = min(ctx + i + 1, W)
//   columns [wl, W)      -1 (never read: pos + 1 >= wl)
//   columns [W, W + sp)  row entries [wl, wl + sp)     sp = min(ctx, W) + ql - wl
// and its compressed entries from column W + sp.
#pragma once

#include <cstdint>

#include "common/swa_formulas.h"

namespace sparse_swa::formulas {

struct RelaidRow {
  int64_t window_len;  // wl, in [1, W]
  int64_t spill_len;   // sp >= 0; wl + sp = the builder row's lens
  SPARSE_SWA_HD int64_t row_entries() const { return window_len + spill_len; }
  // cs: the first column after the SWA entries, where the compressed entries start.
  SPARSE_SWA_HD int64_t compressed_start(int32_t window) const { return window + spill_len; }
};

// Needs context_len >= 0, 0 <= token_in_query < query_len, window >= 1 (callers check them).
SPARSE_SWA_HD RelaidRow relaid_row(int64_t context_len, int64_t query_len, int64_t token_in_query,
                                   int32_t window) {
  const int64_t w = window;
  const int64_t causal_part = context_len + token_in_query + 1;  // pos + 1
  const int64_t wl = causal_part < w ? causal_part : w;
  const int64_t entries = (context_len < w ? context_len : w) + query_len;
  return {wl, entries - wl};
}

// The row entry shown in column j < compressed_start(window), or -1 for the hole [wl, W).
SPARSE_SWA_HD int64_t relaid_source(int64_t j, int32_t window, const RelaidRow& r) {
  if (j < window) return j < r.window_len ? j : -1;
  return j - window + r.window_len;
}

}  // namespace sparse_swa::formulas
