// SPDX-License-Identifier: Apache-2.0
// Index consumers: the matrices each sparse-attention kernel family reads, built from the SWA
// metadata of a step (and an indexer's compressed top-k). One spec, two backends: host views run
// the CPU reference, device views run the CUDA kernels, and the two agree bit for bit. The memory
// space of the metadata picks the backend; every array and output view must live in that space.
//
// Every output goes into a caller-provided buffer described by a view, so a consumer can keep
// one persistent, capacity-strided buffer per matrix (the stride never changes between steps,
// which CUDA-graph replays need; docs/semantics.md#consumer-rules). The *_shape functions give
// the sizes to allocate once.
// An output whose rows or width are too small is an error that names what is needed.
//
// Value rules shared by both backends (the kernels never fault, so the reference masks too):
//   * an invalid token (is_valid_token 0) gets a row of -1 and lens 0 in every output;
//   * a local compressed index that is negative, past the compressed block table or on a
//     negative compressed block id maps to -1. Decode rows count only mapped entries; prefill
//     rows count min((pos + 1) / ratio, TOP_K) whatever the entries hold, as the reference does;
//   * metadata inconsistent with the batch (a token outside its request, a window past the block
//     table or seq_len, a replay_start outside [0, prefix] of a recomputed row's request) is an
//     error on the CPU, with nothing written, and a row of -1 with lens 0 on the GPU, which
//     cannot report it without a sync;
//   * the consumers that recompute causal windows from positions (the mixed matrix's prefill
//     rows, the combined prefill) apply the metadata's replay_start as the builder does: a
//     window starts no earlier than its request's replay_start (docs/semantics.md#bounded-replay).
//     An empty md.replay_start means no replay; else it needs >= num_reqs entries;
//   * metadata whose counts disagree (num_decode_tokens + num_prefill_tokens != num_tokens,
//     num_decodes + num_prefills > num_reqs, a negative count, arrays shorter than num_tokens)
//     is an error on both backends, checked before any arithmetic on the counts.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "sparse_swa/batch.h"
#include "sparse_swa/index_view.h"
#include "sparse_swa/metadata.h"
#include "sparse_swa/status.h"

