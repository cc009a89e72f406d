// The sparse-swa subcommands. Each lives in its own file (tools/cli/<name>_command.cc) and
// registers itself with add_<name>_command(app, &exit_code); its callback stores the process
// exit code. A new subcommand adds its declaration here and one call in main.cc.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <utility>

#include "sparse_swa/config.h"
#include "sparse_swa/device_copies.h"
#include "sparse_swa/metadata_builder.h"
#include "sparse_swa/status.h"

namespace sparse_swa::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitInvalidInput = 1;  // bad batch/config, unreadable file, no backend
inline constexpr int kExitUsage = 2;         // command-line errors (CLI11)

void add_build_command(CLI::App& app, int* exit_code);
void add_demo_command(CLI::App& app, int* exit_code);
void add_bench_command(CLI::App& app, int* exit_code);
void add_attend_command(CLI::App& app, int* exit_code);
void add_check_config_command(CLI::App& app, int* exit_code);

// Prints "sparse-swa: error: <message>" to stderr and returns kExitInvalidInput.
int report_error(const Status& status);

// Adds `--backend cpu|cuda` (default: the current value of *backend); any other value is a
// usage error.
void add_backend_option(CLI::App& command, std::string* backend);

// Flushes stdout; a failed write (closed pipe, full disk) is an error.
Status flush_stdout();

// One builder of either backend, driven from host batches: the CUDA backend gets a device copy
// of each batch and its metadata is copied back, so callers always see host metadata.
class StepBuilder {
 public:
  // backend: "cpu" or "cuda". Errors: the config's, or UNAVAILABLE without a CUDA backend.
  static StatusOr<std::unique_ptr<StepBuilder>> create(const BuilderConfig& config,
                                                       const std::string& backend);

  // Builds one step; *host_md is host metadata, valid until the next build().
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

}  // namespace sparse_swa::cli
