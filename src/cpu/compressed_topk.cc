// Compressed top-k -> global compressed slots (C2A/C4A) and the C128A pass-through.
#include <algorithm>

#include "cpu/consumers_internal.h"

namespace sparse_swa {

namespace {

// Rows [first_token, first_token + rows) must be tokens of the step.
Status check_token_rows(const SwaMetadata& md, int32_t first_token, int64_t rows,
                        std::string_view name) {
  if (first_token < 0 || first_token + rows > md.num_tokens) {
    return invalid_argument(name, ": rows for tokens [", first_token, ", ", first_token + rows,
                            ") must lie inside the step's ", md.num_tokens, " tokens");
  }
  if (static_cast<int64_t>(md.token_to_req_indices.size()) < md.num_tokens ||
      static_cast<int64_t>(md.is_valid_token.size()) < md.num_tokens) {
    return invalid_argument("metadata.token_to_req_indices / is_valid_token: expected >= ",
                            md.num_tokens, " entries (num_tokens), got ",
                            md.token_to_req_indices.size(), " / ", md.is_valid_token.size());
  }
  return Status::Ok();
}

}  // namespace

Status compressed_topk_to_global(const SwaMetadata& md, int32_t first_token,
                                 MatrixView<const int32_t> local, const CompressedCache& cache,
                                 IndexView out, void* cuda_stream) {
  SPARSE_SWA_RETURN_IF_ERROR(detail::check_matrix(local, md.space, "local_topk"));
  SPARSE_SWA_RETURN_IF_ERROR(check_token_rows(md, first_token, local.rows, "local_topk"));
  SPARSE_SWA_RETURN_IF_ERROR(detail::check_cache(cache, md, "cache"));
  if (cache.compress_ratio == 1) {
    return invalid_argument(
        "cache.compress_ratio: expected 2, 4 or 128 for compressed top-k, "
        "got 1");
  }
  SPARSE_SWA_RETURN_IF_ERROR(detail::check_output(out, md.space, local.rows, local.cols, "out"));
  if (local.rows == 0) return Status::Ok();
  if (md.space == MemorySpace::kDevice) {
#if SPARSE_SWA_HAS_CUDA
    return detail::cuda_compressed_topk_to_global(md, first_token, local, cache, out, cuda_stream);
#else
    return unavailable("compressed_topk_to_global: device views need the CUDA backend");
#endif
  }
  (void)cuda_stream;
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
      row[j] = detail::host_global_slot(cache, r, local.row(i)[j]);
      count += row[j] >= 0;
    }
    out.lens[i] = count;
  }
  return Status::Ok();
}

Status copy_global_topk(const SwaMetadata& md, int32_t first_token, ConstIndexView global,
                        IndexView out, void* cuda_stream) {
  SPARSE_SWA_RETURN_IF_ERROR(check_index_view(global, "global_topk"));
  if (global.rows > 0) {
    SPARSE_SWA_RETURN_IF_ERROR(detail::check_space(md.space, global.space, "global_topk"));
  }
  SPARSE_SWA_RETURN_IF_ERROR(check_token_rows(md, first_token, global.rows, "global_topk"));
  SPARSE_SWA_RETURN_IF_ERROR(detail::check_output(out, md.space, global.rows, global.width, "out"));
  if (global.rows == 0) return Status::Ok();
  if (md.space == MemorySpace::kDevice) {
#if SPARSE_SWA_HAS_CUDA
    return detail::cuda_copy_global_topk(md, first_token, global, out, cuda_stream);
#else
    return unavailable("copy_global_topk: device views need the CUDA backend");
#endif
  }
  (void)cuda_stream;
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

}  // namespace sparse_swa
