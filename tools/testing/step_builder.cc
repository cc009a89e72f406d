// SPDX-License-Identifier: Apache-2.0
#include "testing/step_builder.h"

namespace sparse_swa::testing {

StatusOr<std::unique_ptr<StepBuilder>> StepBuilder::create(const BuilderConfig& config,
                                                           Backend backend) {
  auto builder = MetadataBuilder::create(config, backend);
  if (!builder.ok()) return builder.status();
  return std::unique_ptr<StepBuilder>(new StepBuilder(std::move(builder).value()));
}

Status StepBuilder::build(const BatchInput& host_batch, SwaMetadata* host_md) {
  if (builder_->backend() == Backend::kCpu) {
    SPARSE_SWA_RETURN_IF_ERROR(builder_->build(host_batch, host_md));
    last_decode_rows_ = host_md->decode_swa.data;
    return Status::Ok();
  }
  // The CUDA backend reads device arrays; its metadata comes back with a synchronous copy.
  host_copy_.reset();
  auto device = DeviceBatch::upload(host_batch);
  SPARSE_SWA_RETURN_IF_ERROR(device.status());
  device_batch_ = std::move(device).value();
  SwaMetadata device_md;
  SPARSE_SWA_RETURN_IF_ERROR(builder_->build(device_batch_->input(), &device_md));
  // The host checks of the CUDA backend see only the host copies; the kernel checked the rest.
  SPARSE_SWA_RETURN_IF_ERROR(builder_->take_device_error());
  auto host = copy_metadata_to_host(device_md);
  SPARSE_SWA_RETURN_IF_ERROR(host.status());
  host_copy_ = std::move(host).value();
  last_decode_rows_ = device_md.decode_swa.data;
  *host_md = host_copy_->md;
  return Status::Ok();
}

}  // namespace sparse_swa::testing
