// SPDX-License-Identifier: Apache-2.0
// Ragged (CSR) form of an index view, CPU (for the ROCm AITER kernels).
#include <algorithm>

#include "backend.h"

namespace sparse_swa::detail {

Status cpu_to_ragged(const ConstIndexView& view, const RaggedView& out) {
  out.indptr[0] = 0;
  for (int64_t i = 0; i < view.rows; ++i) {
    const int32_t len = view.lens[i];  // checked: 0 <= len <= width
    std::copy(view.row(i), view.row(i) + len, out.values + out.indptr[i]);
    out.indptr[i + 1] = out.indptr[i] + len;
  }
  return Status::Ok();
}

}  // namespace sparse_swa::detail
