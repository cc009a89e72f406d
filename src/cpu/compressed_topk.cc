// SPDX-License-Identifier: Apache-2.0
// Compressed top-k -> global compressed slots (C2A/C4A) and the C128A pass-through, CPU.
#include <algorithm>

#include "backend.h"
#include "cpu/consumer_rows.h"

namespace sparse_swa::detail {

Status cpu_compressed_topk_to_global(const SwaMetadata& md, int32_t first_token,
                                     MatrixView<const int32_t> local, const CompressedCache& cache,
                                     IndexView out) {
  for (int64_t i = 0; i < local.rows; ++i) {  // nothing is written unless every row can be
    const int32_t t = first_token + static_cast<int32_t>(i);
    const int32_t r = md.token_to_req_indices[t];
    if (md.is_valid_token[t] && (r < 0 || r >= md.num_reqs)) {
      return invalid_argument("metadata.token_to_req_indices[", t, "]: expected 0..",
                              md.num_reqs - 1, ", got ", r);
    }
  }
  for (int64_t i = 0; i < local.rows; ++i) {
    const int32_t t = first_token + static_cast<int32_t>(i);
    int32_t* row = out.row(i);
    std::fill(row, row + out.width, -1);
    out.lens[i] = 0;
    if (!md.is_valid_token[t]) continue;
    const int32_t r = md.token_to_req_indices[t];
    int32_t count = 0;
    for (int64_t j = 0; j < local.cols; ++j) {
      row[j] = host_global_slot(cache, r, local.row(i)[j]);
      count += row[j] >= 0;
    }
    out.lens[i] = count;
  }
  return Status::Ok();
}

Status cpu_copy_global_topk(const SwaMetadata& md, int32_t first_token, ConstIndexView global,
                            IndexView out) {
  for (int64_t i = 0; i < global.rows; ++i) {
    const int32_t t = first_token + static_cast<int32_t>(i);
    int32_t* row = out.row(i);
    std::fill(row, row + out.width, -1);
    const int32_t len = md.is_valid_token[t] ? global.lens[i] : 0;  // lens checked <= width
    std::copy(global.row(i), global.row(i) + len, row);
    out.lens[i] = len;
  }
  return Status::Ok();
}

}  // namespace sparse_swa::detail
