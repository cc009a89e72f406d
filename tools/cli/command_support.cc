// Helpers shared by the subcommands.
#include <iostream>
#include <utility>

#include "commands.h"

namespace sparse_swa::cli {

int report_error(const Status& status) {
  std::cerr << "sparse-swa: error: " << status.message() << "\n";
  return kExitInvalidInput;
}

void add_backend_option(CLI::App& command, std::string* backend) {
  command.add_option("--backend", *backend, "metadata builder backend: cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
}

Status flush_stdout() {
  std::cout.flush();
  if (!std::cout) return invalid_argument("stdout: write failed");
  return Status::Ok();
}

StatusOr<std::unique_ptr<StepBuilder>> StepBuilder::create(const BuilderConfig& config,
                                                           const std::string& backend) {
  const Backend kind = backend == "cuda" ? Backend::kCuda : Backend::kCpu;
  auto builder = MetadataBuilder::create(config, kind);
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

}  // namespace sparse_swa::cli
