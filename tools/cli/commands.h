// SPDX-License-Identifier: Apache-2.0
// The sparse-swa subcommands. Each lives in its own file (tools/cli/<name>_command.cc) and
// registers itself with add_<name>_command(app, &exit_code); its callback stores the process
// exit code. A new subcommand adds its declaration here and one call in main.cc.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

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

// "cuda" -> Backend::kCuda, anything else (the option allows only "cpu") -> Backend::kCpu.
Backend backend_named(const std::string& name);

}  // namespace sparse_swa::cli
