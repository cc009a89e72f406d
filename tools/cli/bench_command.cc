// SPDX-License-Identifier: Apache-2.0
// sparse-swa bench [--backend cpu|cuda] [--iters N] [--json FILE] [--write-batches DIR] [--groups]
// Times build() on the scenarios of the reference script's `bench` (W = 128, block 256) with the
// harness of builder_timing.h: synchronised wall time, host time until build() returns,
// and device time per build from a replayed CUDA graph of back-to-back builds; plus the card's
// copy bandwidth, to put the device time next to the time it takes just to write the output
// bytes. This command parses the options and prints.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "builder_timing.h"
#include "commands.h"
#include "json/batch_json.h"
#include "testing/presets.h"
#include "testing/scenarios.h"

namespace sparse_swa::cli {

namespace {

struct BenchOptions {
  std::string backend = "cpu";
  int iters = 200;
  std::string json_path;
  std::string batches_dir;  // --write-batches: write the scenarios' batch files, time nothing
  bool groups = false;      // --groups: also time build_groups on V4.1's three groups
};

// The batches time_builder() times (same generator, same seed), as `sparse-swa build` files.
Status write_batches(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return invalid_argument("--write-batches ", dir, ": ", ec.message());
  std::mt19937_64 rng(kScenarioSeed);
  for (const testing::BenchScenario& s : testing::bench_scenarios()) {
    const testing::TestBatch batch = testing::bench_batch(s, rng);
    const BatchFile file = batch_file_of(testing::bench_config(s.dspark), batch.input());
    const std::string path =
        (std::filesystem::path(dir) / (testing::scenario_name(s) + ".json")).string();
    std::ofstream out(path);
    out << batch_file_to_json(file).dump() << "\n";
    if (!out) return invalid_argument("--write-batches ", path, ": write failed");
    std::cout << path << "\n";
  }
  return flush_stdout();
}

// 1252864 -> "1.19 MiB".
std::string readable_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.2f %s", value, units[unit]);
  return text;
}

std::string fixed(double value, int digits) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.*f", digits, value);
  return text;
}

// Right-aligned columns, two spaces apart.
void print_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()));
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line +=
          std::string(c == 0 ? 0 : 2, ' ') + std::string(width[c] - row[c].size(), ' ') + row[c];
    }
    out << line << "\n";
  }
}

