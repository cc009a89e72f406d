// SPDX-License-Identifier: Apache-2.0
// sparse-swa: DeepSeek-V4 sparse sliding-window attention metadata from the command line.
//   sparse-swa build BATCH.json [...] [--backend cpu|cuda] [--format json|table]
//                    [--consumer NAME [--heads H]]           (or --input BATCH.json)
//   sparse-swa demo [--backend cpu|cuda]
//   sparse-swa bench [--backend cpu|cuda] [--iters N] [--json FILE]
//   sparse-swa attend [--backend cpu|cuda] [--heads H] ...   (sparse MLA attention vs reference)
//   sparse-swa check-config --consumer NAME CONFIG.json      (dispatch-width policy check)
//   sparse-swa --version
// Exit codes: 0 success, 1 invalid input (message on stderr), 2 usage error.
#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>
#include <new>
#include <string>

#include "commands.h"
#include "sparse_swa/version.h"

namespace {

// A first argument that is neither an option nor a command: CLI11 would only say that a
// subcommand is required.
bool reject_unknown_command(const CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return false;
  std::string names;
  for (const CLI::App* command : app.get_subcommands({})) {
    if (command->get_name() == argv[1]) return false;
    names += (names.empty() ? "" : ", ") + command->get_name();
  }
  std::cerr << "sparse-swa: usage error: unknown command '"
            << sparse_swa::printable_excerpt(argv[1]) << "' (expected one of " << names
            << ")\nRun 'sparse-swa --help' for more information.\n";
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  namespace cli = sparse_swa::cli;
  CLI::App app{
      "sparse-swa: per-step sparse sliding-window attention (SWA) metadata over a paged KV "
      "cache, as vLLM's DeepSeek-V4 builder computes it."};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("sparse-swa ") + SPARSE_SWA_VERSION_STRING,
                       "Print the version and exit");
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return std::string("sparse-swa: usage error: ") + e.what() +
           "\nRun 'sparse-swa --help' (or 'sparse-swa <command> --help') for more information.\n";
  });
  int exit_code = cli::kExitOk;
  cli::add_build_command(app, &exit_code);
  cli::add_demo_command(app, &exit_code);
  cli::add_bench_command(app, &exit_code);
  cli::add_attend_command(app, &exit_code);
  cli::add_check_config_command(app, &exit_code);
  if (reject_unknown_command(app, argc, argv)) return cli::kExitUsage;
  try {
    app.parse(argc, argv);  // runs the chosen subcommand's callback
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints the help text or the usage error
    return code == 0 ? cli::kExitOk : cli::kExitUsage;
  } catch (const std::bad_alloc&) {
    std::cerr << "sparse-swa: error: out of memory\n";
    return cli::kExitInvalidInput;
  } catch (const std::exception& e) {
    std::cerr << "sparse-swa: error: " << e.what() << "\n";
    return cli::kExitInvalidInput;
  }
  return exit_code;
}
