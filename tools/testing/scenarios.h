// SPDX-License-Identifier: Apache-2.0
// The benchmark scenarios, once: the batch shapes of the reference script's bench, timed by
// `sparse-swa bench` (tools/cli/builder_timing.h) and the CPU benchmarks
// (bench/cpu_builder_bench.cc), and written as batch files by `sparse-swa bench --write-batches`.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>

#include "sparse_swa/config.h"
#include "testing/test_batch.h"

namespace sparse_swa::testing {

struct BenchScenario {
  int32_t decodes = 0;
  int32_t prefills = 0;
  int32_t prefill_len = 0;
  bool dspark = false;  // non-causal DSpark draft rows, query length k + 1 (bench_config)
};

// The reference script's scenarios, in its order.
std::span<const BenchScenario> bench_scenarios();
// "decode_64", "dspark_256x6", "mixed_32_decodes_4x512", "prefill_8x1024".
std::string scenario_name(const BenchScenario& s);

// A batch of the scenario for bench_config(s.dspark), drawn as the reference script draws its
// batches: seq_len = uniform(200, 8000) + query_len, page ids uniform in [0, 100000], every
// request's table row as long as the longest.
TestBatch bench_batch(const BenchScenario& s, std::mt19937_64& rng);

}  // namespace sparse_swa::testing
