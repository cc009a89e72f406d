// SPDX-License-Identifier: Apache-2.0
// One builder of either backend, driven from host batches: the CUDA backend gets a device copy
// of each batch and its metadata is copied back, so callers always see host metadata.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>

#include "sparse_swa/config.h"
#include "sparse_swa/device_copies.h"
#include "sparse_swa/metadata_builder.h"
#include "sparse_swa/status.h"

namespace sparse_swa::testing {

class StepBuilder {
 public:
  // Errors: the config's, or UNAVAILABLE without a CUDA backend.
  static StatusOr<std::unique_ptr<StepBuilder>> create(const BuilderConfig& config,
                                                       Backend backend);

  // Builds one step; *host_md is host metadata, valid until the next build(). The CUDA
  // backend's device error (MetadataBuilder::take_device_error) is taken and returned.
  Status build(const BatchInput& host_batch, SwaMetadata* host_md);

  const DerivedConfig& derived() const { return builder_->derived(); }
  Backend backend() const { return builder_->backend(); }
  // The builder's own decode-row buffer of the last step (device memory for CUDA): the same
  // address on every causal step, since build() allocates nothing.
  const int32_t* last_decode_rows() const { return last_decode_rows_; }

 private:
  explicit StepBuilder(std::unique_ptr<MetadataBuilder> builder) : builder_(std::move(builder)) {}

  std::unique_ptr<MetadataBuilder> builder_;
  std::unique_ptr<DeviceBatch> device_batch_;  // CUDA: the last step's batch
  std::unique_ptr<HostMetadata> host_copy_;    // CUDA: the last step's metadata
  const int32_t* last_decode_rows_ = nullptr;
};

}  // namespace sparse_swa::testing