namespace sparse_swa {

// The step every consumer reads: the builder's metadata and the batch it was built from.
struct ConsumerStep {
  const SwaMetadata& md;
  const BatchInput& batch;  // query_start_loc, seq_lens and block_table are read
  int32_t block_size = 0;   // B, tokens per SWA KV page (BuilderConfig::block_size)
};

// The compressed KV cache of one layer type.
struct CompressedCache {
  MatrixView<const int32_t> block_table;  // [>= num_reqs, max_blocks] compressed block ids
  int32_t block_size = 0;                 // entries per compressed block: attn_block_size / ratio
  int32_t compress_ratio = 1;             // 1 (SWA-only layer: no compressed part), 2, 4 or 128
};

// attn_block_size / compress_ratio; an error unless the ratio is one of {1, 2, 4, 128} and
// divides the block size.
StatusOr<int32_t> compressed_block_size(int32_t attn_block_size, int32_t compress_ratio);

// 1. Compressed top-k -> global compressed slots (the FlashMLA decode `extra_indices`).
// Rows i of `local` are tokens first_token + i. For a valid token:
//   out[i][j] = cbt[r][l / cbs] * cbs + l % cbs   for l = local[i][j] >= 0, else -1
//   out.lens[i] = number of entries >= 0 (entries are mapped in place, not compacted)
// Columns [local.cols, out.width) are -1. Needs out.rows >= local.rows, out.width >= local.cols.
Status compressed_topk_to_global(const SwaMetadata& md, int32_t first_token,
                                 MatrixView<const int32_t> local, const CompressedCache& cache,
                                 IndexView out, void* cuda_stream = nullptr);

// C128A: the given global indices and lens, copied into `out` (entries past lens become -1,
// lens is clamped to [0, width], invalid tokens get -1 and 0).
Status copy_global_topk(const SwaMetadata& md, int32_t first_token, ConstIndexView global,
                        IndexView out, void* cuda_stream = nullptr);

// One layer's compressed inputs. SWA-only layers leave everything empty (compress_ratio 1).
struct CompressedTopk {
  CompressedCache cache;
  MatrixView<const int32_t> decode_local;   // C2A/C4A: [>= Td, topk] local indices, -1 = none
  ConstIndexView decode_global;             // C128A: [>= Td, width] global slots + lens
  MatrixView<const int32_t> prefill_local;  // [>= Tp, TOP_K] local indices (prefill top-k)
};

// 2. The FlashInfer SM100 mixed matrix [T, row_width] and its lens.
//   S (swa_width) = max(decode view width, prefill view width): the decode rows' own width (Wn
//     for DSpark, never the window), and W + Mi on vision configs so that image-widened prefill
//     rows fit (decode rows are then -1 padded). Constant for a builder, whatever the batch.
//   P (compressed_width) = round_up(max(prefill TOP_K, decode compressed width), 4)
//   row_width = round_up(S + P, 4): every row starts 16 bytes aligned, whatever S is.
// Widths past int32 saturate at the largest multiple of 4 in int32; build_mixed_matrix rejects
// such rows.
struct MixedMatrixShape {
  int32_t swa_width = 0;
  int32_t compressed_width = 0;
  int32_t row_width = 0;
};
MixedMatrixShape mixed_matrix_shape(int32_t swa_width, int32_t prefill_topk,
                                    int32_t decode_compressed_topk);
MixedMatrixShape mixed_matrix_shape(const SwaMetadata& md, const CompressedTopk& topk);

// How the mixed matrix lays out non-causal (DSpark) decode rows (md.causal false); causal decode
// rows and prefill rows are the same in both forms (docs/semantics.md#mixed-matrix).
enum class MixedMatrixForm : int32_t {
  // FlashInfer's SM100 sparse MLA kernel reads columns [0, min(W, pos + 1)) and [W, lens) of a
  // row as keys, with no -1 allowed in either, so a non-causal row is re-laid. For token i of a
  // block of ql tokens after ctx cached tokens (the builder's row holds min(ctx, W) + ql slots):
  //   wl = min(ctx + i + 1, W),  sp = min(ctx, W) + ql - wl,  cs = W + sp
  //   columns [0, wl) = row[0, wl), [wl, W) = -1, [W, cs) = row[wl, wl + sp),
  //   compressed entries from column cs, -1 after them; lens = cs + compressed count.
  // A row that would need cs > S is an error (CPU) or -1 with lens 0 (GPU), never written past.
  kFlashInferSm100 = 0,
  // Decode rows copied as the builder wrote them (-1 padded to S), compressed entries from S;
  // lens = S + compressed count: -1 inside [0, S) means "skip" to the kernel.
  kVerbatim = 1,
};
// "flashinfer_sm100", "verbatim": the spelling Python and the torch op use.
const char* mixed_matrix_form_name(MixedMatrixForm form);
StatusOr<MixedMatrixForm> parse_mixed_matrix_form(std::string_view name);

// Row t < Td: causal rows: columns [0, S) copy decode row t (-1 padded), then the compressed
// entries (decode_local mapped as in 1., or decode_global); lens = S + compressed count.
// Non-causal rows: as `form` says.
// Row t >= Td: columns [0, S) recomputed from the position with the logical window W (and the
// metadata's image visibility, starting no earlier than md.replay_start[r]), then the first
// min((pos + 1) / ratio, TOP_K) prefill top-k entries mapped to global slots; lens = S + that
// count.
// swa_lens (optional, [>= T]) gets the number of SWA entries of each row (the decode row's lens,
// the prefill window's size), for kernels that need the exact count. Invalid tokens: row -1,
// lens 0, swa_lens 0. out.row_stride must be a multiple of 4. A non-causal decode row must be
// the builder's (lens min(ctx, W) + ql) for kFlashInferSm100.
Status build_mixed_matrix(const ConsumerStep& step, const CompressedTopk& topk,
                          MixedMatrixForm form, IndexView out, std::span<int32_t> swa_lens = {},
                          void* cuda_stream = nullptr);
// The FlashInfer SM100 form (MixedMatrixForm::kFlashInferSm100).
Status build_mixed_matrix(const ConsumerStep& step, const CompressedTopk& topk, IndexView out,
                          std::span<int32_t> swa_lens = {}, void* cuda_stream = nullptr);

// 3. FlashMLA sparse prefill rows of one chunk of prefill_chunk_plan(), indexing the chunk's
// gathered workspace (request b of the chunk owns rows [b * M, (b + 1) * M): the compressed
// entries in [0, N), the gathered SWA tokens from N on):
//   topk_len = min((pos + 1) / ratio, TOP_K),  window from the position (image-widened, from
//   max(its start, md.replay_start[r]), clamped to the gathered range [gather_start, seq_len)
//   with gather_start = seq_len - prefill_gather_lens[p]),  swa_len = its size
//   row = [M*b + local_j for j < topk_len] ++ [M*b + N + p - gather_start for p in the window]
//   lens = topk_len + swa_len;  the rest of the row is -1.
// A local entry j < topk_len that is negative or >= seq_len / ratio (the request's gathered
// compressed entries) is written as -1 and still counted in lens: FlashMLA skips -1 entries, and
// the GPU cannot report it without a sync. Such rows are flagged by check_prefill_topk().
// Rows are the chunk's tokens in order; width = round_up(TOP_K + prefill view width, 128).
struct CombinedPrefillShape {
  int32_t rows = 0;   // tokens of the chunk's requests
  int32_t width = 0;  // round_up(TOP_K + W + Mi, 128)
};
StatusOr<CombinedPrefillShape> combined_prefill_shape(const SwaMetadata& md,
                                                      const ChunkPlanEntry& chunk,
                                                      int32_t prefill_topk);
// `prefill_local` is [>= Tp, TOP_K] (empty for SWA-only layers, where compress_ratio is 1).
Status build_combined_prefill(const ConsumerStep& step, const ChunkPlanEntry& chunk,
                              int32_t compress_ratio, MatrixView<const int32_t> prefill_local,
                              IndexView out, void* cuda_stream = nullptr);
// Host views only: an error naming the first prefill token and entry j < topk_len whose local
// index is negative or past the request's compressed entries (the indexer broke its contract).
Status check_prefill_topk(const ConsumerStep& step, int32_t compress_ratio,
                          MatrixView<const int32_t> prefill_local);

// 4. Ragged (CSR) form of any index view: indptr [rows + 1], values packed row by row
// (row i's first lens[i] entries). Capacity comes from the view's width, never the window
// (docs/semantics.md#window-and-width).
struct RaggedView {
  int32_t* indptr = nullptr;  // [>= rows + 1]
  int64_t indptr_size = 0;
  int32_t* values = nullptr;  // [capacity]
  int64_t capacity = 0;
  MemorySpace space = MemorySpace::kHost;
};
// rows * width: what `values` must hold whatever the lens are.
int64_t ragged_capacity(const ConstIndexView& view);
Status to_ragged(const ConstIndexView& view, const RaggedView& out, void* cuda_stream = nullptr);

}  // namespace sparse_swa
