// SPDX-License-Identifier: Apache-2.0
// The decode/prefill split of the host copies (batch_checks.h), including the decode query length
// the CUDA kernel takes as a hint, against its definition on hand-made and random batches.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "batch_checks.h"
#include "testing/test_batch.h"

namespace sparse_swa::detail {
namespace {

std::vector<int32_t> starts_of(const std::vector<int32_t>& query_lens) {
  std::vector<int32_t> qsl{0};
  for (int32_t q : query_lens) qsl.push_back(qsl.back() + q);
  return qsl;
}

// The definition: decodes are the requests before the first with query_len > theta.
StepSplit split_by_definition(const std::vector<int32_t>& query_lens, int32_t num_tokens,
                              int32_t theta) {
  StepSplit s;
  const auto qsl = starts_of(query_lens);
  const int32_t n = static_cast<int32_t>(query_lens.size());
  int32_t d = 0;
  while (d < n && query_lens[d] <= theta) ++d;
  s.num_decodes = d;
  s.num_prefills = n - d;
  s.num_decode_tokens = d == n ? num_tokens : qsl[d];
  s.num_prefill_tokens = num_tokens - s.num_decode_tokens;
  for (int32_t q : query_lens) s.max_query_len = std::max(s.max_query_len, q);
  const bool uniform = d > 0 && std::all_of(query_lens.begin(), query_lens.begin() + d,
                                            [&](int32_t q) { return q == query_lens[0]; });
  s.decode_query_len = uniform ? query_lens[0] : 0;
  return s;
}

void expect_split(const StepSplit& got, const StepSplit& want) {
  EXPECT_EQ(got.num_decodes, want.num_decodes);
  EXPECT_EQ(got.num_prefills, want.num_prefills);
  EXPECT_EQ(got.num_decode_tokens, want.num_decode_tokens);
  EXPECT_EQ(got.num_prefill_tokens, want.num_prefill_tokens);
  EXPECT_EQ(got.max_query_len, want.max_query_len);
  EXPECT_EQ(got.decode_query_len, want.decode_query_len);
}

TEST(BatchSplit, HandComputed) {
  // DSpark drafts of 6 tokens, then a 512-token prefill; 4 trailing padding tokens.
  const auto a = starts_of({6, 6, 6, 512});
  const StepSplit s = split_decodes_and_prefills(a, 534, /*theta=*/6);
  EXPECT_EQ(s.num_decodes, 3);
  EXPECT_EQ(s.num_prefills, 1);
  EXPECT_EQ(s.num_decode_tokens, 18);
  EXPECT_EQ(s.num_prefill_tokens, 516);
  EXPECT_EQ(s.max_query_len, 512);
  EXPECT_EQ(s.decode_query_len, 6);
  // MTP decodes of different lengths: no shared query length.
  EXPECT_EQ(split_decodes_and_prefills(starts_of({1, 3, 2}), 6, 3).decode_query_len, 0);
  // Padding tokens of a decode-only step count as decode tokens.
  const StepSplit padded = split_decodes_and_prefills(starts_of({1, 1}), 8, 1);
  EXPECT_EQ(padded.num_decode_tokens, 8);
  EXPECT_EQ(padded.decode_query_len, 1);
  // Prefill first: no decodes, so no decode query length.
  const StepSplit prefill = split_decodes_and_prefills(starts_of({9, 1}), 10, 1);
  EXPECT_EQ(prefill.num_decodes, 0);
  EXPECT_EQ(prefill.decode_query_len, 0);
  EXPECT_EQ(split_decodes_and_prefills(starts_of({}), 4, 1).num_decode_tokens, 4);
}

TEST(BatchSplit, MatchesTheDefinitionOnRandomBatches) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    const int32_t theta = std::uniform_int_distribution<int32_t>(1, 8)(rng);
    const int32_t n = std::uniform_int_distribution<int32_t>(0, 40)(rng);
    const bool uniform = rng() % 2 == 0;
    const int32_t q0 = std::uniform_int_distribution<int32_t>(0, theta)(rng);
    std::vector<int32_t> query_lens;
    for (int32_t r = 0; r < n; ++r) {
      const bool prefill = rng() % 8 == 0;
      query_lens.push_back(prefill   ? std::uniform_int_distribution<int32_t>(theta + 1, 64)(rng)
                           : uniform ? q0
                                     : std::uniform_int_distribution<int32_t>(0, theta)(rng));
    }
    const auto qsl = starts_of(query_lens);
    const int32_t num_tokens = qsl.back() + std::uniform_int_distribution<int32_t>(0, 5)(rng);
    SCOPED_TRACE(::testing::Message() << "trial " << trial);
    expect_split(split_decodes_and_prefills(qsl, num_tokens, theta),
                 split_by_definition(query_lens, num_tokens, theta));
  }
}

// The builders take the split from check_batch's own pass over the requests: it must equal the
// split of the host copies.
TEST(BatchSplit, CheckBatchGivesTheSameSplit) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 500; ++trial) {
    BuilderConfig c;
    c.window_size = 8;
    c.block_size = 4;
    c.max_num_batched_tokens = 4096;
    c.max_num_seqs = 64;
    c.max_model_len = 512;
    c.num_speculative_tokens = std::uniform_int_distribution<int32_t>(0, 4)(rng);
    c.speculative_method =
        c.num_speculative_tokens > 0 ? SpeculativeMethod::kMtp : SpeculativeMethod::kNone;
    const DerivedConfig d = derive_config(c);
    testing::TestBatch batch(c.block_size);
    const int32_t n = std::uniform_int_distribution<int32_t>(0, 40)(rng);
    const bool shared = rng() % 2 == 0;
    for (int32_t r = 0; r < n; ++r) {
      const int32_t q = rng() % 6 == 0 ? std::uniform_int_distribution<int32_t>(1, 40)(rng)
                        : shared       ? d.decode_threshold
                                       : std::uniform_int_distribution<int32_t>(0, 3)(rng);
      batch.add_identity_request(q + std::uniform_int_distribution<int32_t>(0, 50)(rng), q);
    }
    batch.pad_tokens(std::uniform_int_distribution<int32_t>(0, 3)(rng));
    const BatchInput input = batch.input();
    StepSplit split;
    ASSERT_TRUE(check_batch(c, d, input, /*arrays_on_host=*/true, &split).ok());
    SCOPED_TRACE(::testing::Message() << "trial " << trial);
    expect_split(split, split_decodes_and_prefills(input.query_start_loc, input.num_tokens(),
                                                   d.decode_threshold));
  }
}

TEST(BatchChecks, BlockTableWithColumnsPastInt32DoesNotOverflowTheCoverage) {
  // cols * block_size wrapped to a negative coverage (and signed overflow) before.
  BuilderConfig c;
  c.window_size = 8;
  c.block_size = 4;
  c.max_num_batched_tokens = 16;
  c.max_num_seqs = 4;
  c.max_model_len = 64;
  const DerivedConfig d = derive_config(c);
  const std::vector<int32_t> qsl = {0, 1}, seq = {5}, pages = {3, 4};
  const std::vector<int64_t> slots = {16};
  BatchInput in;
  in.query_start_loc = qsl;
  in.seq_lens = seq;
  const int64_t cols = INT64_MAX / 2;  // one row: only its first entries are read
  in.block_table = {pages.data(), 1, cols, cols, MemorySpace::kHost};
  in.slot_mapping = slots;
  StepSplit split;
  const Status st = check_batch(c, d, in, /*arrays_on_host=*/true, &split);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(split.num_decode_tokens, 1);
}

}  // namespace
}  // namespace sparse_swa::detail
