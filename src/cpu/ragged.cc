// Ragged (CSR) form of an index view, for the ROCm AITER kernels.
#include <algorithm>
#include <limits>

#include "cpu/consumers_internal.h"

namespace sparse_swa {

Status to_ragged(const ConstIndexView& view, const RaggedView& out, void* cuda_stream) {
  SPARSE_SWA_RETURN_IF_ERROR(check_index_view(view, "view"));
  const int64_t capacity = ragged_capacity(view);
  if (capacity > std::numeric_limits<int32_t>::max()) {
    return invalid_argument("view: ", view.rows, " rows x width ", view.width,
                            " overflow the int32 indptr");
  }
  if (out.indptr_size < view.rows + 1) {
    return invalid_argument("out.indptr_size: expected >= rows + 1 = ", view.rows + 1, ", got ",
                            out.indptr_size);
  }
  // Sized from the width, never the window: a DSpark row is wider than W (B2).
  if (out.capacity < capacity) {
    return invalid_argument("out.capacity: expected >= rows x width = ", view.rows, " x ",
                            view.width, " = ", capacity, ", got ", out.capacity);
  }
  if (out.indptr == nullptr || (capacity > 0 && out.values == nullptr)) {
    return invalid_argument("out: null indptr or values pointer");
  }
  if (out.space != view.space) {
    return invalid_argument("out: expected the view's memory space, got the other one");
  }
  if (view.space == MemorySpace::kDevice) {
#if SPARSE_SWA_HAS_CUDA
    return detail::cuda_to_ragged(view, out, cuda_stream);
#else
    return unavailable("to_ragged: device views need the CUDA backend");
#endif
  }
  (void)cuda_stream;
  out.indptr[0] = 0;
  for (int64_t i = 0; i < view.rows; ++i) {
    const int32_t len = view.lens[i];  // checked: 0 <= len <= width
    std::copy(view.row(i), view.row(i) + len, out.values + out.indptr[i]);
    out.indptr[i + 1] = out.indptr[i] + len;
  }
  return Status::Ok();
}

}  // namespace sparse_swa
