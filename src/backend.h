// SPDX-License-Identifier: Apache-2.0
// The entry points of the two backends, the one seam between the front ends and them. A front
// end (src/*.cc, one per operation) checks every shape and memory space, plans on the host and
// picks the backend from the memory space of the views: host views run cpu_*, the reference in
// src/cpu/; device views run cuda_*, in src/cuda/. A CPU-only build links src/cuda_stub/ in
// place of src/cuda/: there every cuda_* entry point returns UNAVAILABLE. Neither backend
// includes the other; both see only this header, src/common/ and the checks they share
// (docs/design.md#data-flow).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "attention/overrides.h"
#include "batch_checks.h"
#include "sparse_swa/attention.h"
#include "sparse_swa/consumers.h"
#include "sparse_swa/kv_cache.h"
#include "sparse_swa/metadata_builder.h"

namespace sparse_swa::detail {

// ---------------------------------------------------------------- devices and memory

// True when this build has the CUDA backend and a CUDA device is usable.
bool cuda_device_usable();
// Synchronous device allocation and copies (device_copies.cc).
Status cuda_device_alloc(void** ptr, size_t bytes);
void cuda_device_free(void* ptr);
// True while `cuda_stream` (nullptr = the default stream) is capturing a graph; false on errors.
bool cuda_stream_capturing(void* cuda_stream);
Status cuda_copy_host_to_device(void* dst, const void* src, size_t bytes);
Status cuda_copy_device_to_host(void* dst, const void* src, size_t bytes);

// ---------------------------------------------------------------- metadata builder

// What a build writes, planned by the front end (metadata_builder.cc) once every host check
// passed: the split, the image spans grouped by request, and the decode rows' kind and width.
struct RowsPlan {
  StepSplit split;
  const SpanCsr* spans = nullptr;  // host CSR over the batch's requests (count may be 0)
  bool with_image = false;         // Mi > 0, prefill tokens and at least one span
  int32_t decode_width = 0;        // W for causal rows, Wn for DSpark non-causal rows
};

// The half of a MetadataBuilder that owns the per-token buffers and writes the rows: the CPU
// reference (src/cpu/cpu_builder_rows.cc) or the CUDA kernel (src/cuda/cuda_builder_rows.cc).
class BuilderRows {
 public:
  virtual ~BuilderRows() = default;
  // The buffers the metadata exports, for check_batch_outside.
  virtual void add_owned_buffers(OwnedBuffers* owned) const = 0;
  // Writes the step's per-token outputs (mapping, validity, decode and prefill rows and lens,
  // visibility, gather lens) and points `md`'s views at them; `md`'s scalars are set. Keeps what
  // a draft update needs of the build. The CPU first checks what only it can read (every
  // window inside the block table) and writes nothing on an error; the CUDA kernel flags such
  // rows (take_device_error).
  virtual Status write_rows(const BatchInput& batch, const RowsPlan& plan, SwaMetadata* md) = 0;
  // MetadataBuilder::build_groups, called on rows[0] (this): write_rows of every group g into
  // rows[g]'s buffers, nothing written unless every group passes its checks. The CPU writes the
  // groups in turn after checking all; CUDA enqueues one kernel for all, on this stream.
  virtual Status write_rows_groups(std::span<BuilderRows* const> rows,
                                   std::span<const BatchInput> batches,
                                   std::span<const RowsPlan> plans, std::span<SwaMetadata> mds) = 0;
  // update_draft_decode_rows: validity of every token from the batch's slot_mapping, the first
  // last.num_decode_tokens tokens' requests from its query_start_loc (padding: the last request),
  // and their rows in the build's mode (causal rows of the logical window W with the build's
  // replay_start, or DSpark non-causal rows), plus the build's FlashInfer lens if it wrote them.
  // Checked as write_rows.
  virtual Status update_decode_rows(const BatchInput& batch, const DraftUpdateRecord& last) = 0;
  virtual Status take_device_error() = 0;
  // The stream later calls enqueue on (CUDA; the CPU ignores it and reports nullptr).
  virtual void set_stream(void* cuda_stream) = 0;
  virtual void* stream() const = 0;
  // Tests: fills every output buffer with `byte` (CUDA; the CPU has nothing to poison).
  virtual Status poison(uint8_t byte) = 0;
};

// `cuda_stream` is a cudaStream_t (nullptr = the default stream).
StatusOr<std::unique_ptr<BuilderRows>> create_cpu_builder_rows(const BuilderConfig& config,
                                                               const DerivedConfig& derived);
StatusOr<std::unique_ptr<BuilderRows>> create_cuda_builder_rows(const BuilderConfig& config,
                                                                const DerivedConfig& derived,
                                                                void* cuda_stream);

// Tests: fills every output buffer of a CUDA builder with `byte` (and synchronises), so that a
// comparison cannot pass on values an earlier build left.
Status poison_cuda_builder_outputs(MetadataBuilder* builder, uint8_t byte);
struct BuilderInternals {
  static BuilderRows& rows(MetadataBuilder& builder) { return *builder.rows_; }
};

// The metadata kernel launched with no rows to write: the least a build's launch costs (the
// launch probes of bench/). init looks the launch up once, as a builder's create() does.
struct MetadataLaunchProbe {
  int resident_blocks = 1;           // SMs x resident blocks per SM
  int64_t params_bytes = 0;          // the kernel's parameter block
  void* function = nullptr;          // the kernel's handle for the driver's launch
  void* cu_launch_kernel = nullptr;  // the driver's cuLaunchKernel; null: <<<>>> only
};
Status cuda_init_metadata_launch_probe(MetadataLaunchProbe* probe);
// Enqueues the kernel on `cuda_stream`; through the driver when `driver` (and available), else
// through the runtime's <<<>>>.
Status cuda_launch_metadata_kernel_without_rows(const MetadataLaunchProbe& probe, void* cuda_stream,
                                                bool driver);

// ---------------------------------------------------------------- KV codec

// Shapes, slot count and spaces checked (kv_cache.cc). The CPU reference also rejects slots
// below -1 or past the cache; the CUDA codec skips and counts them.
Status cpu_encode_kv_rows(MatrixView<const float> rows, std::span<const int64_t> slots,
                          const KvCacheView& cache);
Status cpu_encode_kv_rows_bf16(MatrixView<const uint16_t> rows, std::span<const int64_t> slots,
                               const KvCacheView& cache);
Status cpu_decode_kv_rows(const ConstKvCacheView& cache, std::span<const int64_t> slots,
                          MatrixView<float> out);
Status cuda_encode_kv_rows(MatrixView<const float> rows, std::span<const int64_t> slots,
                           const KvCacheView& cache, const KvCodecOptions& options);
Status cuda_encode_kv_rows_bf16(MatrixView<const uint16_t> rows, std::span<const int64_t> slots,
                                const KvCacheView& cache, const KvCodecOptions& options);
Status cuda_decode_kv_rows(const ConstKvCacheView& cache, std::span<const int64_t> slots,
                           MatrixView<float> out, const KvCodecOptions& options);

// ---------------------------------------------------------------- index consumers

// One chunk of the combined prefill rows, resolved and checked on the host (consumers.cc): the
// chunk's first token and request.
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

// Arguments checked by the front ends (consumers.cc). The CPU reference also checks the
// metadata against the batch, row by row, and writes nothing on an error; the CUDA kernels
// write such rows as -1 with lens 0.
Status cpu_compressed_topk_to_global(const SwaMetadata& md, int32_t first_token,
                                     MatrixView<const int32_t> local, const CompressedCache& cache,
                                     IndexView out);
Status cpu_copy_global_topk(const SwaMetadata& md, int32_t first_token, ConstIndexView global,
                            IndexView out);
Status cpu_build_mixed_matrix(const ConsumerStep& step, const CompressedTopk& topk,
                              const MixedMatrixShape& shape, MixedMatrixForm form, IndexView out,
                              std::span<int32_t> swa_lens);
Status cpu_build_combined_prefill(const ConsumerStep& step, const CombineChunk& chunk,
                                  MatrixView<const int32_t> prefill_local, IndexView out);
Status cpu_to_ragged(const ConstIndexView& view, const RaggedView& out);
// check_prefill_topk() on host metadata: the first entry j < topk_len of a valid prefill token
// whose local index is negative or past the request's compressed entries.
Status cpu_check_prefill_topk(const ConsumerStep& step, int32_t compress_ratio,
                              MatrixView<const int32_t> prefill_local);

Status cuda_compressed_topk_to_global(const SwaMetadata& md, int32_t first_token,
                                      MatrixView<const int32_t> local, const CompressedCache& cache,
                                      IndexView out, void* stream);
Status cuda_copy_global_topk(const SwaMetadata& md, int32_t first_token, ConstIndexView global,
                             IndexView out, void* stream);
Status cuda_build_mixed_matrix(const ConsumerStep& step, const CompressedTopk& topk,
                               const MixedMatrixShape& shape, MixedMatrixForm form, IndexView out,
                               std::span<int32_t> swa_lens, void* stream);
Status cuda_build_combined_prefill(const ConsumerStep& step, const CombineChunk& chunk,
                                   MatrixView<const int32_t> prefill_local, IndexView out,
                                   void* stream);
Status cuda_to_ragged(const ConstIndexView& view, const RaggedView& out, void* stream);

// ---------------------------------------------------------------- sparse attention

// Shapes, pointers and spaces checked (attention.cc). The CPU reference rejects index values
// that are neither -1 nor a slot; the CUDA kernels mask and count them.
Status cpu_sparse_attention(const SparseAttentionParams& p);
// The reference without output rounding: out [T, H, 512] and lse [T, H] in double.
Status cpu_sparse_attention_reference(const SparseAttentionParams& p, double* out, double* lse);
// Launches on `cuda_stream` (a cudaStream_t), with what the tests force (the defaults elsewhere).
Status cuda_sparse_attention(const SparseAttentionParams& p, const AttentionOverrides& overrides,
                             void* cuda_stream);
// sparse_attention_workspace_bytes(): 0 without a CUDA build or device.
int64_t cuda_sparse_attention_workspace_bytes(const SparseAttentionParams& p);
// sparse_attention_kernel(): kAuto without a CUDA build or device.
AttentionKernel cuda_sparse_attention_kernel(const SparseAttentionParams& p);
// sparse_attention_max_workspace_bytes(): 0 without a CUDA build or device.
int64_t cuda_sparse_attention_max_workspace_bytes();
// Copies host params to the device, runs, copies out, lse and the bad-index count back.
Status cuda_sparse_attention_from_host(const SparseAttentionParams& host_params);

}  // namespace sparse_swa::detail
