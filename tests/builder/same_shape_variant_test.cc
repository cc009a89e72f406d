// SPDX-License-Identifier: Apache-2.0
// RandomBatch::same_shape_variant(), the in-place updates of the soak's graph replays
// (tests/soak/): every variant of a batch of every mode is valid for the same builder and gives
// a step of the same shape (the split, the counts, the widths, the host spans), so a graph
// captured on the base batch may replay it; and the contents do change.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>

#include "sparse_swa/metadata_builder.h"
#include "support/metadata_snapshot.h"
#include "testing/random_batch.h"

namespace sparse_swa {
namespace {

using testing::BatchMode;
using testing::RandomBatch;
using testing::RandomCase;
using testing::TestBatch;

constexpr int32_t kGrowth = 70;

TEST(SameShapeVariant, KeepsTheShapeAndBuilds) {
  RandomBatch gen(4242, testing::builder_test_options());
  int changed_rows = 0, compared = 0;
  for (int i = 0; i < 400; ++i) {
    RandomCase c = gen.next(static_cast<BatchMode>(i % testing::kNumBatchModes));
    testing::reserve_growth(&c, kGrowth);
    SCOPED_TRACE(c.describe());
    auto builder = MetadataBuilder::create(c.config, Backend::kCpu);
    ASSERT_TRUE(builder.ok()) << builder.status().to_string();
    SwaMetadata base_md;
    ASSERT_TRUE((*builder)->build(c.batch.input(), &base_md).ok());
    const testing::MetadataSnapshot base = testing::snapshot(base_md);
    for (int v = 0; v < 4; ++v) {
      const TestBatch variant = gen.same_shape_variant(c.batch, kGrowth);
      SCOPED_TRACE(variant.describe());
      ASSERT_EQ(variant.query_start_loc, c.batch.query_start_loc);
      ASSERT_EQ(variant.num_tokens(), c.batch.num_tokens());
      ASSERT_EQ(variant.block_table_cols(), c.batch.block_table_cols());
      ASSERT_EQ(variant.causal, c.batch.causal);
      ASSERT_EQ(variant.image_spans.size(), c.batch.image_spans.size());
      for (int32_t r = 0; r < c.batch.num_reqs(); ++r) {
        const int32_t seq = c.batch.seq_lens[r];
        ASSERT_GE(variant.seq_lens[r], seq);
        ASSERT_LE(variant.seq_lens[r], seq == 0 ? 0 : seq + kGrowth);
      }
      for (int32_t t = c.batch.query_start_loc.back(); t < c.batch.num_tokens(); ++t) {
        ASSERT_EQ(variant.slot_mapping[t], -1) << "padding token " << t;
      }
      SwaMetadata md;
      const Status st = (*builder)->build(variant.input(), &md);
      ASSERT_TRUE(st.ok()) << st.to_string();
      EXPECT_EQ(md.num_reqs, base_md.num_reqs);
      EXPECT_EQ(md.num_tokens, base_md.num_tokens);
      EXPECT_EQ(md.num_decodes, base_md.num_decodes);
      EXPECT_EQ(md.num_prefills, base_md.num_prefills);
      EXPECT_EQ(md.num_decode_tokens, base_md.num_decode_tokens);
      EXPECT_EQ(md.num_prefill_tokens, base_md.num_prefill_tokens);
      EXPECT_EQ(md.max_decode_query_len, base_md.max_decode_query_len);
      EXPECT_EQ(md.decode_swa.width, base_md.decode_swa.width);
      EXPECT_EQ(md.prefill_swa.width, base_md.prefill_swa.width);
      EXPECT_EQ(md.has_image(), base_md.has_image());
      EXPECT_EQ(md.tile_schedulers, base_md.tile_schedulers);
      const testing::MetadataSnapshot s = testing::snapshot(md);
      changed_rows += s.at("decode_swa.rows") != base.at("decode_swa.rows") ||
                      s.at("prefill_swa.rows") != base.at("prefill_swa.rows");
      ++compared;
    }
  }
  // Fresh pages almost always change some row (a batch whose rows are all empty cannot).
  EXPECT_GT(changed_rows, compared * 9 / 10);
}

}  // namespace
}  // namespace sparse_swa
