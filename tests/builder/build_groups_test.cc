// SPDX-License-Identifier: Apache-2.0
// MetadataBuilder::build_groups on the CPU backend (docs/design.md#one-build-for-several-groups):
// each group's metadata equals its own build(), bit for bit, on random steps of every mode whose
// groups differ in window, block size and pages; errors name the group and write nothing.
#include <gtest/gtest.h>

#include <array>
#include <memory>
#include <vector>

#include "sparse_swa/metadata_builder.h"
#include "support/metadata_snapshot.h"
#include "support/status_matchers.h"
#include "testing/presets.h"
#include "testing/random_batch.h"
#include "testing/test_batch.h"

namespace sparse_swa {
namespace {

using testing::cpu_builder;
using testing::first_difference;
using testing::IsInvalidArgument;
using testing::lens_of;
using testing::RandomBatch;
using testing::RandomCase;
using testing::snapshot;
using testing::TestBatch;
using Row = std::vector<int32_t>;

std::vector<MetadataBuilder*> raw(const std::vector<std::unique_ptr<MetadataBuilder>>& owned) {
  std::vector<MetadataBuilder*> out;
  for (const auto& b : owned) out.push_back(b.get());
  return out;
}

TEST(BuildGroups, RandomGroupsEqualTheirOwnBuilds) {
  RandomBatch gen(20261208, testing::builder_test_options());
  int groups_built = 0;
  for (int i = 0; i < 400; ++i) {
    std::vector<RandomCase> cases = {gen.next()};
    const int n = gen.uniform(1, 4);
    while (static_cast<int>(cases.size()) < n) cases.push_back(gen.other_group(cases[0]));
    std::vector<std::unique_ptr<MetadataBuilder>> grouped, alone;
    std::vector<BatchInput> batches;
    for (const RandomCase& c : cases) {
      SCOPED_TRACE(c.describe());
      grouped.push_back(cpu_builder(c.config));
      alone.push_back(cpu_builder(c.config));
      batches.push_back(c.batch.input());
    }
    std::vector<SwaMetadata> out(n), want(n);
    const std::vector<MetadataBuilder*> builders = raw(grouped);
    const Status st = MetadataBuilder::build_groups(builders, batches, out);
    ASSERT_TRUE(st.ok()) << st.to_string() << "\n" << cases[0].describe();
    for (int g = 0; g < n; ++g) {
      SPARSE_SWA_ASSERT_OK(alone[g]->build(batches[g], &want[g]));
      ASSERT_EQ(first_difference(snapshot(out[g]), snapshot(want[g])), "")
          << "case " << i << " group " << g << ": " << cases[g].describe();
    }
    // Each group's builder keeps its own last build: its draft update works as after build().
    for (int g = 0; g < n; ++g) {
      SPARSE_SWA_ASSERT_OK(grouped[g]->update_draft_decode_rows(batches[g], &out[g]));
      SPARSE_SWA_ASSERT_OK(alone[g]->update_draft_decode_rows(batches[g], &want[g]));
      ASSERT_EQ(first_difference(snapshot(out[g]), snapshot(want[g])), "") << "group " << g;
    }
    groups_built += n;
  }
  EXPECT_GT(groups_built, 800);
}

// Two groups of one decode request at position 10: W = 8 on 4-token pages, W = 4 on 2-token
// pages (slot(r, p) = page[p / B] * B + p % B).
TEST(BuildGroups, TwoWindowsAndBlockSizesHandComputed) {
  BuilderConfig a = testing::small_config(8, 4), b = testing::small_config(4, 2);
  auto ga = cpu_builder(a), gb = cpu_builder(b);
  TestBatch ta(4), tb(2);
  ta.add_request(11, 1, {7, 3, 9});
  tb.add_request(11, 1, {1, 2, 3, 8, 6, 5});
  const std::array<MetadataBuilder*, 2> builders = {ga.get(), gb.get()};
  const std::array<BatchInput, 2> batches = {ta.input(), tb.input()};
  std::array<SwaMetadata, 2> out;
  SPARSE_SWA_ASSERT_OK(MetadataBuilder::build_groups(builders, batches, out));
  EXPECT_EQ(testing::row_of(out[0].decode_swa, 0), (Row{31, 12, 13, 14, 15, 36, 37, 38}));
  EXPECT_EQ(testing::row_of(out[1].decode_swa, 0), (Row{17, 12, 13, 10}));  // positions 7..10
  EXPECT_EQ(lens_of(out[1].decode_swa), (Row{4}));
}

class BuildGroupsErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    RandomBatch gen(77);
    cases_ = {gen.next(testing::BatchMode::kMixed)};
    cases_.push_back(gen.other_group(cases_[0]));
    for (const RandomCase& c : cases_) {
      owned_.push_back(cpu_builder(c.config));
      batches_.push_back(c.batch.input());
    }
    builders_ = raw(owned_);
    out_.resize(2);
    SPARSE_SWA_ASSERT_OK(MetadataBuilder::build_groups(builders_, batches_, out_));
    for (const SwaMetadata& md : out_) before_.push_back(snapshot(md));
  }