Status run_bench(const BenchOptions& opts) {
  if (!opts.batches_dir.empty()) return write_batches(opts.batches_dir);
  auto timed = time_builder({backend_named(opts.backend), opts.iters});
  SPARSE_SWA_RETURN_IF_ERROR(timed.status());
  const BuilderTimings& r = timed.value();
  const LaunchFloors& f = r.floors;
  std::cout << "sparse-swa bench: backend " << opts.backend << ", medians of " << opts.iters
            << " builds per scenario, times in microseconds\n";
  if (r.cuda) {
    std::cout << "device copy bandwidth: " << f.copy_bandwidth / 1e9
              << " GB/s (1 GiB D2D, median of 10)\n";
    std::cout << "round-trip floor (enqueue + cudaStreamSynchronize, medians): 4-byte memset "
              << f.memset_us << " us (enqueue " << f.memset_enqueue_us
              << " us); the metadata kernel with no rows " << f.launch_us << " us (enqueue "
              << f.launch_enqueue_us
              << " us); device time of that launch, back to back: " << f.launch_device_us
              << " us\n";
  }
  // The CPU backend's build() returns when the rows are written: one time (build_us). CUDA:
  // wall (build + sync), host (build returning), device (graph replay) and the write floor.
  std::vector<std::vector<std::string>> table;
  if (r.cuda) {
    table.push_back({"scenario", "tokens", "wall_us", "host_us", "update_host_us", "device_us",
                     "output", "write_floor_us"});
  } else {
    table.push_back({"scenario", "tokens", "build_us", "update_us", "output"});
  }
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  for (const ScenarioTiming& t : r.scenarios) {
    const testing::BenchScenario& s = t.scenario;
    const char* method = s.dspark ? "dspark" : "none";
    const std::string update = t.update_host_us > 0 ? fixed(t.update_host_us, 2) : "-";
    if (r.cuda) {
      table.push_back({testing::scenario_name(s), std::to_string(t.tokens), fixed(t.wall_us, 2),
                       fixed(t.host_us, 2), update, fixed(t.device_us, 2),
                       readable_bytes(t.output_bytes), fixed(t.write_floor_us, 2)});
    } else {
      table.push_back({testing::scenario_name(s), std::to_string(t.tokens), fixed(t.wall_us, 2),
                       update, readable_bytes(t.output_bytes)});
    }
    results.push_back({{"decodes", s.decodes},
                       {"prefills", s.prefills},
                       {"prefill_len", s.prefill_len},
                       {"method", method},
                       {"tokens", t.tokens},
                       {"backend", opts.backend},
                       {"build_wall_us_median", t.wall_us},
                       {"build_host_us_median", t.host_us},
                       {"update_draft_host_us_median", t.update_host_us},
                       {"output_bytes", t.output_bytes}});
    if (r.cuda) {
      results.back()["device_us_per_build"] = t.device_us;
      results.back()["write_floor_us"] = t.write_floor_us;
      results.back()["round_trip_floor_us"] = f.memset_us;
      results.back()["enqueue_floor_us"] = f.memset_enqueue_us;
      results.back()["launch_round_trip_floor_us"] = f.launch_us;
      results.back()["launch_enqueue_floor_us"] = f.launch_enqueue_us;
      results.back()["launch_device_floor_us"] = f.launch_device_us;
    }
  }
  print_table(std::cout, table);
  if (opts.groups) {
    auto groups = cli::time_build_groups({backend_named(opts.backend), opts.iters});
    SPARSE_SWA_RETURN_IF_ERROR(groups.status());
    const cli::GroupTiming& g = groups.value();
    std::cout << "build_groups: " << g.groups << " groups (W = 128, 32-token pages, own block "
              << "tables) of " << g.tokens
              << " decode tokens each, against one build() per group\n";
    std::vector<std::vector<std::string>> rows = {
        {"form", "wall_us", "host_us", "device_us"},
        {"build_groups", fixed(g.wall_us, 2), fixed(g.host_us, 2),
         r.cuda ? fixed(g.device_us, 2) : "-"},
        {"separate builds", "-", fixed(g.separate_host_us, 2),
         r.cuda ? fixed(g.separate_device_us, 2) : "-"}};
    print_table(std::cout, rows);
    results.push_back({{"groups", g.groups},
                       {"decodes", cli::kBenchGroupDecodes},
                       {"tokens", g.tokens},
                       {"backend", opts.backend},
                       {"build_groups_wall_us_median", g.wall_us},
                       {"build_groups_host_us_median", g.host_us},
                       {"separate_builds_host_us_median", g.separate_host_us}});
    if (r.cuda) {
      results.back()["build_groups_device_us"] = g.device_us;
      results.back()["separate_builds_device_us"] = g.separate_device_us;
    }
  }
  if (!opts.json_path.empty()) {
    std::ofstream out(opts.json_path);
    out << results.dump(1) << "\n";
    if (!out) return invalid_argument("--json ", opts.json_path, ": write failed");
  }
  return flush_stdout();
}

}  // namespace

void add_bench_command(CLI::App& app, int* exit_code) {
  auto opts = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Time build() on the reference script's bench scenarios (W = 128, block 256)");
  add_backend_option(*cmd, &opts->backend);
  cmd->add_option("--iters", opts->iters, "timed builds per scenario and measure")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--json", opts->json_path, "also write the results as JSON to this file");
  cmd->add_option("--write-batches", opts->batches_dir,
                  "write the scenarios' batches as batch files into this folder (for "
                  "profiling single builds with sparse-swa build) and time nothing");
  cmd->add_flag("--groups", opts->groups,
                "also time MetadataBuilder::build_groups on DeepSeek-V4.1's three KV-cache groups "
                "(64 decode requests) against one build() per group; JSON: one more entry, with "
                "\"groups\"");
  cmd->callback([opts, exit_code] {
    const Status status = run_bench(*opts);
    *exit_code = status.ok() ? kExitOk : report_error(status);
  });
}

}  // namespace sparse_swa::cli
