// SPDX-License-Identifier: Apache-2.0
// sparse-swa check-config --consumer NAME CONFIG.json [--heads H] [--attn-block-size N]
//                         [--indexer-topk K]
// Lists every dispatch tuple (heads, topk, page block, extra topk, extra page block) the config
// can make the consumer's kernels see, each accepted or rejected; exit 1 naming the first
// rejected tuple, so a deployment no kernel can serve fails before it starts.
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "json/batch_json.h"
#include "sparse_swa/dispatch_policy.h"

namespace sparse_swa::cli {

namespace {

struct CheckConfigOptions {
  std::string consumer;
  std::string config_path;
  DeploymentShape shape;
};

// The file's "config" object, type-checked by the batch-file parser: a file without a "batch"
// gets an empty one (no requests), since only the config matters here.
StatusOr<BuilderConfig> read_config(const std::string& path) {
  auto text = read_json_text(path);  // the batch-file reader's size and depth limits
  SPARSE_SWA_RETURN_IF_ERROR(text.status());
  auto parsed = parse_json_text(text.value(), path);
  SPARSE_SWA_RETURN_IF_ERROR(parsed.status());
  nlohmann::json doc = std::move(parsed).value();
  if (!doc.is_object() || !doc.contains("config")) {
    return invalid_argument(path, ": expected a JSON object with a \"config\" object");
  }
  if (!doc.contains("batch")) {
    doc["batch"] = {{"query_start_loc", {0}},
                    {"seq_lens", nlohmann::json::array()},
                    {"block_table", nlohmann::json::array()},
                    {"slot_mapping", nlohmann::json::array()},
                    {"causal", true}};
  }
  auto file = parse_batch_file(doc.dump());
  if (!file.ok()) return invalid_argument(path, ": ", file.status().message());
  return file.value().config;
}

Status run_check_config(const CheckConfigOptions& opts) {
  auto policy = builtin_policy(opts.consumer);
  SPARSE_SWA_RETURN_IF_ERROR(policy.status());
  auto config = read_config(opts.config_path);
  SPARSE_SWA_RETURN_IF_ERROR(config.status());
  auto tuples = enumerate_dispatch_tuples(config.value(), policy.value(), opts.shape);
  SPARSE_SWA_RETURN_IF_ERROR(tuples.status());
  std::ostringstream out;  // printed whole, after every check ran
  out << "consumer " << policy.value().name << " (" << index_layout_name(policy.value().layout)
      << " layout): " << policy.value().describe() << "\n";
  for (const TupleCheck& t : tuples.value()) {
    out << (t.accepted ? "accepted  " : "rejected  ") << t.source << ": " << to_string(t.tuple)
        << "\n";
  }
  std::cout << out.str();
  SPARSE_SWA_RETURN_IF_ERROR(flush_stdout());
  return validate_config(config.value(), policy.value(), opts.shape);
}

}  // namespace

void add_check_config_command(CLI::App& app, int* exit_code) {
  auto opts = std::make_shared<CheckConfigOptions>();
  CLI::App* cmd = app.add_subcommand(
      "check-config",
      "List every dispatch tuple a config produces for a consumer kernel, accepted or rejected");
  cmd->add_option("--consumer", opts->consumer, "the consumer kernel family")
      ->required()
      ->check(CLI::IsMember(builtin_policy_names()));
  cmd->add_option("config", opts->config_path,
                  "JSON file with a \"config\" object (a batch file works); - reads stdin")
      ->required();
  cmd->add_option("--heads", opts->shape.heads, "query heads per rank, as the kernel runs them")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--attn-block-size", opts->shape.attn_block_size,
                  "main-model KV block size; compressed page = this / compress ratio")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--indexer-topk", opts->shape.indexer_topk,
                  "C2A/C4A indexer top-k width (extra_topk)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->callback([opts, exit_code] {
    const Status status = run_check_config(*opts);
    *exit_code = status.ok() ? kExitOk : report_error(status);
  });
}

}  // namespace sparse_swa::cli
