// Shared by the consumer entry points: host-side checks of shapes and memory spaces (both
// backends run them before anything is written) and the CUDA launchers they dispatch to.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/swa_formulas.h"
#include "sparse_swa/consumers.h"

namespace sparse_swa::detail {

Status check_space(MemorySpace expected, MemorySpace actual, std::string_view name);
// A matrix input: rows/cols/stride sane, data non-null when it has elements, in `space`.
Status check_matrix(const MatrixView<const int32_t>& m, MemorySpace space, std::string_view name);
// An output view: shape sane (no lens check: it is written), at least `rows` x `width`.
Status check_output(const IndexView& out, MemorySpace space, int64_t rows, int64_t width,
                    std::string_view name);
// The metadata and batch of a step agree in sizes and memory space.
Status check_step(const ConsumerStep& step);
// The compressed cache of a layer: ratio valid, block size >= 1 and table shape when ratio > 1.
Status check_cache(const CompressedCache& cache, const SwaMetadata& md, std::string_view name);
// Non-causal (DSpark) decode rows hold up to W + query_len entries: a decode view narrower than
// window_size + max_decode_query_len would have truncated them.
Status check_decode_width(const SwaMetadata& md);

// Request, position and SWA window of a token (host arrays), or an error naming the token when
// the metadata is inconsistent with the batch (request out of range, negative prefix, window
// outside the block table or with a negative block id).
struct TokenWindow {
  int32_t request = 0;
  int32_t pos = 0;
  formulas::Window window{0, 0};
};
StatusOr<TokenWindow> host_token_window(const ConsumerStep& step, int32_t t, bool with_image);

// Global slot of local compressed index l of request r, or -1 when l is negative, past the
// compressed block table or reads a negative block id. Same rule on the GPU.
int32_t host_global_slot(const CompressedCache& cache, int32_t r, int32_t l);

// One chunk of the combined prefill rows, resolved and checked on the host resolved on the host:
// the chunk's first token and request.
struct CombineChunk {
  int32_t first_token = 0;    // absolute token index of the chunk's first row
  int32_t first_request = 0;  // absolute request index of the chunk's first request
  int32_t num_requests = 0;
  int32_t rows = 0;
  int32_t compressed_width = 0;  // N
  int32_t total_width = 0;       // M
  int32_t ratio = 1;
  int32_t topk = 0;  // TOP_K
};

#if SPARSE_SWA_HAS_CUDA
// The CUDA versions; arguments already checked by the entry points.
Status cuda_compressed_topk_to_global(const SwaMetadata& md, int32_t first_token,
                                      MatrixView<const int32_t> local, const CompressedCache& cache,
                                      IndexView out, void* stream);
Status cuda_copy_global_topk(const SwaMetadata& md, int32_t first_token, ConstIndexView global,
                             IndexView out, void* stream);
Status cuda_build_mixed_matrix(const ConsumerStep& step, const CompressedTopk& topk,
                               const MixedMatrixShape& shape, IndexView out,
                               std::span<int32_t> swa_lens, void* stream);
Status cuda_build_combined_prefill(const ConsumerStep& step, const CombineChunk& chunk,
                                   MatrixView<const int32_t> prefill_local, IndexView out,
                                   void* stream);
Status cuda_to_ragged(const ConstIndexView& view, const RaggedView& out, void* stream);
#endif

}  // namespace sparse_swa::detail
