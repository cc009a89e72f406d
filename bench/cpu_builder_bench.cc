// SPDX-License-Identifier: Apache-2.0
// Google Benchmark timings, on the bench scenarios of testing/scenarios.h (the batch shapes of
// the reference script's bench: W = 128, B = 256, compress ratios {1, 4, 128}, seq_len =
// uniform(200, 8000) + query_len, random page ids in [0, 100000]), of
//   BM_CpuBuild: the CPU reference builder's build() (the CUDA backend's host time is in
//                `sparse-swa bench --backend cuda`).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "sparse_swa/metadata_builder.h"
#include "testing/presets.h"
#include "testing/scenarios.h"
#include "testing/test_batch.h"

namespace sparse_swa {
namespace {

void BM_CpuBuild(benchmark::State& state, testing::BenchScenario shape) {
  std::mt19937_64 rng(7);
  auto builder = MetadataBuilder::create(testing::bench_config(shape.dspark), Backend::kCpu);
  if (!builder.ok()) {
    state.SkipWithError(builder.status().to_string().c_str());
    return;
  }
  const testing::TestBatch batch = testing::bench_batch(shape, rng);
  const BatchInput input = batch.input();
  SwaMetadata md;
  for (auto _ : state) {
    const Status st = builder.value()->build(input, &md);
    if (!st.ok()) {
      state.SkipWithError(st.to_string().c_str());
      break;
    }
    benchmark::DoNotOptimize(md.decode_swa.lens);
    benchmark::ClobberMemory();
  }
  state.counters["tokens"] = batch.num_tokens();
  state.SetItemsProcessed(state.iterations() * batch.num_tokens());
}

}  // namespace
}  // namespace sparse_swa

int main(int argc, char** argv) {
  using sparse_swa::testing::BenchScenario;
  for (const BenchScenario& s : sparse_swa::testing::bench_scenarios()) {
    const std::string name = sparse_swa::testing::scenario_name(s);
    benchmark::RegisterBenchmark(("BM_CpuBuild/" + name).c_str(), sparse_swa::BM_CpuBuild, s)
        ->Unit(benchmark::kMicrosecond);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
