// SPDX-License-Identifier: Apache-2.0
// The plan of the sm_90a attention kernels (detail::plan_sm90_attention, src/attention/
// sm90_plan.h): which kernel family, how many slices, query groups, decoded keys and their
// workspace, from the shapes alone. Plain host arithmetic: these tests run in CPU-only builds.
#include "attention/sm90_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>

#include "sparse_swa/attention.h"

namespace sparse_swa {
namespace {

using detail::AttentionOverrides;
using detail::Sm90Family;
using detail::Sm90Plan;
using detail::SmCapacity;

constexpr Sm90Family kTile32 = Sm90Family::kTile32, kPairsFp8 = Sm90Family::kPairsFp8,
                     kPairsBf16 = Sm90Family::kPairsBf16, kFewHeads = Sm90Family::kFewHeads;

// The plan on a device of `sms` SMs whose GPCs hold num_sms / size clusters of every size.
Sm90Plan plan_on(const SparseAttentionParams& p, int sms, int64_t workspace,
                 const AttentionOverrides& o = {}) {
  return detail::plan_sm90_attention(p, SmCapacity::ideal(sms), workspace, o);
}

// Whether a plan runs a pair kernel (or its few-heads form), which round P to bf16 once, rather
// than the tile32 kernel.
bool pairs(const Sm90Plan& d) { return d.family != kTile32; }

// A partial row is 512 fp32 + (max, sum) = 2056 bytes (docs/design.md#splits).
TEST(AttentionPlan, SplitsSmallBatchesOfLongRowsOverEitherKernel) {
  constexpr int kSms = 132;
  constexpr int64_t kRow = 2056;
  SparseAttentionParams p;
  p.num_heads = 64;
  p.swa_indices.width = 640;  // 20 tiles of 32 keys
  auto plan = [&](int64_t tokens, int64_t workspace) {
    p.num_tokens = tokens;
    p.swa_indices.rows = tokens;
    return plan_on(p, kSms, workspace);
  };
  // fp8_ds_mla rows: the pair kernel takes every split. 4 tokens x 1 group: 33 SMs a token,
  // the 10 pairs in 10 slices of one; under 16 items the merge kernel merges them.
  Sm90Plan d = plan(4, -1);
  EXPECT_TRUE(pairs(d));
  EXPECT_EQ(d.groups, 1);
  EXPECT_EQ(d.splits, 10);
  EXPECT_EQ(d.workspace_bytes, 10 * 4 * 64 * kRow);
  EXPECT_FALSE(d.cluster_merge);
  d = plan(8, -1);  // 16 SMs a token: 10 single pairs
  EXPECT_TRUE(pairs(d));
  EXPECT_EQ(d.splits, 10);
  EXPECT_FALSE(d.cluster_merge);
  // 16 tokens: 8 CTAs per token, 10 pairs in 5 slices of 2, a cluster of 5 per token; 64: 2.
  d = plan(16, -1);
  EXPECT_TRUE(pairs(d));
  EXPECT_EQ(d.splits, 5);
  EXPECT_EQ(d.workspace_bytes, 5 * 16 * 64 * kRow);
  EXPECT_TRUE(d.cluster_merge);
  EXPECT_TRUE(plan(64, -1).cluster_merge);
  EXPECT_TRUE(pairs(plan(64, -1)));
  EXPECT_EQ(plan(64, -1).splits, 2);
  // A workspace for 3 slices gives 3; none (or too small for 2) gives no split.
  d = plan(4, 3 * 4 * 64 * kRow + 100);
  EXPECT_TRUE(pairs(d));
  EXPECT_EQ(d.splits, 3);
  for (const int64_t workspace : {int64_t{0}, 2 * 4 * 64 * kRow - 1}) {
    d = plan(4, workspace);
    EXPECT_TRUE(pairs(d)) << workspace;
    EXPECT_EQ(d.splits, 1);
    EXPECT_EQ(d.workspace_bytes, 0);
  }
  // bf16 rows: under 5 items, where a slice would be one pair, the tile32 kernel's single tiles
  // (4 tokens: 20 slices of 1 tile); from 5 items on the pair kernel, its slices at least a
  // pair of 64-key blocks (8 tokens: 5 slices of 128 keys, merged in clusters).
  static const uint8_t bytes[16] = {};
  p.swa_cache = {bytes, 1, 64, 64 * 1024, CacheDtype::kBf16, MemorySpace::kDevice};
  d = plan(4, -1);
  EXPECT_FALSE(pairs(d));
  EXPECT_EQ(d.splits, 20);
  EXPECT_EQ(d.workspace_bytes, 20 * 4 * 64 * kRow);
  EXPECT_FALSE(d.cluster_merge);  // the tile32 kernel's slices: the merge kernel
  d = plan(8, -1);
  EXPECT_TRUE(pairs(d));
  EXPECT_EQ(d.splits, 5);
  EXPECT_TRUE(d.cluster_merge);
  d = plan(4, 3 * 4 * 64 * kRow + 100);
  EXPECT_FALSE(pairs(d));
  EXPECT_EQ(d.splits, 3);
  EXPECT_TRUE(pairs(plan(16, -1)));
  EXPECT_EQ(plan(16, -1).splits, 5);
  // Slices count the kernel's pairs (of 64-key blocks): 32 tokens, 4 SMs a token, the 5 pairs in
  // 3 slices (2, 2, 1), not 4 of which one would hold no key.
  d = plan(32, -1);
  EXPECT_TRUE(pairs(d));
  EXPECT_EQ(d.splits, 3);
  EXPECT_EQ(d.workspace_bytes, 3 * 32 * 64 * kRow);
  p.swa_cache = {};
  // Tokens x groups that fill the SMs never split.
  d = plan(kSms, -1);
  EXPECT_TRUE(pairs(d));
  EXPECT_EQ(d.splits, 1);
  p.num_heads = 128;  // 2 groups: 66 tokens fill the SMs, 65 do not (splits 132 / 130 = 1 anyway)
  EXPECT_TRUE(pairs(plan(66, -1)));
  EXPECT_EQ(plan(66, -1).groups, 2);
  EXPECT_TRUE(pairs(plan(65, -1)));
  EXPECT_TRUE(pairs(plan(33, -1)));  // 66 CTAs: 2 slices of 5 pairs each
  EXPECT_EQ(plan(33, -1).splits, 2);
  p.num_heads = 64;
  // Fewer than 8 tiles (SWA 128 + extra 96 = 224 keys, 7 tiles): never split.
  p.swa_indices.width = 128;
  p.extra_indices.rows = 1;
  p.extra_indices.width = 96;
  EXPECT_TRUE(pairs(plan(1, -1)));
  p.extra_indices.width = 129;  // 257 keys: 9 tiles, 5 pairs, 5 slices of one
  d = plan(1, -1);
  EXPECT_TRUE(pairs(d));
  EXPECT_EQ(d.splits, 5);
  EXPECT_FALSE(d.cluster_merge);      // one item
  EXPECT_EQ(plan(16, -1).splits, 5);  // 132 / 16 SMs per token, 5 pairs: one per slice
  EXPECT_TRUE(plan(16, -1).cluster_merge);
  // Forced kernels: the pair kernel keeps clusters at any item count.
  p.kernel = AttentionKernel::kSm90Pairs;
  d = plan(1, -1);
  EXPECT_TRUE(pairs(d));
  EXPECT_EQ(d.splits, 5);
  EXPECT_EQ(d.workspace_bytes, 5 * 64 * kRow);
  EXPECT_TRUE(d.cluster_merge);
  p.extra_indices.width = 512;  // 640 keys, 10 pairs: 10 slices, more than a cluster holds
  d = plan(1, -1);
  EXPECT_EQ(d.splits, 10);
  EXPECT_FALSE(d.cluster_merge);
  EXPECT_EQ(d.workspace_bytes, 10 * 64 * kRow);
  p.extra_indices.width = 129;
  d = plan(1, 0);  // no workspace: unsplit
  EXPECT_TRUE(pairs(d));
  EXPECT_EQ(d.splits, 1);
  p.kernel = AttentionKernel::kSm90Tile32;
  d = plan(kSms, -1);
  EXPECT_FALSE(pairs(d));
  EXPECT_EQ(d.splits, 1);
}

// The pair kernel's slices of a token merge inside a cluster, so a call's clusters must all
// run at once: on a device whose GPCs hold fewer clusters than num_sms / size (an H100 SXM's
// counts below), fewer and larger slices. Past one wave of CTAs (fp8_ds_mla rows, and bf16 rows
// on the 64-row kernel), the last wave's tokens take slices (docs/design.md#splits).
TEST(AttentionPlan, SlicesFitTheDevicesClustersAndEvenOutWaves) {
  constexpr int64_t kRow = 2056;
  SmCapacity h100;
  h100.num_sms = 132;
  const int32_t counts[9] = {0, 132, 66, 39, 30, 22, 17, 15, 15};
  std::copy(std::begin(counts), std::end(counts), std::begin(h100.clusters));
  SparseAttentionParams p;
  p.num_heads = 64;
  p.swa_indices.width = 128;
  p.extra_indices.width = 512;  // 640 keys: 10 pairs of 32-key blocks
  auto plan = [&](int64_t tokens, const SmCapacity& sms, int64_t workspace) {
    p.num_tokens = p.swa_indices.rows = p.extra_indices.rows = tokens;
    return detail::plan_sm90_attention(p, sms, workspace);
  };
  const SmCapacity ideal = SmCapacity::ideal(132);
  EXPECT_EQ(ideal.clusters[5], 26);
  // 24 tokens: 5 SMs a token; 24 clusters of 5 fit the ideal device (26), not the H100 (22):
  // 4 slices (30 clusters of 4 fit).
  EXPECT_EQ(plan(24, ideal, -1).splits, 5);
  Sm90Plan d = plan(24, h100, -1);
  EXPECT_TRUE(pairs(d));
  EXPECT_EQ(d.splits, 4);
  EXPECT_TRUE(d.cluster_merge);
  EXPECT_EQ(d.workspace_bytes, 4 * 24 * 64 * kRow);
  EXPECT_EQ(plan(32, h100, -1).splits, 3);  // 32 clusters of 4 do not fit (30); of 3 do (39)
  EXPECT_EQ(plan(16, h100, -1).splits, 5);  // 16 clusters of 5 fit (22)
  EXPECT_EQ(plan(48, h100, -1).splits, 2);
  // Past one wave: the tokens of the full waves run whole, the last wave's take slices over every
  // SM. V4-Pro (128 heads, 128 + 1024 keys: 18 pairs), 67 tokens = 134 CTAs: 66 tokens whole, the
  // last one's 2 items in 18 slices of a pair (36 CTAs), merged by the merge kernel.
  // A last-wave plan: the pair kernel, `splits` slices of the tokens after `whole`, merged by
  // the merge kernel, with a workspace of `bytes`.
  auto expect_last_wave = [](const Sm90Plan& d, int splits, int whole, int64_t bytes) {
    EXPECT_TRUE(pairs(d));
    EXPECT_EQ(d.splits, splits);
    EXPECT_EQ(d.whole_tokens, whole);
    EXPECT_FALSE(d.cluster_merge);
    EXPECT_EQ(d.workspace_bytes, bytes);
  };
  p.num_heads = 128;
  p.extra_indices.width = 1024;
  expect_last_wave(plan(67, h100, -1), 18, 66, 18 * 1 * 128 * kRow);
  d = plan(96, h100, -1);  // 192 CTAs: the last 60 items (30 tokens) in 2 slices
  EXPECT_EQ(d.splits, 2);
  EXPECT_EQ(d.whole_tokens, 66);
  EXPECT_EQ(d.workspace_bytes, 2 * 30 * 128 * kRow);
  d = plan(160, h100, -1);  // 320 CTAs: two full waves, then 28 tokens in 2 slices
  EXPECT_EQ(d.splits, 2);
  EXPECT_EQ(d.whole_tokens, 132);
  EXPECT_EQ(plan(128, h100, -1).splits, 1);  // the last wave's 124 items: one slice each
  EXPECT_EQ(plan(66, h100, -1).splits, 1);   // exactly one wave
  EXPECT_EQ(plan(67, h100, 18 * 128 * kRow - 1).splits, 1);  // no room
  p.kernel = AttentionKernel::kSm90Tile32;  // the tile32 kernel never splits full waves
  EXPECT_EQ(plan(67, h100, -1).splits, 1);
  p.kernel = AttentionKernel::kAuto;
  static const uint8_t bytes[16] = {};
  p.swa_cache = {bytes, 1, 64, 64 * 1024, CacheDtype::kBf16, MemorySpace::kDevice};
  p.extra_cache = p.swa_cache;
  // bf16 rows: the bf16 kernel's pairs are of 64-key blocks (9 for 1152 keys), so the last token's
  // 2 items take 9 slices.
  expect_last_wave(plan(67, h100, -1), 9, 66, 9 * 1 * 128 * kRow);
  p.num_heads = 64;
  p.extra_indices.width = 512;
  d = plan(133, h100, -1);  // 640 keys, 5 pairs of 64-key blocks: the last token in 5 slices
  EXPECT_EQ(d.splits, 5);
  EXPECT_EQ(d.whole_tokens, 132);
  EXPECT_NE(d.family, kFewHeads);
  EXPECT_EQ(plan(160, h100, -1).splits, 4);  // 28 items left: 4 slices (of 2, 2, 1, 0 pairs)
  // bf16 rows run whole where more than a quarter of the SMs' items are left (192 tokens: 60);
  // past two waves a small tail takes slices too (265 tokens: the last one; 4096: the last 4).
  EXPECT_EQ(plan(192, h100, -1).splits, 1);
  expect_last_wave(plan(265, h100, -1), 5, 264, 5 * 1 * 64 * kRow);
  expect_last_wave(plan(4096, h100, -1), 5, 4092, 5 * 4 * 64 * kRow);
  EXPECT_EQ(plan(512, h100, -1).splits, 1);  // 116 items left
  // The few-heads kernel's CTAs walk items as the bf16 kernel's do: the same last-wave slices.
  p.num_heads = 16;
  d = plan(133, h100, -1);
  expect_last_wave(d, 5, 132, 5 * 1 * 16 * kRow);
  EXPECT_EQ(d.family, kFewHeads);
  d = plan(4096, h100, -1);  // the last 4 tokens in 5 slices
  expect_last_wave(d, 5, 4092, 5 * 4 * 16 * kRow);
  EXPECT_EQ(d.family, kFewHeads);
  EXPECT_EQ(plan(4096, h100, 5 * 4 * 16 * kRow - 1).splits, 1);  // no room: unsplit
  EXPECT_EQ(plan(4096, h100, 5 * 4 * 16 * kRow - 1).family, kFewHeads);
  EXPECT_EQ(plan(512, h100, -1).splits, 1);  // 116 items left
  // V4-Flash (64 heads, 640 keys: 10 pairs): 133 tokens: 132 whole, the last in 10 slices.
  p.swa_cache.dtype = p.extra_cache.dtype = CacheDtype::kFp8DsMla;
  p.num_heads = 64;
  d = plan(133, h100, -1);
  EXPECT_EQ(d.splits, 10);
  EXPECT_EQ(d.whole_tokens, 132);
  EXPECT_EQ(plan(264, h100, -1).splits, 1);
  // Rows of 4 pairs (256 keys): 4 slices of one pair; of 2 pairs (7 tiles): never split.
  p.extra_indices.width = 128;
  EXPECT_EQ(plan(133, h100, -1).splits, 4);
  p.extra_indices.width = 96;
  EXPECT_EQ(plan(133, h100, -1).splits, 1);
}

// Decoded keys (docs/design.md#decoded-keys): prefill-sized calls on fp8_ds_mla caches whose rows
// hold 4 or more entries a slot decode each slot once into a bf16 copy (1 KB a slot), where the
// workspace holds it.
TEST(AttentionPlan, DecodesKeysOnceForPrefillBatchesThatShareThem) {
  constexpr int kSms = 132;
  static const uint8_t swa_bytes[16] = {}, extra_bytes[16] = {};  // addresses only
  SparseAttentionParams p;
  p.num_heads = 64;
  p.swa_cache = {swa_bytes, 512, 64, 64 * 576, CacheDtype::kFp8DsMla, MemorySpace::kDevice};
  p.extra_cache = p.swa_cache;  // both segments over one cache of 32768 slots
  p.swa_indices.width = 128;
  p.extra_indices.width = 512;
  auto plan = [&](int64_t tokens, int64_t workspace) {
    p.num_tokens = tokens;
    p.swa_indices.rows = tokens;
    p.extra_indices.rows = tokens;
    return plan_on(p, kSms, workspace);
  };
  const int64_t one_cache = 32768 * int64_t{1024};
  // 2.6 M entries over 32768 slots. 4096 = 31 x 132 + 4 tokens: the decoded rows, then the
  // partials of the last wave's 4 tokens in 5 slices each (640 keys: 5 pairs of 64-key blocks).
  Sm90Plan d = plan(4096, -1);
  EXPECT_TRUE(d.decoded_keys);
  EXPECT_TRUE(pairs(d));
  EXPECT_EQ(d.splits, 5);
  EXPECT_EQ(d.whole_tokens, 4092);
  EXPECT_EQ(d.workspace_bytes, one_cache + 5 * 4 * 64 * int64_t{2056});
  d = plan(4096, one_cache);  // room for the rows only: unsplit
  EXPECT_TRUE(d.decoded_keys);
  EXPECT_EQ(d.splits, 1);
  EXPECT_EQ(d.workspace_bytes, one_cache);
  d = plan(4096, one_cache - 1);  // no room: the caches read directly
  EXPECT_FALSE(d.decoded_keys);
  EXPECT_TRUE(pairs(d));
  // 4096 = 31 x 132 + 4 tokens: the last wave's 4 in 10 slices each (docs/design.md#splits).
  EXPECT_EQ(d.splits, 10);
  EXPECT_EQ(d.whole_tokens, 4092);
  EXPECT_EQ(d.workspace_bytes, 10 * 4 * 64 * int64_t{2056});
  EXPECT_EQ(plan(4096, 0).workspace_bytes, 0);  // none at all: unsplit
  // Two caches: two slot spaces.
  p.extra_cache.data = extra_bytes;
  EXPECT_EQ(plan(4096, -1).workspace_bytes, 65536 * int64_t{1024} + 5 * 4 * 64 * int64_t{2056});
  // Fewer than 4 entries a slot (300 x 640 < 4 x 65536), or fewer than two waves of CTAs
  // (263 tokens x one head group against 132 SMs): read directly.
  EXPECT_FALSE(plan(300, -1).decoded_keys);
  p.swa_cache.num_blocks = p.extra_cache.num_blocks = 16;  // 1024 slots each
  EXPECT_FALSE(plan(263, -1).decoded_keys);
  EXPECT_TRUE(plan(264, -1).decoded_keys);
  p.num_heads = 128;  // two head groups: 132 tokens are two waves
  EXPECT_TRUE(plan(132, -1).decoded_keys);
  EXPECT_FALSE(plan(131, -1).decoded_keys);
  // Forced kernels: the pair kernel may, the tile32 kernel never.
  p.kernel = AttentionKernel::kSm90Pairs;
  EXPECT_TRUE(plan(132, -1).decoded_keys);
  p.kernel = AttentionKernel::kSm90Tile32;
  EXPECT_FALSE(plan(132, -1).decoded_keys);
  p.kernel = AttentionKernel::kAuto;
  // bf16 caches are read as they are.
  p.swa_cache.dtype = p.extra_cache.dtype = CacheDtype::kBf16;
  EXPECT_FALSE(plan(132, -1).decoded_keys);
}

// Query groups: the unions' workspace is [G, cap] slots and token bits and [G, 2] lens, each
// rounded up to 16 bytes; the pair kernel takes them, unsplit.
TEST(AttentionPlan, QueryGroupsTakeThePrefillKernelWhenTheyFillTheSms) {
  constexpr int kSms = 132;
  SparseAttentionParams p;
  p.num_heads = 8;
  p.swa_indices.width = 128;
  p.extra_indices.rows = 1;
  p.extra_indices.width = 512;
  p.query_group_size = 2;
  auto plan = [&](int64_t tokens, int64_t workspace) {
    p.num_tokens = tokens;
    p.swa_indices.rows = tokens;
    p.extra_indices.rows = tokens;
    return plan_on(p, kSms, workspace);
  };
  auto union_bytes = [](int64_t groups, int64_t cap) {
    return 2 * ((groups * cap * 4 + 15) / 16 * 16) + (groups * 8 + 15) / 16 * 16;
  };
  // 600 tokens = 300 groups of 2 x 8 heads (16 rows), unions of at most 1280 entries.
  Sm90Plan d = plan(600, -1);
  EXPECT_EQ(d.query_group, 2);
  EXPECT_EQ(d.group_cap, 1280);
  EXPECT_TRUE(pairs(d));
  EXPECT_EQ(d.splits, 1);
  EXPECT_EQ(d.workspace_bytes, union_bytes(300, 1280));
  EXPECT_EQ(plan(600, union_bytes(300, 1280)).query_group, 2);
  d = plan(600, union_bytes(300, 1280) - 1);  // no room for the unions: no groups
  EXPECT_EQ(d.query_group, 1);
  EXPECT_TRUE(pairs(d));
  EXPECT_EQ(d.workspace_bytes, 0);
  // 264 tokens = 132 groups fill the SMs; 262 (131 groups) do not: the usual plan.
  EXPECT_EQ(plan(264, -1).query_group, 2);
  d = plan(262, -1);
  EXPECT_EQ(d.query_group, 1);
  EXPECT_TRUE(pairs(d));  // 262 tokens fill the SMs without splits
  d = plan(64, -1);
  EXPECT_EQ(d.query_group, 1);
  EXPECT_TRUE(pairs(d));  // 64 tokens: two slices each, no groups
  EXPECT_EQ(d.splits, 2);
  // Forced: the pair kernel takes groups at any count, the tile32 kernel never.
  p.kernel = AttentionKernel::kSm90Pairs;
  d = plan(128, -1);
  EXPECT_EQ(d.query_group, 2);
  EXPECT_TRUE(pairs(d));
  EXPECT_EQ(d.workspace_bytes, union_bytes(64, 1280));
  p.kernel = AttentionKernel::kSm90Tile32;
  EXPECT_EQ(plan(600, -1).query_group, 1);
  p.kernel = AttentionKernel::kAuto;
  // Rows past one CTA (2 x 64 heads), entries past one union CTA (8 x 640), bf16 caches: none.
  p.num_heads = 64;
  EXPECT_EQ(plan(600, -1).query_group, 1);
  p.num_heads = 8;
  p.query_group_size = 8;
  EXPECT_EQ(plan(2400, -1).query_group, 1);
  p.query_group_size = 2;
  p.swa_cache.dtype = CacheDtype::kBf16;
  p.extra_cache.dtype = CacheDtype::kBf16;
  EXPECT_EQ(plan(600, -1).query_group, 1);
}

// Each threshold of the plan (src/attention/sm90_plan.cc) just below and at (or just above) its
// value, on a 132-SM device with ideal clusters.
constexpr int kSms = 132;
constexpr int64_t kRow = 2056;
static const uint8_t kBytes[16] = {};  // cache addresses only: nothing is read

// fp8_ds_mla rows of `width` SWA keys only, `heads` heads, `tokens` tokens.
SparseAttentionParams swa_only(int32_t heads, int64_t tokens, int32_t width) {
  SparseAttentionParams p;
  p.num_heads = heads;
  p.num_tokens = p.swa_indices.rows = tokens;
  p.swa_indices.width = width;
  return p;
}

TEST(Sm90PlanThresholds, KeyListsOfFewerThanEightTilesRunWhole) {
  // kMinTilesToSplit = 8 tiles of 32 keys: 224 keys (7 tiles) never split, 225 (8 tiles) do.
  EXPECT_EQ(plan_on(swa_only(64, 1, 224), kSms, -1).splits, 1);
  EXPECT_GT(plan_on(swa_only(64, 1, 225), kSms, -1).splits, 1);
}

TEST(Sm90PlanThresholds, FewBf16ItemsTakeTheTile32KernelsSingleTiles) {
  // kMinBf16PairItems = 5: bf16 rows of 640 keys (10 pairs of 32-key blocks), 4 items: 33 SMs a
  // row, slices of one pair: the tile32 kernel; 5 items: the bf16 pair kernel.
  SparseAttentionParams p = swa_only(64, 4, 640);
  p.swa_cache = {kBytes, 1, 64, 64 * 1024, CacheDtype::kBf16, MemorySpace::kDevice};
  Sm90Plan d = plan_on(p, kSms, -1);
  EXPECT_EQ(d.family, kTile32);
  EXPECT_EQ(d.splits, 20);
  p.num_tokens = p.swa_indices.rows = 5;
  d = plan_on(p, kSms, -1);
  EXPECT_EQ(d.family, kPairsBf16);
  EXPECT_EQ(d.splits, 5);  // 26 SMs a row, 5 pairs of 64-key blocks: one each
  // Slices of two pairs of 32-key blocks or more take the pair kernel at any item count: one item
  // on 8 SMs (10 pairs, 2 a slice) does, on 10 SMs (one pair a slice) it does not.
  p = swa_only(64, 1, 640);
  p.swa_cache = {kBytes, 1, 64, 64 * 1024, CacheDtype::kBf16, MemorySpace::kDevice};
  EXPECT_EQ(plan_on(p, 8, -1).family, kPairsBf16);
  EXPECT_EQ(plan_on(p, 10, -1).family, kTile32);
}

TEST(Sm90PlanThresholds, FewFp8ItemsMergeThroughTheMergeKernel) {
  // kMinClusterItems = 16: fp8_ds_mla rows of 640 keys, 15 items (8 SMs each, 10 pairs in 5
  // slices of 2) merge by the merge kernel, 16 items in clusters of 5.
  Sm90Plan d = plan_on(swa_only(64, 15, 640), kSms, -1);
  EXPECT_EQ(d.splits, 5);
  EXPECT_FALSE(d.cluster_merge);
  d = plan_on(swa_only(64, 16, 640), kSms, -1);
  EXPECT_EQ(d.splits, 5);
  EXPECT_TRUE(d.cluster_merge);
  // Forced, the pair kernels keep clusters at any count; the override sends them to the merge.
  SparseAttentionParams p = swa_only(64, 15, 640);
  p.kernel = AttentionKernel::kSm90Pairs;
  EXPECT_TRUE(plan_on(p, kSms, -1).cluster_merge);
  AttentionOverrides no_clusters;
  no_clusters.cluster_merge = false;
  d = plan_on(swa_only(64, 16, 640), kSms, -1, no_clusters);
  EXPECT_EQ(d.splits, 5);  // the same slices
  EXPECT_FALSE(d.cluster_merge);
}

TEST(Sm90PlanThresholds, Bf16TailsOfAQuarterOfTheSmsTakeSlices) {
  // kBf16TailShare = 4: bf16 rows of 640 keys at 64 heads; a last wave of 33 items (132 / 4)
  // takes slices, one of 34 runs whole.
  SparseAttentionParams p = swa_only(64, kSms + 33, 640);
  p.swa_cache = {kBytes, 1, 64, 64 * 1024, CacheDtype::kBf16, MemorySpace::kDevice};
  Sm90Plan d = plan_on(p, kSms, -1);
  EXPECT_EQ(d.family, kPairsBf16);
  EXPECT_EQ(d.whole_tokens, kSms);
  EXPECT_EQ(d.splits, 4);  // 132 / 33 SMs a token, 5 pairs
  EXPECT_EQ(d.workspace_bytes, 4 * 33 * 64 * kRow);
  p.num_tokens = p.swa_indices.rows = kSms + 34;
  EXPECT_EQ(plan_on(p, kSms, -1).splits, 1);
  // fp8_ds_mla rows read directly split a tail of any size.
  EXPECT_EQ(plan_on(swa_only(64, kSms + 34, 640), kSms, -1).splits, 3);
}

TEST(Sm90PlanThresholds, LastWaveSlicesPayOnlyWhereASlicePlusTheMergeIsShorter) {
  // kMergeCostPairs = 1: a slice pays where its pairs + 1 < the row's pairs. fp8_ds_mla rows of
  // 256 keys (4 pairs), one tail token: 4 slices of one pair (2 < 4); of 320 keys (5 pairs), a
  // tail of 66 tokens: 2 slices of 3 pairs (4 < 5).
  EXPECT_EQ(plan_on(swa_only(64, kSms + 1, 256), kSms, -1).splits, 4);
  EXPECT_EQ(plan_on(swa_only(64, kSms + 66, 320), kSms, -1).splits, 2);
  // A tail of 67 tokens leaves one slice a token (132 / 67): nothing to gain.
  EXPECT_EQ(plan_on(swa_only(64, kSms + 67, 320), kSms, -1).splits, 1);
  // Rows of 2 pairs: a slice of 1 pair + the merge is not shorter than 2 pairs.
  EXPECT_EQ(plan_on(swa_only(64, kSms + 1, 128), kSms, -1).splits, 1);
}

TEST(Sm90PlanThresholds, TheMergeKernelTakes128ThreadsARowWhileTheRowsFitOneWave) {
  // kMergeWaveThreadsPerSm = 1024: 132 SMs hold 1056 rows at 128 threads a row. 1 token x 128
  // heads of 640 keys (2 items, 66 SMs each): 128 split rows.
  Sm90Plan d = plan_on(swa_only(128, 1, 640), kSms, -1);
  EXPECT_GT(d.splits, 1);
  EXPECT_EQ(d.merge_row_threads, 128);
  // 8 tokens x 128 heads = 1024 rows; 9 x 128 = 1152 rows.
  d = plan_on(swa_only(128, 8, 640), kSms, -1);
  EXPECT_GT(d.splits, 1);
  EXPECT_EQ(d.merge_row_threads, 128);
  d = plan_on(swa_only(128, 9, 640), kSms, -1);
  EXPECT_GT(d.splits, 1);
  EXPECT_EQ(d.merge_row_threads, 32);
  EXPECT_EQ(plan_on(swa_only(128, 9, 640), kSms, 0).merge_row_threads, 0);  // unsplit
}

TEST(Sm90PlanThresholds, QueryGroupsNeedAWaveOfGroupsAndFitOneCtaAndOneUnion) {
  SparseAttentionParams p = swa_only(8, 2 * kSms, 128);
  p.extra_indices.rows = p.num_tokens;
  p.extra_indices.width = 512;
  p.query_group_size = 2;
  // kMinQueryGroupWaves = 1: 132 groups of 2 fill the SMs, 131 do not.
  EXPECT_EQ(plan_on(p, kSms, -1).query_group, 2);
  p.num_tokens = p.swa_indices.rows = p.extra_indices.rows = 2 * kSms - 2;
  EXPECT_EQ(plan_on(p, kSms, -1).query_group, 1);
  p.num_tokens = p.swa_indices.rows = p.extra_indices.rows = 2 * kSms;
  // g x H <= 64 rows: 2 x 32 heads group, 2 x 33 do not.
  p.num_heads = 32;
  EXPECT_EQ(plan_on(p, kSms, -1).query_group, 2);
  p.num_heads = 33;
  EXPECT_EQ(plan_on(p, kSms, -1).query_group, 1);
  p.num_heads = 8;
  // kMaxGroupEntries = 4096: 2 x (128 + 1920) entries group, 2 x (128 + 1921) do not.
  p.extra_indices.width = 1920;
  EXPECT_EQ(plan_on(p, kSms, -1).query_group, 2);
  p.extra_indices.width = 1921;
  EXPECT_EQ(plan_on(p, kSms, -1).query_group, 1);
  p.extra_indices.width = 512;
  // kMaxKeySpace: the two caches' slots below 2^31 together.
  p.swa_cache = {kBytes,   (int64_t{1} << 30) / 64, 64,
                 64 * 584, CacheDtype::kFp8DsMla,   MemorySpace::kDevice};
  p.extra_cache = p.swa_cache;
  p.extra_cache.num_blocks -= 1;
  EXPECT_EQ(plan_on(p, kSms, -1).query_group, 2);  // 2^31 - 64 slots
  p.extra_cache.num_blocks += 1;
  EXPECT_EQ(plan_on(p, kSms, -1).query_group, 1);  // 2^31 slots
}

TEST(Sm90PlanThresholds, DecodedKeysNeedTwoWavesAndFourReadsASlot) {
  // 64 heads, 128 + 512 keys a token over one cache.
  SparseAttentionParams p = swa_only(64, 2 * kSms, 128);
  p.swa_cache = {kBytes, 16, 64, 64 * 584, CacheDtype::kFp8DsMla, MemorySpace::kDevice};
  p.extra_cache = p.swa_cache;
  p.extra_indices.rows = p.num_tokens;
  p.extra_indices.width = 512;
  // kMinDecodedKeyWaves = 2: 264 items decode, 263 do not.
  Sm90Plan d = plan_on(p, kSms, -1);
  EXPECT_TRUE(d.decoded_keys);
  EXPECT_EQ(d.family, kPairsBf16);
  EXPECT_EQ(d.decoded_slots, 1024);
  EXPECT_EQ(d.decoded_extra_slot0, 0);  // one cache: one slot space
  p.num_tokens = p.swa_indices.rows = p.extra_indices.rows = 2 * kSms - 1;
  EXPECT_FALSE(plan_on(p, kSms, -1).decoded_keys);
  // kMinDecodedReadsPerSlot = 4: 264 tokens x 640 entries = 168960 = 4 x 42240 slots decode;
  // 42241 slots (one more page of 1) do not.
  p.num_tokens = p.swa_indices.rows = p.extra_indices.rows = 2 * kSms;
  p.swa_cache.block_size = p.extra_cache.block_size = 1;
  p.swa_cache.num_blocks = p.extra_cache.num_blocks = 42240;
  EXPECT_TRUE(plan_on(p, kSms, -1).decoded_keys);
  p.swa_cache.num_blocks = p.extra_cache.num_blocks = 42241;
  EXPECT_FALSE(plan_on(p, kSms, -1).decoded_keys);
  // The override reads the caches directly.
  p.swa_cache.num_blocks = p.extra_cache.num_blocks = 42240;
  AttentionOverrides direct;
  direct.decoded_keys = false;
  d = plan_on(p, kSms, -1, direct);
  EXPECT_FALSE(d.decoded_keys);
  EXPECT_EQ(d.family, kPairsFp8);
}

TEST(Sm90PlanThresholds, SixteenHeadsOrFewerOnBf16RowsTakeTheFewHeadsKernel) {
  SparseAttentionParams p = swa_only(16, 4096, 640);
  p.swa_cache = {kBytes, 1, 64, 64 * 1024, CacheDtype::kBf16, MemorySpace::kDevice};
  EXPECT_EQ(plan_on(p, kSms, 0).family, kFewHeads);
  p.num_heads = 17;
  EXPECT_EQ(plan_on(p, kSms, 0).family, kPairsBf16);
  p.num_heads = 1;
  EXPECT_EQ(plan_on(p, kSms, 0).family, kFewHeads);
  AttentionOverrides sixty_four_rows;
  sixty_four_rows.few_heads = false;
  EXPECT_EQ(plan_on(p, kSms, 0, sixty_four_rows).family, kPairsBf16);
  // Slices that fill the SMs once (a small batch) stay on the 64-row kernel.
  p.num_tokens = p.swa_indices.rows = 8;
  const Sm90Plan d = plan_on(p, kSms, -1);
  EXPECT_GT(d.splits, 1);
  EXPECT_EQ(d.whole_tokens, 0);
  EXPECT_EQ(d.family, kPairsBf16);
  // fp8_ds_mla rows read directly stay on the 64-row kernel.
  p.swa_cache.dtype = CacheDtype::kFp8DsMla;
  EXPECT_EQ(plan_on(p, kSms, 0).family, kPairsFp8);
}

TEST(Sm90PlanThresholds, TheSm90KernelsReadFp8DsMlaOrBf16CachesAlike) {
  SparseAttentionParams p = swa_only(8, 1, 64);
  EXPECT_TRUE(detail::sm90_reads_caches(p));
  p.swa_cache.dtype = CacheDtype::kBf16;
  EXPECT_TRUE(detail::sm90_reads_caches(p));
  p.extra_indices.rows = 1;
  p.extra_cache.dtype = CacheDtype::kFp8DsMla;
  EXPECT_FALSE(detail::sm90_reads_caches(p));
  p.extra_cache.dtype = CacheDtype::kBf16;
  EXPECT_TRUE(detail::sm90_reads_caches(p));
  p.swa_cache.dtype = p.extra_cache.dtype = CacheDtype::kFp8E4m3;
  EXPECT_FALSE(detail::sm90_reads_caches(p));
}

}  // namespace
}  // namespace sparse_swa
