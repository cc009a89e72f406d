// SPDX-License-Identifier: Apache-2.0
#include "sparse_swa/index_view.h"

namespace sparse_swa {

Status check_index_view(const ConstIndexView& view, std::string_view name) {
  if (view.rows < 0) return invalid_argument(name, ".rows: expected >= 0, got ", view.rows);
  if (view.width < 0) return invalid_argument(name, ".width: expected >= 0, got ", view.width);
  if (view.row_stride < view.width) {
    return invalid_argument(name, ".row_stride: expected >= width ", view.width, ", got ",
                            view.row_stride);
  }
  if (view.rows > 0 && (view.data == nullptr || view.lens == nullptr)) {
    return invalid_argument(name, ": ", view.rows, " rows but a null data or lens pointer");
  }
  if (view.space == MemorySpace::kHost) {
    for (int64_t i = 0; i < view.rows; ++i) {
      const int32_t len = view.lens[i];
      if (len < 0 || len > view.width) {
        return invalid_argument(name, ".lens[", i, "]: expected 0..", view.width,
                                " (the row width), got ", len);
      }
    }
  }
  return Status::Ok();
}

}  // namespace sparse_swa