  void expect_nothing_written() {
    for (size_t g = 0; g < out_.size(); ++g) {
      EXPECT_EQ(first_difference(snapshot(out_[g]), before_[g]), "") << "group " << g;
    }
  }

  std::vector<RandomCase> cases_;
  std::vector<std::unique_ptr<MetadataBuilder>> owned_;
  std::vector<MetadataBuilder*> builders_;
  std::vector<BatchInput> batches_;
  std::vector<SwaMetadata> out_;
  std::vector<testing::MetadataSnapshot> before_;
};

TEST_F(BuildGroupsErrors, CountsNullAndRepeatedBuilders) {
  std::vector<SwaMetadata> out(2);
  EXPECT_TRUE(IsInvalidArgument(MetadataBuilder::build_groups({}, {}, {}),
                                {"builders: expected 1..8 builders, got 0"}));
  std::vector<MetadataBuilder*> nine(9, builders_[0]);
  std::vector<BatchInput> nine_batches(9, batches_[0]);
  std::vector<SwaMetadata> nine_out(9);
  EXPECT_TRUE(
      IsInvalidArgument(MetadataBuilder::build_groups(nine, nine_batches, nine_out), {"got 9"}));
  EXPECT_TRUE(
      IsInvalidArgument(MetadataBuilder::build_groups(builders_, {batches_.data(), 1}, out),
                        {"batches: expected one batch and one output per builder (2)", "got 1"}));
  std::vector<MetadataBuilder*> with_null = {builders_[0], nullptr};
  EXPECT_TRUE(IsInvalidArgument(MetadataBuilder::build_groups(with_null, batches_, out),
                                {"builders[1]: got null"}));
  std::vector<MetadataBuilder*> twice = {builders_[0], builders_[0]};
  std::vector<BatchInput> same = {batches_[0], batches_[0]};
  EXPECT_TRUE(
      IsInvalidArgument(MetadataBuilder::build_groups(twice, same, out),
                        {"builders[1]: expected distinct builders, got builders[0] again"}));
  expect_nothing_written();
}

TEST_F(BuildGroupsErrors, AFailingGroupWritesNoGroup) {
  // Group 0 gets other pages (its rows would change if written); group 1's batch names a freed
  // page inside a window. Every group is checked before any is written: nothing changes.
  TestBatch other0 = cases_[0].batch;
  for (auto& pages : other0.pages)
    for (int32_t& p : pages) p = (p + 1) % 1000;
  TestBatch bad = cases_[1].batch;
  int32_t victim = -1;
  for (int32_t t = 0; t < bad.query_start_loc.back() && victim < 0; ++t)
    if (bad.slot_mapping[t] >= 0) victim = t;
  ASSERT_GE(victim, 0);
  int32_t r = 0;
  while (bad.query_start_loc[r + 1] <= victim) ++r;
  const int32_t pos = bad.prefix_len(r) + (victim - bad.query_start_loc[r]);
  bad.pages[r][pos / bad.block_size()] = -1;
  const std::vector<BatchInput> batches = {other0.input(), bad.input()};
  std::vector<SwaMetadata> out(2);
  const Status st = MetadataBuilder::build_groups(builders_, batches, out);
  EXPECT_TRUE(IsInvalidArgument(st, {"batches[1]: batch.block_table[", "got -1"}))
      << st.to_string();
  expect_nothing_written();
  // Alone, group 0's batch builds (and changes its rows).
  SPARSE_SWA_ASSERT_OK(builders_[0]->build(batches[0], &out[0]));
}

TEST_F(BuildGroupsErrors, ABatchOverlappingAnotherGroupsOutputs) {
  // Group 1's seq_lens aliasing group 0's decode lens: the launch would overwrite what it reads.
  BatchInput in = batches_[1];
  in.seq_lens = {out_[0].decode_swa.lens, batches_[1].seq_lens.size()};
  const std::vector<BatchInput> batches = {batches_[0], in};
  std::vector<SwaMetadata> out(2);
  EXPECT_TRUE(IsInvalidArgument(
      MetadataBuilder::build_groups(builders_, batches, out),
      {"batches[1] against builders[0]: batch.seq_lens", "overlapping its decode_swa.lens"}));
  expect_nothing_written();
}

TEST_F(BuildGroupsErrors, AnInvalidBatchIsNamedByItsGroup) {
  TestBatch bad = cases_[1].batch;
  bad.query_start_loc[0] = 1;
  const std::vector<BatchInput> batches = {batches_[0], bad.input()};
  std::vector<SwaMetadata> out(2);
  EXPECT_TRUE(IsInvalidArgument(MetadataBuilder::build_groups(builders_, batches, out),
                                {"batches[1]: batch.query_start_loc[0]: expected 0, got 1"}));
  expect_nothing_written();
}

}  // namespace
}  // namespace sparse_swa
