// SPDX-License-Identifier: Apache-2.0
#include "testing/scenarios.h"

#include <algorithm>
#include <vector>

#include "testing/presets.h"

namespace sparse_swa::testing {

std::span<const BenchScenario> bench_scenarios() {
  static constexpr BenchScenario kScenarios[] = {
      {1, 0, 0, false}, {64, 0, 0, false}, {256, 0, 0, false},  {1024, 0, 0, false},
      {64, 0, 0, true}, {256, 0, 0, true}, {32, 4, 512, false}, {0, 8, 1024, false}};
  return kScenarios;
}

std::string scenario_name(const BenchScenario& s) {
  const std::string decode_len = s.dspark ? "x" + std::to_string(kBenchDsparkTokens + 1) : "";
  if (s.prefills == 0) {
    return (s.dspark ? "dspark_" : "decode_") + std::to_string(s.decodes) + decode_len;
  }
  const std::string prefills = std::to_string(s.prefills) + "x" + std::to_string(s.prefill_len);
  if (s.decodes == 0) return "prefill_" + prefills;
  return "mixed_" + std::to_string(s.decodes) + "_decodes_" + prefills;
}

TestBatch bench_batch(const BenchScenario& s, std::mt19937_64& rng) {
  const int32_t block = bench_config(s.dspark).block_size;
  std::vector<int32_t> query_lens(s.decodes, s.dspark ? kBenchDsparkTokens + 1 : 1);
  query_lens.insert(query_lens.end(), s.prefills, s.prefill_len);
  std::uniform_int_distribution<int32_t> context(200, 8000), page(0, 100000);
  std::vector<int32_t> seq_lens;
  for (int32_t q : query_lens) seq_lens.push_back(context(rng) + q);
  const int32_t pages_per_row =
      (*std::max_element(seq_lens.begin(), seq_lens.end()) + block - 1) / block;
  TestBatch batch(block);
  for (size_t r = 0; r < seq_lens.size(); ++r) {
    std::vector<int32_t> pages(pages_per_row);
    for (int32_t& p : pages) p = page(rng);
    batch.add_request(seq_lens[r], query_lens[r], std::move(pages));
  }
  batch.set_causal(!s.dspark);
  return batch;
}

}  // namespace sparse_swa::testing
