// SPDX-License-Identifier: Apache-2.0
// Edge cases of docs/semantics.md (windows on block edges, short and exact-W sequences, padding,
// mixed steps, DSpark blocks, image spans, the draft update) and its departures from the
// reference, each with rows computed by hand (or from slot(r, p) = page[p / B] * B + p % B).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "sparse_swa/metadata_builder.h"
#include "support/metadata_snapshot.h"
#include "support/status_matchers.h"
#include "testing/presets.h"
#include "testing/test_batch.h"

namespace sparse_swa {
namespace {

using testing::cpu_builder;
using testing::lens_of;
using testing::row_of;
using testing::TestBatch;
using testing::to_vector;
using Row = std::vector<int32_t>;

BuilderConfig make_config(int32_t window, int32_t block, int32_t max_tokens = 64,
                          int32_t max_seqs = 8) {
  return testing::small_config(window, block, max_tokens, max_seqs);
}

BuilderConfig mtp_config(int32_t window, int32_t block, int32_t k, bool parallel = false) {
  return testing::with_mtp(make_config(window, block), k, parallel);
}

BuilderConfig dspark_config(int32_t window, int32_t block, int32_t k, bool parallel = false,
                            int32_t max_tokens = 64) {
  return testing::with_dspark(make_config(window, block, max_tokens), k, parallel);
}

// Slots of positions [from, to) of request r, then -1 up to `width`.
Row slots(const TestBatch& b, int32_t r, int32_t from, int32_t to, int32_t width) {
  Row row;
  for (int32_t p = from; p < to; ++p) row.push_back(static_cast<int32_t>(b.slot(r, p)));
  row.resize(width, -1);
  return row;
}

// Pages in no particular order (11, 48, 85, ...), so that a wrong page index shows.
std::vector<int32_t> scrambled_pages(int32_t count) {
  std::vector<int32_t> p(count);
  for (int32_t i = 0; i < count; ++i) p[i] = (i * 37 + 11) % 1009;
  return p;
}

SwaMetadata build_ok(MetadataBuilder& builder, const TestBatch& batch) {
  SwaMetadata md;
  const Status st = builder.build(batch.input(), &md);
  if (!st.ok()) ADD_FAILURE() << st.to_string() << " for " << batch.describe();
  return md;
}

// ---------------------------------------------------------------- window vs sequence length

TEST(EdgeWindow, WindowLongerThanSequence) {
  auto builder = cpu_builder(make_config(16, 4));
  TestBatch b(4);
  b.add_request(3, 1, {5});  // position 2, W = 16
  SwaMetadata md = build_ok(*builder, b);
  EXPECT_EQ(lens_of(md.decode_swa), (Row{3}));
  EXPECT_EQ(row_of(md.decode_swa, 0),
            (Row{20, 21, 22, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1}));
}

TEST(EdgeWindow, SequenceExactlyWAndWPlusOne) {
  auto builder = cpu_builder(make_config(8, 4));
  TestBatch b(4);
  b.add_request(8, 1, {7, 3, 9}).add_request(9, 1, {7, 3, 9});
  SwaMetadata md = build_ok(*builder, b);
  EXPECT_EQ(lens_of(md.decode_swa), (Row{8, 8}));
  EXPECT_EQ(row_of(md.decode_swa, 0), (Row{28, 29, 30, 31, 12, 13, 14, 15}));  // positions 0..7
  EXPECT_EQ(row_of(md.decode_swa, 1), (Row{29, 30, 31, 12, 13, 14, 15, 36}));  // positions 1..8
}

TEST(EdgeWindow, PrefillPrefixZeroAndPrefixPastTheWindow) {
  auto builder = cpu_builder(make_config(4, 4));
  TestBatch b(4);
  b.add_request(3, 3, {2})             // first chunk: prefix 0
      .add_request(12, 2, {1, 2, 3});  // prefix 10 >= W - 1
  SwaMetadata md = build_ok(*builder, b);
  ASSERT_EQ(md.num_prefills, 2);
  EXPECT_EQ(to_vector(md.prefill_gather_lens), (Row{3 + 0, 2 + 3}));  // ql + min(prefix, W - 1)
  EXPECT_EQ(lens_of(md.prefill_swa), (Row{1, 2, 3, 4, 4}));
  EXPECT_EQ(row_of(md.prefill_swa, 0), (Row{8, -1, -1, -1}));
  EXPECT_EQ(row_of(md.prefill_swa, 2), (Row{8, 9, 10, -1}));
  EXPECT_EQ(row_of(md.prefill_swa, 3), (Row{11, 12, 13, 14}));  // positions 7..10
  EXPECT_EQ(row_of(md.prefill_swa, 4), (Row{12, 13, 14, 15}));  // positions 8..11
}

// ---------------------------------------------------------------- block geometry

TEST(EdgeBlocks, WindowStartAndEndOnBlockBoundaries) {
  auto builder = cpu_builder(make_config(8, 4));
  TestBatch b(4);
  // pos 11: start 4 = a page start, pos 11 = the last offset of page 2.
  b.add_request(12, 1, {7, 3, 9});
  // pos 12: start 5, the window ends on the first offset of page 3.
  b.add_request(13, 1, {7, 3, 9, 2});
  SwaMetadata md = build_ok(*builder, b);
  EXPECT_EQ(row_of(md.decode_swa, 0), (Row{12, 13, 14, 15, 36, 37, 38, 39}));
  EXPECT_EQ(row_of(md.decode_swa, 1), (Row{13, 14, 15, 36, 37, 38, 39, 8}));
}

TEST(EdgeBlocks, WindowNotAMultipleOfTheBlockSpanningManyBlocks) {
  auto builder = cpu_builder(make_config(10, 4));
  TestBatch b(4);
  b.add_request(13, 1, {9, 2, 7, 5});  // pos 12, start 3: pages 0, 1, 2 and 3
  SwaMetadata md = build_ok(*builder, b);
  EXPECT_EQ(lens_of(md.decode_swa), (Row{10}));
  EXPECT_EQ(row_of(md.decode_swa, 0), (Row{39, 8, 9, 10, 11, 28, 29, 30, 31, 20}));
}

TEST(EdgeBlocks, WindowFiveBlockThree) {
  auto builder = cpu_builder(make_config(5, 3));
  TestBatch b(3);
  b.add_request(8, 2, {4, 0, 6});  // a prefill (q 2 > theta 1), positions 6, 7
  SwaMetadata md = build_ok(*builder, b);
  // pos 6: positions 2..6 -> 14 | 0 1 2 | 18; pos 7: positions 3..7.
  EXPECT_EQ(row_of(md.prefill_swa, 0), (Row{14, 0, 1, 2, 18}));
  EXPECT_EQ(row_of(md.prefill_swa, 1), (Row{0, 1, 2, 18, 19}));
}

class EdgeBlockSizes : public ::testing::TestWithParam<int32_t> {};

TEST_P(EdgeBlockSizes, W128RowsAcrossPageBoundaries) {
  const int32_t block = GetParam();
  auto builder = cpu_builder(make_config(128, block, /*max_tokens=*/64));
  TestBatch b(block);
  // Positions straddling page boundaries: block - 1, block, 2 * block + 5, and a long one.
  const std::vector<int32_t> positions = {block - 1, block, 2 * block + 5, 3 * block + 127};
  for (int32_t pos : positions) b.add_request(pos + 1, 1, scrambled_pages(pos / block + 1));
  SwaMetadata md = build_ok(*builder, b);
  for (size_t t = 0; t < positions.size(); ++t) {
    const int32_t pos = positions[t];
    const int32_t start = std::max(pos - 127, 0);
    EXPECT_EQ(md.decode_swa.lens[t], pos - start + 1) << "pos " << pos;
    EXPECT_EQ(row_of(md.decode_swa, t), slots(b, static_cast<int32_t>(t), start, pos + 1, 128))
        << "pos " << pos;
    // The last valid entry is the token's own slot.
    EXPECT_EQ(md.decode_swa.row(t)[md.decode_swa.lens[t] - 1], b.slot_mapping[t]);
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, EdgeBlockSizes, ::testing::Values(32, 64, 128, 256),
                         [](const ::testing::TestParamInfo<int32_t>& info) {
                           return "B" + std::to_string(info.param);
                         });

TEST(EdgeBlocks, LargePageIdsUse64BitSlotMath) {
  // page * B + offset stays below 2^31 only because the check uses 64-bit arithmetic.
  const int32_t block = 256;
  const int32_t page = (INT32_MAX - (block - 1)) / block;  // largest page whose slots fit int32
  auto builder = cpu_builder(make_config(4, block));
  TestBatch b(block);
  b.add_request(300, 1, {0, page});  // pos 299: positions 296..299 on page 1
  SwaMetadata md = build_ok(*builder, b);
  const int32_t base = page * block;
  EXPECT_EQ(row_of(md.decode_swa, 0), (Row{base + 40, base + 41, base + 42, base + 43}));
}

// ---------------------------------------------------------------- decode / prefill split

TEST(EdgeSplit, QueryLenThetaIsDecodeThetaPlusOneIsPrefill) {
  auto builder = cpu_builder(mtp_config(8, 4, /*k=*/2));  // theta = 3
  TestBatch at(4);
  at.add_request(10, 3, scrambled_pages(3));
  SwaMetadata md = build_ok(*builder, at);
  EXPECT_EQ(md.num_decodes, 1);
  EXPECT_EQ(md.num_decode_tokens, 3);
  EXPECT_EQ(md.max_decode_query_len, 3);

  TestBatch over(4);
  over.add_request(10, 4, scrambled_pages(3));
  md = build_ok(*builder, over);
  EXPECT_EQ(md.num_decodes, 0);
  EXPECT_EQ(md.num_prefills, 1);
  EXPECT_EQ(md.num_prefill_tokens, 4);
  EXPECT_EQ(md.max_decode_query_len, 3);  // min(4, theta)
}

TEST(EdgeSplit, ParallelDraftingThresholdIsOnePlusTwoK) {
  auto builder = cpu_builder(mtp_config(8, 4, /*k=*/2, /*parallel=*/true));  // theta = 5
  TestBatch b(4);
  b.add_request(10, 5, scrambled_pages(3))     // q = theta: decode
      .add_request(12, 6, scrambled_pages(3))  // q = theta + 1: the first prefill
      .add_request(9, 2, scrambled_pages(3));  // after the first prefill: a prefill too
  SwaMetadata md = build_ok(*builder, b);
  EXPECT_EQ(md.num_decodes, 1);
  EXPECT_EQ(md.num_prefills, 2);
  EXPECT_EQ(md.num_decode_tokens, 5);
  EXPECT_EQ(md.num_prefill_tokens, 8);
  EXPECT_EQ(to_vector(md.prefill_gather_lens), (Row{6 + 6, 2 + 7}));
}

TEST(EdgeSplit, PrefillOnlyHasNoTileSchedulersAndLeavesTheLensTail) {
  BuilderConfig c = make_config(8, 4, 16);
  c.compress_ratios = {1, 4, 128};
  auto builder = cpu_builder(c);
  TestBatch decodes(4);
  for (int r = 0; r < 5; ++r) decodes.add_request(9 + r, 1, scrambled_pages(4));
  SwaMetadata md = build_ok(*builder, decodes);
  EXPECT_EQ(md.tile_schedulers.sorted_names(),
            (std::vector<std::string>{"c128a", "c4a", "swaonly"}));
  const Row lens_before = lens_of(md.decode_swa);
  ASSERT_EQ(lens_before, (Row{8, 8, 8, 8, 8}));
  const int32_t* lens_buffer = md.decode_swa.lens;

  TestBatch prefill(4);
  prefill.add_request(6, 6, scrambled_pages(2));
  md = build_ok(*builder, prefill);
  EXPECT_EQ(md.num_decode_tokens, 0);
  EXPECT_EQ(md.num_prefill_tokens, 6);
  EXPECT_TRUE(md.tile_schedulers.empty());
  EXPECT_EQ(md.decode_swa.rows, 0);
  EXPECT_EQ(md.decode_swa_width(), 8);
  // Td == 0: the reference does not zero decode_swa_lens, so the buffer keeps the last values.
  ASSERT_EQ(md.decode_swa.lens, lens_buffer);
  EXPECT_EQ(Row(lens_buffer, lens_buffer + 5), lens_before);
}

TEST(EdgeSplit, DecodeOnlyHasNoPrefillOutputs) {
  auto builder = cpu_builder(mtp_config(8, 4, 1));
  TestBatch b(4);
  b.add_request(5, 2, {1, 2}).add_request(3, 1, {3});
  SwaMetadata md = build_ok(*builder, b);
  EXPECT_EQ(md.num_prefills, 0);
  EXPECT_EQ(md.num_prefill_tokens, 0);
  EXPECT_EQ(md.prefill_swa.rows, 0);
  EXPECT_FALSE(md.has_prefill());
  EXPECT_TRUE(md.prefill_gather_lens.empty());
  auto plan = prefill_chunk_plan(md, 1, 4);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan.value().empty());
}

TEST(EdgeSplit, TrailingPaddingOfAMixedBatchIsInThePrefillSection) {
  auto builder = cpu_builder(make_config(4, 4));
  TestBatch b(4);
  b.add_request(6, 1, {1, 2}).add_request(3, 3, {3}).pad_tokens(2);
  SwaMetadata md = build_ok(*builder, b);
  EXPECT_EQ(md.num_decode_tokens, 1);
  EXPECT_EQ(md.num_prefill_tokens, 5);  // 3 real + 2 padding
  EXPECT_EQ(to_vector(md.token_to_req_indices), (Row{0, 1, 1, 1, 0, 0}));
  EXPECT_EQ(lens_of(md.prefill_swa), (Row{1, 2, 3, 0, 0}));
  EXPECT_EQ(row_of(md.prefill_swa, 3), Row(4, -1));
  EXPECT_EQ(row_of(md.prefill_swa, 4), Row(4, -1));
}

TEST(EdgeSplit, NoRequestsOnlyPadding) {
  auto builder = cpu_builder(make_config(4, 4));
  TestBatch b(4);
  b.pad_tokens(3);
  SwaMetadata md = build_ok(*builder, b);
  EXPECT_EQ(md.num_decode_tokens, 3);
  EXPECT_EQ(md.max_decode_query_len, 0);
  EXPECT_EQ(lens_of(md.decode_swa), (Row{0, 0, 0}));
  EXPECT_EQ(to_vector(md.token_to_req_indices), (Row{0, 0, 0}));
}

TEST(EdgeSplit, FullCapacityBatch) {
  // T = max_num_batched_tokens and R = max_num_seqs.
  auto builder = cpu_builder(make_config(4, 4, /*max_tokens=*/12, /*max_seqs=*/4));
  TestBatch b(4);
  b.add_request(5, 1, {1, 2})
      .add_request(2, 1, {3})
      .add_request(8, 5, {4, 5})
      .add_request(5, 5, {6, 7});
  ASSERT_EQ(b.num_tokens(), 12);
  SwaMetadata md = build_ok(*builder, b);
  EXPECT_EQ(md.num_decode_tokens, 2);
  EXPECT_EQ(md.num_prefill_tokens, 10);
  EXPECT_EQ(row_of(md.prefill_swa, 9), (Row{25, 26, 27, 28}));  // request 3, positions 1..4
}

// ---------------------------------------------------------------- persistent buffers

TEST(EdgeBuffers, StaleRowsNeverLeakIntoASmallerStep) {
  auto builder = cpu_builder(mtp_config(8, 4, 3));  // theta 4
  TestBatch big(4);
  for (int r = 0; r < 6; ++r) big.add_request(12, 4, scrambled_pages(3));
  big.add_request(20, 10, scrambled_pages(5));
  SwaMetadata md = build_ok(*builder, big);
  ASSERT_EQ(md.num_decode_tokens, 24);
  ASSERT_EQ(md.num_prefill_tokens, 10);

  TestBatch small(4);
  small.add_request(3, 2, {7}).add_request(12, 2, scrambled_pages(3)).add_request(5, 5, {8, 9});
  small.invalidate(1).invalidate(5).pad_tokens(3);
  md = build_ok(*builder, small);
  ASSERT_EQ(md.num_decode_tokens, 4);
  ASSERT_EQ(md.num_prefill_tokens, 8);  // 5 real + 3 padding
  EXPECT_EQ(lens_of(md.decode_swa), (Row{2, 0, 8, 8}));
  EXPECT_EQ(row_of(md.decode_swa, 0), (Row{28, 29, -1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(row_of(md.decode_swa, 1), Row(8, -1));
  EXPECT_EQ(lens_of(md.prefill_swa), (Row{1, 0, 3, 4, 5, 0, 0, 0}));
  EXPECT_EQ(row_of(md.prefill_swa, 0), (Row{32, -1, -1, -1, -1, -1, -1, -1}));
  for (int p : {1, 5, 6, 7}) EXPECT_EQ(row_of(md.prefill_swa, p), Row(8, -1)) << "prefill " << p;
  EXPECT_EQ(row_of(md.prefill_swa, 3), (Row{32, 33, 34, 35, -1, -1, -1, -1}));
  EXPECT_EQ(row_of(md.prefill_swa, 4), (Row{32, 33, 34, 35, 36, -1, -1, -1}));
  for (int i = 4; i < 64; ++i) ASSERT_EQ(md.decode_swa.lens[i], 0) << "decode lens tail " << i;
}

TEST(EdgeBuffers, AddressesAreStableAcrossBuilds) {
  auto builder = cpu_builder(dspark_config(8, 4, 3));
  TestBatch a(4);
  a.add_request(10, 3, scrambled_pages(3)).add_request(20, 9, scrambled_pages(5));
  TestBatch b(4);
  for (int r = 0; r < 5; ++r) b.add_request(7 + r, 1 + r % 3, scrambled_pages(3));
  b.pad_tokens(4);
  TestBatch noncausal = a;
  noncausal.set_causal(false);

  SwaMetadata m1 = build_ok(*builder, a);
  SwaMetadata m2 = build_ok(*builder, b);
  SwaMetadata m3 = build_ok(*builder, noncausal);
  SwaMetadata m4 = build_ok(*builder, a);
  SwaMetadata m5 = build_ok(*builder, noncausal);
  for (const SwaMetadata* m : {&m2, &m4}) {
    EXPECT_EQ(m->decode_swa.data, m1.decode_swa.data);
    EXPECT_EQ(m->decode_swa.lens, m1.decode_swa.lens);
    EXPECT_EQ(m->prefill_swa.data, m1.prefill_swa.data);
    EXPECT_EQ(m->prefill_swa.lens, m1.prefill_swa.lens);
    EXPECT_EQ(m->token_to_req_indices.data(), m1.token_to_req_indices.data());
    EXPECT_EQ(m->is_valid_token.data(), m1.is_valid_token.data());
    EXPECT_EQ(m->prefill_gather_lens.data(), m1.prefill_gather_lens.data());
  }
  // The non-causal rows live in their own persistent buffer; lens are shared.
  EXPECT_NE(m3.decode_swa.data, m1.decode_swa.data);
  EXPECT_EQ(m5.decode_swa.data, m3.decode_swa.data);
  EXPECT_EQ(m3.decode_swa.lens, m1.decode_swa.lens);
  EXPECT_EQ(m3.prefill_swa.data, m1.prefill_swa.data);
}

// ---------------------------------------------------------------- DSpark departures

TEST(EdgeDspark, WidthRaisedSoRowsAreNeverTruncated) {
  // W = 123, k = 5, parallel drafting: theta = 11. The reference's Wn = round_up(128, 64) = 128
  // but a q = 11 draft block after a full window holds 123 + 11 = 134 entries.
  EXPECT_EQ(reference_noncausal_width(123, 5), 128);
  auto builder = cpu_builder(dspark_config(123, 16, 5, /*parallel=*/true));
  EXPECT_EQ(builder->derived().decode_threshold, 11);
  EXPECT_EQ(builder->derived().noncausal_index_width, 192);
  TestBatch b(16);
  b.add_request(200 + 11, 11, scrambled_pages(14)).set_causal(false);  // prefix 200
  SwaMetadata md = build_ok(*builder, b);
  ASSERT_EQ(md.num_decode_tokens, 11);
  EXPECT_EQ(md.decode_swa_width(), 192);
  const Row expected = slots(b, 0, 200 - 123, 211, 192);  // positions 77..210
  for (int t = 0; t < 11; ++t) {
    EXPECT_EQ(md.decode_swa.lens[t], 134) << "token " << t;
    EXPECT_EQ(row_of(md.decode_swa, t), expected) << "token " << t;
  }
  // The last entry past the reference's 128 columns is the block's last token.
  EXPECT_EQ(md.decode_swa.row(0)[133], b.slot_mapping[10]);
}

TEST(EdgeDspark, DsvFlashWidths) {
  auto builder = cpu_builder(dspark_config(128, 64, 5));
  EXPECT_EQ(builder->derived().noncausal_index_width, 192);
  auto k7 = cpu_builder(dspark_config(128, 64, 7));
  EXPECT_EQ(k7->derived().noncausal_index_width, 192);
}

TEST(EdgeDspark, NonCausalRowsSeeFutureBlockTokens) {
  auto builder = cpu_builder(dspark_config(4, 4, 2));
  TestBatch b(4);
  b.add_request(9, 3, {1, 2, 3}).set_causal(false);  // prefix 6: positions 2..8
  SwaMetadata md = build_ok(*builder, b);
  // Every token, the first included, sees position seq - 1 = 8 (slot 12).
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(md.decode_swa.lens[t], 7);
    EXPECT_EQ(md.decode_swa.row(t)[6], 12);
    EXPECT_EQ(md.decode_swa.row(t)[0], 6);
  }
}

TEST(EdgeDspark, NonCausalStepWithoutDecodeTokensKeepsWidthWn) {
  auto builder = cpu_builder(dspark_config(8, 4, 1));  // theta 2
  TestBatch b(4);
  b.add_request(10, 5, scrambled_pages(3)).set_causal(false);  // a prefill: rows stay causal
  SwaMetadata md = build_ok(*builder, b);
  EXPECT_EQ(md.num_decode_tokens, 0);
  EXPECT_EQ(md.decode_swa_width(), 64);
  EXPECT_EQ(lens_of(md.prefill_swa), (Row{6, 7, 8, 8, 8}));
  EXPECT_TRUE(md.tile_schedulers.empty());
}

TEST(EdgeDspark, UpdateDraftRowsAfterNonCausalBuildStaysNonCausal) {
  auto builder = cpu_builder(dspark_config(8, 4, 3));  // Wn = 64
  TestBatch b(4);
  b.add_request(13, 3, scrambled_pages(5)).add_request(5, 3, scrambled_pages(3)).set_causal(false);
  SwaMetadata md = build_ok(*builder, b);
  ASSERT_EQ(md.decode_swa_width(), 64);
  ASSERT_EQ(lens_of(md.decode_swa), (Row{11, 11, 11, 5, 5, 5}));

  // The draft loop advanced every request by one token; the rows stay non-causal with the
  // logical window W = 8: request 0 (prefix 11) sees 3..13, request 1 (prefix 3) sees 0..5.
  // The row width as the window (Wn = 64, the seed reference's causal update) would give causal
  // rows of lens 12, 13, 14 (docs/semantics.md#draft-update-window).
  b.seq_lens = {14, 6};
  SPARSE_SWA_ASSERT_OK(builder->update_draft_decode_rows(b.input(), &md));
  EXPECT_EQ(md.decode_swa_width(), 64);
  EXPECT_EQ(lens_of(md.decode_swa), (Row{11, 11, 11, 6, 6, 6}));
  EXPECT_EQ(row_of(md.decode_swa, 0), slots(b, 0, 3, 14, 64));
  EXPECT_EQ(row_of(md.decode_swa, 2), slots(b, 0, 3, 14, 64));
  EXPECT_EQ(row_of(md.decode_swa, 3), slots(b, 1, 0, 6, 64));
  EXPECT_EQ(row_of(md.decode_swa, 5), slots(b, 1, 0, 6, 64));
  EXPECT_FALSE(md.tile_schedulers.empty());
}

TEST(EdgeDspark, UpdateDraftRowsKeepsInvalidTokensCleared) {
  auto builder = cpu_builder(mtp_config(4, 4, 2));
  TestBatch b(4);
  b.add_request(6, 2, scrambled_pages(3)).add_request(3, 1, {9}).invalidate(1).pad_tokens(1);
  SwaMetadata md = build_ok(*builder, b);
  ASSERT_EQ(md.num_decode_tokens, 4);
  b.seq_lens = {7, 4};
  SPARSE_SWA_ASSERT_OK(builder->update_draft_decode_rows(b.input(), &md));
  EXPECT_EQ(lens_of(md.decode_swa), (Row{4, 0, 4, 0}));
  EXPECT_EQ(row_of(md.decode_swa, 0), slots(b, 0, 2, 6, 4));  // positions 5 -> 2..5
  EXPECT_EQ(row_of(md.decode_swa, 1), Row(4, -1));
  EXPECT_EQ(row_of(md.decode_swa, 2), slots(b, 1, 0, 4, 4));
  EXPECT_EQ(row_of(md.decode_swa, 3), Row(4, -1));
}

TEST(EdgeDspark, UpdateDraftRowsRecomputesTheExportedMappingAndValidity) {
  // The metadata's token_to_req_indices and is_valid_token alias the builder's buffers and a
  // caller can write them (Python exports them as writable arrays); the update recomputes both
  // from the batch (the padding token 3 maps to the last request).
  auto builder = cpu_builder(mtp_config(4, 4, 2));
  TestBatch b(4);
  b.add_request(6, 2, scrambled_pages(3)).add_request(3, 1, {9}).invalidate(1).pad_tokens(1);
  SwaMetadata md = build_ok(*builder, b);
  ASSERT_EQ(md.num_decode_tokens, 4);
  auto* mapping = const_cast<int32_t*>(md.token_to_req_indices.data());
  auto* valid = const_cast<uint8_t*>(md.is_valid_token.data());
  const int32_t written[] = {1000000, -5, 1, 0};
  for (int t = 0; t < 4; ++t) {
    mapping[t] = written[t];
    valid[t] = 1;  // the invalid token 1 and the padding token 3 included
  }
  b.seq_lens = {7, 4};
  SPARSE_SWA_ASSERT_OK(builder->update_draft_decode_rows(b.input(), &md));
  EXPECT_EQ(to_vector(md.token_to_req_indices), (Row{0, 0, 1, 1}));
  EXPECT_EQ(std::vector<uint8_t>(md.is_valid_token.begin(), md.is_valid_token.end()),
            (std::vector<uint8_t>{1, 0, 1, 0}));
  EXPECT_EQ(lens_of(md.decode_swa), (Row{4, 0, 4, 0}));
  EXPECT_EQ(row_of(md.decode_swa, 0), slots(b, 0, 2, 6, 4));
  EXPECT_EQ(row_of(md.decode_swa, 1), Row(4, -1));
  EXPECT_EQ(row_of(md.decode_swa, 2), slots(b, 1, 0, 4, 4));
  EXPECT_EQ(row_of(md.decode_swa, 3), Row(4, -1));
}

TEST(EdgeDspark, UpdateDraftRowsWithNoDecodeTokensIsANoOp) {
  auto builder = cpu_builder(mtp_config(4, 4, 1));
  TestBatch b(4);
  b.add_request(6, 6, scrambled_pages(2));
  SwaMetadata md = build_ok(*builder, b);
  const Row prefill_lens = lens_of(md.prefill_swa);
  b.seq_lens = {7};
  b.pages[0].push_back(7);
  SPARSE_SWA_EXPECT_OK(builder->update_draft_decode_rows(b.input(), &md));
  EXPECT_EQ(lens_of(md.prefill_swa), prefill_lens);
  EXPECT_TRUE(md.tile_schedulers.empty());
}

// ---------------------------------------------------------------- image path conditions

BuilderConfig vision_config(int32_t window, int32_t block, int32_t max_image_tokens) {
  return testing::with_images(mtp_config(window, block, /*k=*/1), max_image_tokens);  // theta 2
}

TEST(EdgeImage, TextModelRowsHaveWidthW) {
  auto builder = cpu_builder(make_config(8, 4));
  TestBatch b(4);
  b.add_request(5, 5, {1, 2});
  SwaMetadata md = build_ok(*builder, b);
  EXPECT_EQ(md.prefill_swa.width, 8);
  EXPECT_FALSE(md.has_image());
}

TEST(EdgeImage, ImageFreeBatchOnVisionModel) {
  auto builder = cpu_builder(vision_config(4, 4, 6));
  TestBatch b(4);
  b.add_request(5, 5, {1, 2});
  SwaMetadata md = build_ok(*builder, b);
  EXPECT_FALSE(md.has_image());
  EXPECT_TRUE(md.left_visible.empty());
  EXPECT_EQ(md.prefill_swa.width, 10);  // still W + Mi
  EXPECT_EQ(row_of(md.prefill_swa, 4), (Row{5, 6, 7, 8, -1, -1, -1, -1, -1, -1}));
}

TEST(EdgeImage, SpansWithoutPrefillTokensDoNotRunTheImagePath) {
  auto builder = cpu_builder(vision_config(4, 4, 6));
  TestBatch b(4);
  b.add_request(9, 1, scrambled_pages(3)).add_image_span(0, 2, 7);  // a decode request's image
  SwaMetadata md = build_ok(*builder, b);
  EXPECT_EQ(md.num_prefill_tokens, 0);
  EXPECT_FALSE(md.has_image());
  EXPECT_EQ(row_of(md.decode_swa, 0), slots(b, 0, 5, 9, 4));  // never widened
}

TEST(EdgeImage, SpanOfADecodeRequestOnlyWidensNothing) {
  auto builder = cpu_builder(vision_config(4, 4, 6));
  TestBatch b(4);
  b.add_request(9, 2, scrambled_pages(3))     // decode with an image at 2..7
      .add_request(6, 6, scrambled_pages(2))  // prefill without spans
      .add_image_span(0, 2, 7);
  SwaMetadata md = build_ok(*builder, b);
  ASSERT_EQ(md.num_decode_tokens, 2);
  // The reference runs the image path (some request has spans) but nothing is widened.
  ASSERT_TRUE(md.has_image());
  EXPECT_EQ(to_vector(md.left_visible), Row(8, 0));
  EXPECT_EQ(to_vector(md.right_visible), Row(8, 0));
  EXPECT_EQ(lens_of(md.decode_swa), (Row{4, 4}));
  EXPECT_EQ(row_of(md.decode_swa, 0), slots(b, 0, 4, 8, 4));
  EXPECT_EQ(lens_of(md.prefill_swa), (Row{1, 2, 3, 4, 4, 4}));
}

TEST(EdgeImage, DecodeRowsBesideAnImagePrefillAreNotWidened) {
  auto builder = cpu_builder(vision_config(4, 4, 6));
  TestBatch b(4);
  b.add_request(9, 1, scrambled_pages(3))     // decode, position 8, its own image 5..8
      .add_request(8, 8, scrambled_pages(2))  // prefill with an image 2..6
      .add_image_span(1, 2, 6)
      .add_image_span(0, 5, 8);
  SwaMetadata md = build_ok(*builder, b);
  ASSERT_TRUE(md.has_image());
  EXPECT_EQ(md.left_visible[0], 0);
  EXPECT_EQ(md.right_visible[0], 0);
  EXPECT_EQ(lens_of(md.decode_swa), (Row{4}));
  // Prefill positions 0..7, image 2..6: left = pos - 2, right = 6 - pos inside.
  EXPECT_EQ(Row(md.left_visible.begin() + 1, md.left_visible.end()), (Row{0, 0, 0, 1, 2, 3, 4, 0}));
  EXPECT_EQ(Row(md.right_visible.begin() + 1, md.right_visible.end()),
            (Row{0, 0, 4, 3, 2, 1, 0, 0}));
  // pos 2: start max(min(-1, 2), 0) = 0, end 7 -> 7 entries; pos 7: positions 4..7.
  // pos 4: start min(1, 2) = 1, end 7; pos 6: left 4 > W - 1, left_add 1, start 2.
  EXPECT_EQ(lens_of(md.prefill_swa), (Row{1, 2, 7, 7, 6, 5, 5, 4}));
  EXPECT_EQ(row_of(md.prefill_swa, 2), slots(b, 1, 0, 7, 10));
  EXPECT_EQ(row_of(md.prefill_swa, 7), slots(b, 1, 4, 8, 10));
}

TEST(EdgeImage, SpanInASecondChunk) {
  auto builder = cpu_builder(vision_config(4, 4, 8));
  TestBatch b(4);
  // Chunk 2 of a prompt: prefix 6, query positions 6..11, image 4..9 started in chunk 1.
  b.add_request(12, 6, scrambled_pages(3)).add_image_span(0, 4, 9);
  SwaMetadata md = build_ok(*builder, b);
  ASSERT_TRUE(md.has_image());
  EXPECT_EQ(to_vector(md.left_visible), (Row{2, 3, 4, 5, 0, 0}));
  EXPECT_EQ(to_vector(md.right_visible), (Row{3, 2, 1, 0, 0, 0}));
  // pos 6: start max(min(3, 4), 0) = 3, end 10; pos 9: left 5 > W - 1: start min(6, 4) = 4.
  EXPECT_EQ(row_of(md.prefill_swa, 0), slots(b, 0, 3, 10, 12));
  EXPECT_EQ(row_of(md.prefill_swa, 3), slots(b, 0, 4, 10, 12));
  EXPECT_EQ(row_of(md.prefill_swa, 5), slots(b, 0, 8, 12, 12));
  EXPECT_EQ(to_vector(md.prefill_gather_lens), (Row{6 + 3}));
}

}  // namespace
}  // namespace sparse_swa
