// SPDX-License-Identifier: Apache-2.0
// The timing harness of `sparse-swa bench`: MetadataBuilder::build() on the bench scenarios
// (testing/scenarios.h), with the floors of any synchronised GPU step beside it. The CLI parses
// the options and prints what this returns.
#pragma once

#include <cstdint>
#include <vector>

#include "sparse_swa/metadata_builder.h"
#include "sparse_swa/status.h"
#include "testing/scenarios.h"

namespace sparse_swa::cli {

// The seed of the scenarios' batches (testing::bench_batch, in bench_scenarios() order).
inline constexpr uint64_t kScenarioSeed = 7;

struct BuilderTimingOptions {
  Backend backend = Backend::kCpu;
  int iters = 200;  // timed builds per scenario and measure
};

// CUDA only: what any synchronised step costs at least (medians of 500).
struct LaunchFloors {
  double copy_bandwidth = 0;  // device-to-device bytes/s (1 GiB copies, median of 10)
  double memset_us = 0, memset_enqueue_us = 0;  // a 4-byte cudaMemsetAsync + sync, its enqueue
  double launch_us = 0, launch_enqueue_us = 0;  // the metadata kernel with no rows + sync
  double launch_device_us = 0;  // the same, per launch of a replayed graph of back-to-back ones
};

// Medians per build.
struct ScenarioTiming {
  testing::BenchScenario scenario;
  int32_t tokens = 0;
  double wall_us = 0;         // build() + stream sync
  double host_us = 0;         // build() returning, no sync (CPU: wall_us, build() is synchronous)
  double update_host_us = 0;  // update_draft_decode_rows() returning (0 without decodes)
  double device_us = 0;       // CUDA: a replayed graph of back-to-back builds, per build
  int64_t output_bytes = 0;   // what one build writes
  double write_floor_us = 0;  // CUDA: output_bytes at the copy bandwidth
};

struct BuilderTimings {
  bool cuda = false;
  LaunchFloors floors;  // cuda only
  std::vector<ScenarioTiming> scenarios;
};

// UNAVAILABLE for the CUDA backend without a CUDA build or device.
StatusOr<BuilderTimings> time_builder(const BuilderTimingOptions& options);

// MetadataBuilder::build_groups against one build() per group, on DeepSeek-V4.1's step shape:
// kBenchGroups KV-cache groups of W = 128 on 32-token pages, each with its own block table and
// slots, and 64 decode requests of one token (medians per step).
inline constexpr int kBenchGroups = 3;
inline constexpr int kBenchGroupDecodes = 64;
struct GroupTiming {
  int32_t groups = kBenchGroups;
  int32_t tokens = 0;             // per group
  double wall_us = 0;             // build_groups() + stream sync
  double host_us = 0;             // build_groups() returning (CPU: wall_us)
  double device_us = 0;           // CUDA: a replayed graph of back-to-back build_groups()
  double separate_host_us = 0;    // one build() per group, returning (CPU: synchronous)
  double separate_device_us = 0;  // CUDA: the same in a replayed graph
};
StatusOr<GroupTiming> time_build_groups(const BuilderTimingOptions& options);

}  // namespace sparse_swa::cli
