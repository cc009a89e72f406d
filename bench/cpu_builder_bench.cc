// Google Benchmark timings, on the batch shapes of ../shared/anchors/vllm_swa_builder.py `bench`
// (W = 128, B = 256, compress ratios {1, 4, 128}, seq_len = uniform(200, 8000) + query_len,
// random page ids in [0, 100000]), of
//   BM_CpuBuild: the CPU reference builder's build();
//   BM_HostPlan: the host work of the CUDA backend's build() before its launch (checks on the
//                host copies, the split, the step's scalars and the prefill host plan).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <stdexcept>
#include <vector>

#include "batch_checks.h"
#include "sparse_swa/metadata_builder.h"
#include "support/test_batch.h"

namespace sparse_swa {
namespace {

struct Shape {
  int32_t num_decodes;
  int32_t num_prefills;
  int32_t prefill_len;
  bool dspark;  // k = 5, non-causal draft rows of query length k + 1
};

BuilderConfig bench_config(bool dspark) {
  BuilderConfig c;
  c.window_size = 128;
  c.block_size = 256;
  c.max_num_batched_tokens = 16384;
  c.max_num_seqs = 1024;
  c.max_model_len = 65536;
  c.compress_ratios = {1, 4, 128};
  if (dspark) {
    c.speculative_method = SpeculativeMethod::kDspark;
    c.num_speculative_tokens = 5;
  }
  return c;
}

testing::TestBatch bench_batch(const Shape& s, std::mt19937_64& rng) {
  const int32_t block = 256;
  std::vector<int32_t> query_lens(s.num_decodes, s.dspark ? 6 : 1);
  query_lens.insert(query_lens.end(), s.num_prefills, s.prefill_len);
  std::uniform_int_distribution<int32_t> context(200, 8000), page(0, 100000);
  std::vector<int32_t> seq_lens;
  for (int32_t q : query_lens) seq_lens.push_back(context(rng) + q);
  const int32_t pages_per_row =
      (*std::max_element(seq_lens.begin(), seq_lens.end()) + block - 1) / block;
  testing::TestBatch batch(block);
  for (size_t r = 0; r < seq_lens.size(); ++r) {
    std::vector<int32_t> pages(pages_per_row);
    for (int32_t& p : pages) p = page(rng);
    batch.add_request(seq_lens[r], query_lens[r], std::move(pages));
  }
  batch.set_causal(!s.dspark);
  return batch;
}

void BM_CpuBuild(benchmark::State& state, Shape shape) {
  std::mt19937_64 rng(7);
  auto builder = MetadataBuilder::create(bench_config(shape.dspark), Backend::kCpu);
  if (!builder.ok()) {
    state.SkipWithError(builder.status().to_string().c_str());
    return;
  }
  const testing::TestBatch batch = bench_batch(shape, rng);
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

BENCHMARK_CAPTURE(BM_CpuBuild, decode_1, Shape{1, 0, 0, false})->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CpuBuild, decode_64, Shape{64, 0, 0, false})->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CpuBuild, decode_256, Shape{256, 0, 0, false})->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CpuBuild, decode_1024, Shape{1024, 0, 0, false})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CpuBuild, dspark_64x6, Shape{64, 0, 0, true})->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CpuBuild, dspark_256x6, Shape{256, 0, 0, true})->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CpuBuild, mixed_32_decodes_4x512, Shape{32, 4, 512, false})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CpuBuild, prefill_8x1024, Shape{0, 8, 1024, false})
    ->Unit(benchmark::kMicrosecond);

void BM_HostPlan(benchmark::State& state, Shape shape) {
  std::mt19937_64 rng(7);
  const BuilderConfig config = bench_config(shape.dspark);
  const DerivedConfig d = derive_config(config);
  const testing::TestBatch batch = bench_batch(shape, rng);
  const BatchInput input = batch.input();
  std::vector<int32_t> seq_lens(config.max_num_seqs), query_lens(config.max_num_seqs);
  for (auto _ : state) {
    detail::StepSplit split;
    const Status st = detail::check_batch(config, d, input, /*arrays_on_host=*/false, &split);
    if (!st.ok()) {
      state.SkipWithError(st.to_string().c_str());
      break;
    }
    SwaMetadata md = detail::step_metadata_scalars(config, d, input, split, MemorySpace::kDevice);
    detail::fill_prefill_host_plan(input, split, seq_lens.data(), query_lens.data());
    benchmark::DoNotOptimize(md);
    benchmark::ClobberMemory();
  }
  state.counters["tokens"] = batch.num_tokens();
}

BENCHMARK_CAPTURE(BM_HostPlan, decode_1, Shape{1, 0, 0, false})->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_HostPlan, decode_1024, Shape{1024, 0, 0, false})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_HostPlan, dspark_256x6, Shape{256, 0, 0, true})->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_HostPlan, mixed_32_decodes_4x512, Shape{32, 4, 512, false})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace sparse_swa

BENCHMARK_MAIN();
