// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the subcommands.
#include <iostream>

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

Backend backend_named(const std::string& name) {
  return name == "cuda" ? Backend::kCuda : Backend::kCpu;
}

}  // namespace sparse_swa::cli
