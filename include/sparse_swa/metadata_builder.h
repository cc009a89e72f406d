// SPDX-License-Identifier: Apache-2.0
// The per-step SWA metadata builder. One spec, two backends: the CPU backend is the reference,
// the CUDA backend must match it bit for bit.
#pragma once

#include <memory>
#include <span>

#include "sparse_swa/batch.h"
#include "sparse_swa/config.h"
#include "sparse_swa/metadata.h"
#include "sparse_swa/status.h"

namespace sparse_swa {

enum class Backend { kCpu, kCuda };

const char* backend_name(Backend b);
// True when this library was built with the CUDA backend and a CUDA device is usable.
bool cuda_backend_available();

namespace detail {
class BuilderRows;        // the backend that writes the rows (src/backend.h)
struct BuilderHost;       // the host buffers and the last build's record (metadata_builder.cc)
struct BuilderInternals;  // tests' access to the backend's buffers (src/backend.h)
struct RowsPlan;          // what a build writes, planned on the host (src/backend.h)
}  // namespace detail

// The most builders one build_groups() call takes.
inline constexpr int kMaxBuildGroups = 8;

class MetadataBuilder {
 public:
  // Validates the config and allocates every persistent buffer (sized from
  // max_num_batched_tokens / max_num_seqs). `cuda_stream` is a cudaStream_t (nullptr = default
  // stream) for the CUDA backend and ignored by the CPU backend.
  static StatusOr<std::unique_ptr<MetadataBuilder>> create(const BuilderConfig& config,
                                                           Backend backend = Backend::kCpu,
                                                           void* cuda_stream = nullptr);
  ~MetadataBuilder();
  MetadataBuilder(const MetadataBuilder&) = delete;
  MetadataBuilder& operator=(const MetadataBuilder&) = delete;

  const BuilderConfig& config() const { return config_; }
  const DerivedConfig& derived() const { return derived_; }
  Backend backend() const { return backend_; }

  // Validates the batch (on error nothing is written), then fills `out` with views into the
  // persistent buffers. Allocates nothing; buffer addresses are the same on every step.
  Status build(const BatchInput& batch, SwaMetadata* out);

  // One step's metadata for several KV-cache groups (their builders differ in window, block size
  // or any other config field; their batches in block_table, slot_mapping, replay_start or any
  // other array): out[g] is what builders[g]->build(batches[g], &out[g]) gives, bit for bit.
  // Every group is checked before any is written (on error nothing is written), and CUDA
  // builders write all groups in one kernel launch, on their common stream. The builders are
  // distinct, of one backend, at most kMaxBuildGroups, and (CUDA) set to one stream; each keeps
  // its own last build for its draft update and its own device error word
  // (docs/design.md#one-build-for-several-groups).
  static Status build_groups(std::span<MetadataBuilder* const> builders,
                             std::span<const BatchInput> batches, std::span<SwaMetadata> out);

  // The reference's update_draft_decode_metadata, between the draft loop's steps: after the
  // engine advanced seq_lens (and possibly block_table, slot_mapping, query_start_loc) in place,
  // rewrite is_valid_token of every token from slot_mapping, token_to_req_indices of the first Td
  // tokens from query_start_loc (CUDA-graph padding tokens: the last request), and those Td
  // decode rows in the build's mode (causal rows of the logical window W, never the row width,
  // with the build's replay_start; or DSpark non-causal rows), plus the FlashInfer decode lens
  // when the build wrote them. `md` must be the last build's metadata as returned (its counts and
  // views unedited) and `batch` must have that build's shape (requests, tokens). The arrays are
  // authoritative: the host copies are not read (only their lengths checked; they may still hold
  // the build's values or be left out), nor is batch.replay_start (docs/semantics.md#draft-update).
  Status update_draft_decode_rows(const BatchInput& batch, SwaMetadata* md);

  // CUDA backend: the device arrays cannot be read on the host without a sync, so build()
  // checks the host copies and the kernel re-checks each row against the device arrays. A row
  // whose device inputs disagree (seq_len below its query length, a block outside the table,
  // a negative block id, an int32 slot overflow, a padding token with a real slot, a
  // replay_start outside [0, seq_len - query_len]) is written as invalid (lens 0, all -1) and
  // recorded. This call synchronises the builder's stream and returns (and clears)
  // that record. The CPU backend checks everything in build(): always Ok
  // (docs/design.md#the-device-error-word).
  Status take_device_error();

  // CUDA backend: the cudaStream_t later build(), update_draft_decode_rows() and
  // take_device_error() calls enqueue on (nullptr = the default stream), replacing create()'s.
  // Nothing orders work across the two streams: a caller that switches orders them itself. The
  // CPU backend ignores it.
  void set_cuda_stream(void* cuda_stream);

 private:
  friend struct detail::BuilderInternals;
  MetadataBuilder(const BuilderConfig& config, const DerivedConfig& derived, Backend backend);
  // build() in three steps, so that build_groups() can check every group before writing any:
  // the host checks, the plan and the step's scalars; the backend's rows; the host records.
  Status prepare_build(const BatchInput& batch, detail::RowsPlan* plan, SwaMetadata* md);
  void finish_build(const BatchInput& batch, const detail::RowsPlan& plan, SwaMetadata* md);

  BuilderConfig config_;
  DerivedConfig derived_;
  Backend backend_;
  std::unique_ptr<detail::BuilderRows> rows_;
  std::unique_ptr<detail::BuilderHost> host_;
};

}  // namespace sparse_swa
