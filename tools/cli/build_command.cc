// SPDX-License-Identifier: Apache-2.0
// sparse-swa build BATCH.json [MORE.json ...] [--backend cpu|cuda] [--format json|table]
//                  [--consumer NAME [--heads H]]        (--input BATCH.json works too)
// Builds one step's metadata from each batch file; JSON goes to stdout, one line per file, in
// the reference script's format (keys, order and separators), so the two can be diffed as text.
// Several inputs share one process (and one CUDA context); the first invalid file stops the run.
// --consumer NAME (JSON only) appends one key, "consumer", after the reference's keys: the
// consumer-side matrices of the step (json/consumer_json.h). They are built by the CPU consumer
// reference from the host metadata whatever the backend: the CUDA backend's metadata comes back
// to the host (testing/batch_run.h), and the CUDA consumers are checked against the CPU ones in
// tests.
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "json/batch_json.h"
#include "json/consumer_json.h"
#include "metadata_table.h"
#include "sparse_swa/dispatch_policy.h"
#include "testing/batch_run.h"

namespace sparse_swa::cli {

namespace {

struct BuildOptions {
  std::vector<std::string> inputs;
  std::string backend = "cpu";
  std::string format = "json";
  std::string consumer;   // empty: the reference's output only
  DeploymentShape shape;  // for the consumer's dispatch check; heads from --heads
};

Status build_one(const BuildOptions& opts, const std::string& input) {
  auto run = testing::run_batch_file(input, backend_named(opts.backend));
  SPARSE_SWA_RETURN_IF_ERROR(run.status());
  const testing::BatchRun& r = run.value();
  if (opts.format == "table") {
    std::ostringstream table;  // printed only once complete: errors leave stdout empty
    SPARSE_SWA_RETURN_IF_ERROR(
        print_metadata_table(table, r.file, r.builder->derived(), r.md, r.plans));
    std::cout << table.str();
  } else {
    nlohmann::ordered_json json = r.json;
    if (!opts.consumer.empty()) {
      auto consumer =
          consumer_to_json(opts.consumer, r.file.config, r.md, r.file.batch_input(), opts.shape);
      SPARSE_SWA_RETURN_IF_ERROR(consumer.status());
      json["consumer"] = std::move(consumer).value();
    }
    std::cout << dump_python_style(json) << "\n";
  }
  return flush_stdout();
}

Status run_build(const BuildOptions& opts) {
  for (const std::string& input : opts.inputs) SPARSE_SWA_RETURN_IF_ERROR(build_one(opts, input));
  return Status::Ok();
}

}  // namespace

void add_build_command(CLI::App& app, int* exit_code) {
  auto opts = std::make_shared<BuildOptions>();
  CLI::App* cmd = app.add_subcommand(
      "build", "Build one step's SWA metadata from a JSON batch file and print it");
  // FILE... and --input FILE fill one list, in command-line order (check-config takes its file
  // positionally too).
  cmd->add_option("FILE,--input,-i", opts->inputs,
                  "batch file: {config, batch, chunk_plan_requests}; - reads stdin; several "
                  "files (positional or repeated --input) print one output line each");
  add_backend_option(*cmd, &opts->backend);
  cmd->add_option("--format", opts->format,
                  "json: the reference's one-line JSON; table: for people")
      ->check(CLI::IsMember({"json", "table"}))
      ->capture_default_str();
  CLI::Option* consumer =
      cmd->add_option("--consumer", opts->consumer,
                      "also print the consumer-side matrices (mixed, ragged, combined prefill; "
                      "SWA-only layer) and the dispatch check of this kernel family, under the "
                      "key \"consumer\" (json format only)")
          ->check(CLI::IsMember(builtin_policy_names()));
  cmd->add_option("--heads", opts->shape.heads,
                  "query heads per rank for the consumer's dispatch check")
      ->check(CLI::PositiveNumber)
      ->needs(consumer)
      ->capture_default_str();
  cmd->callback([opts, exit_code] {
    if (opts->inputs.empty()) {
      throw CLI::RequiredError("a batch file (sparse-swa build FILE, or --input FILE)");
    }
    if (!opts->consumer.empty() && opts->format != "json") {
      throw CLI::ValidationError("--consumer", "needs --format json, got --format " + opts->format);
    }
    const Status status = run_build(*opts);
    *exit_code = status.ok() ? kExitOk : report_error(status);
  });
}

}  // namespace sparse_swa::cli
