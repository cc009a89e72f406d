// SPDX-License-Identifier: Apache-2.0
// Owned copies between host and device memory for batches and metadata: what the CLI, the
// tests and the benchmarks need to drive the CUDA backend from host data. Engines that already
// hold device tensors do not need these.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "sparse_swa/batch.h"
#include "sparse_swa/metadata.h"
#include "sparse_swa/status.h"

namespace sparse_swa {

// Device copies of a host batch's arrays. input() points at them and carries the host copies
// of query_start_loc / seq_lens the CUDA backend plans with (views into this object).
class DeviceBatch {
 public:
  // Errors: UNAVAILABLE without a CUDA build or device; INTERNAL on a CUDA error.
  static StatusOr<std::unique_ptr<DeviceBatch>> upload(const BatchInput& host);
  ~DeviceBatch();
  DeviceBatch(const DeviceBatch&) = delete;
  DeviceBatch& operator=(const DeviceBatch&) = delete;

  BatchInput input() const { return input_; }

 private:
  DeviceBatch() = default;
  std::vector<int32_t> host_query_start_loc_;  // [num_reqs + 1]
  std::vector<int32_t> host_seq_lens_;         // [num_reqs]
  std::vector<ImageSpan> spans_;
  // One allocation: qsl | seq_lens | block_table | slot_mapping | replay_start.
  void* device_ = nullptr;
  BatchInput input_;
};

// A host copy of metadata from either memory space: every array of the field list
// (metadata_fields.h) copied; md's views point into this object.
struct HostMetadata {
  SwaMetadata md;
  std::vector<std::vector<int32_t>> int32_arrays;  // index views: rows, then lens
  std::vector<std::vector<uint8_t>> uint8_arrays;
};

// Synchronous copy (device metadata: cudaMemcpy after the builder's work on the default
// stream semantics; call after the build's stream is synchronised).
StatusOr<std::unique_ptr<HostMetadata>> copy_metadata_to_host(const SwaMetadata& md);

}  // namespace sparse_swa
