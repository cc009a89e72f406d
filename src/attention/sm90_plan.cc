// SPDX-License-Identifier: Apache-2.0
// The sm_90a attention plan (sm90_plan.h): plain arithmetic on shapes. Every threshold below is
// a named constant with its reason; docs/design.md gives each rule's measurements' lesson.
#include "attention/sm90_plan.h"

#include <algorithm>
#include <cstdint>

#include "attention/sm90_shapes.h"
#include "common/swa_formulas.h"

namespace sparse_swa::detail {
namespace {

using formulas::ceil_div;
using sm90::kPartialRowBytes;

// Split-KV pays a partial row per slice and a merge, so a key list of fewer tiles of 32 keys
// runs whole (docs/design.md#splits).
constexpr int64_t kMinTilesToSplit = 8;
// The tile32 kernel's slices hold at least this many tiles (docs/design.md#splits).
constexpr int64_t kMinTile32SliceTiles = 1;
// Split bf16 rows of fewer (token, head group) items whose pair slices would hold a single pair
// take the tile32 kernel's single tiles, whose critical path is shorter (docs/design.md#splits).
constexpr int64_t kMinBf16PairItems = 5;
// Unforced fp8_ds_mla splits of fewer items merge through the merge kernel: in clusters they
// were slower there (docs/design.md#splits).
constexpr int64_t kMinClusterItems = 16;
// Past one wave on bf16 rows, only a tail of at most 1 / kBf16TailShare of the SMs' items takes
// slices: a walking CTA starts its next item as the last ends, so a whole tail costs about one
// item while the partials and the merge grow with it (docs/design.md#splits).
constexpr int64_t kBf16TailShare = 4;
// A last-wave slice pays the merge, about one pair of blocks: slices pay only where a slice
// plus that is shorter than the whole row (docs/design.md#splits).
constexpr int64_t kMergeCostPairs = 1;
// The merge kernel takes 128 threads a row while the rows fit the SMs in one wave at this many
// threads an SM (its 256-thread CTAs fit 5 to an SM at 48 registers; 1024 keeps a margin), else
// a warp a row, which needs fewer registers per row (docs/design.md#splits).
constexpr int64_t kMergeWaveThreadsPerSm = 1024;
// Query groups pay only when the groups alone fill the SMs: a CTA walks its group's union,
// longer than one token's list (docs/design.md#query-groups).
constexpr int64_t kMinQueryGroupWaves = 1;
// Decoded keys pay for prefill-sized calls (two waves of CTAs or more) whose entries name each
// slot of the slot space at least kMinDecodedReadsPerSlot times on average, which bounds the
// pass's work to a fraction of the attention's (docs/design.md#decoded-keys).
constexpr int64_t kMinDecodedKeyWaves = 2;
constexpr int64_t kMinDecodedReadsPerSlot = 4;
// Slot ids of both caches as one key space (query-group unions, decoded keys) stay below 2^31
// (docs/design.md#query-groups, #decoded-keys).
constexpr int64_t kMaxKeySpace = int64_t{1} << 31;

// Every segment an fp8_ds_mla cache (read directly unless the plan decodes the keys first).
bool fp8_rows(const SparseAttentionParams& p) {
  return p.swa_cache.dtype == CacheDtype::kFp8DsMla &&
         (p.extra_indices.rows == 0 || p.extra_cache.dtype == CacheDtype::kFp8DsMla);
}

// Whether a caller's workspace of workspace_bytes (< 0: any size, for sizing) holds `bytes`.
bool workspace_fits(int64_t workspace_bytes, int64_t bytes) {
  return workspace_bytes < 0 || workspace_bytes >= bytes;
}

// The pairs of blocks a row of max_keys keys takes in the pair kernels, whose slices are whole
// pairs: of 32-key blocks (fp8_ds_mla rows), of 64-key blocks (bf16 rows).
int64_t pair_count(int64_t max_keys, bool bf16_rows) {
  const int64_t block = bf16_rows ? sm90::pairs_bf16::kBlockKeys : sm90::pairs_fp8::kBlockKeys;
  return ceil_div(max_keys, 2 * block);
}

// Pairs a slice when a row's `pairs` go into at most n slices of one size (as few as that size
// needs: ceil_div(pairs, the result)).
int64_t even_slice_pairs(int64_t pairs, int64_t n) { return ceil_div(pairs, std::min(n, pairs)); }

// Query groups (docs/design.md#query-groups) go to the fp8_ds_mla pair kernel when a group's
// rows fit one CTA (g x H <= 64), its entries one union CTA, and the two caches' slot ids one
// key space; unforced, only when the groups fill the SMs.
bool query_groups_apply(const SparseAttentionParams& p, int64_t max_keys, int num_sms) {
  const int64_t g = p.query_group_size;
  const bool extra = p.extra_indices.rows != 0;
  const int64_t slots = p.swa_cache.num_slots() + (extra ? p.extra_cache.num_slots() : 0);
  const int64_t groups = ceil_div(p.num_tokens, g);
  return g > 1 && p.num_tokens > 0 && p.kernel != AttentionKernel::kSm90Tile32 &&
         (p.kernel == AttentionKernel::kSm90Pairs || groups >= kMinQueryGroupWaves * num_sms) &&
         fp8_rows(p) && g * p.num_heads <= sm90::kHeadGroup &&
         g * max_keys <= sm90::pairs_fp8::kMaxGroupEntries && slots < kMaxKeySpace;
}

// Decoded keys: the slot space of the two caches (one cache's when both segments view the same
// one) and where the extra cache's slots start in it.
struct DecodedSlots {
  int64_t slots, first1;
};
DecodedSlots decoded_slots(const SparseAttentionParams& p) {
  const int64_t n0 = p.swa_cache.num_slots();
  if (p.extra_indices.rows == 0) return {n0, n0};
  const ConstKvCacheView &c0 = p.swa_cache, &c1 = p.extra_cache;
  const bool same = c0.data == c1.data && c0.num_blocks == c1.num_blocks &&
                    c0.block_size == c1.block_size && c0.page_stride_bytes == c1.page_stride_bytes;
  return same ? DecodedSlots{n0, 0} : DecodedSlots{n0 + c1.num_slots(), n0};
}

bool decoded_keys_apply(const SparseAttentionParams& p, int64_t slots, int64_t max_keys,
                        int num_sms, int64_t ctas, const AttentionOverrides& o) {
  return o.decoded_keys && p.kernel != AttentionKernel::kSm90Tile32 && fp8_rows(p) &&
         ctas >= kMinDecodedKeyWaves * num_sms && slots > 0 && slots < kMaxKeySpace &&
         p.num_tokens * max_keys >= kMinDecodedReadsPerSlot * slots;
}

// Past one wave of CTAs on the 64-row pair kernels -- fp8_ds_mla rows read directly (one CTA per
// item) and bf16 rows (CTAs walking items, one per SM) -- the items of the last, partial wave
// would take a whole row's time on a few SMs. Instead the tokens of the full waves run whole and
// the last wave's tokens take slices that spread them over every SM: returns how many (1: none),
// the last wave's tokens in tail_tokens, so that tail_tokens x groups x slices <= SMs.
int64_t last_wave_slices(const SparseAttentionParams& p, const SmCapacity& sms, int64_t groups,
                         int64_t max_keys, bool bf16_rows, int64_t* tail_tokens) {
  const int64_t ctas = p.num_tokens * groups;
  const int64_t rest = sms.num_sms > 0 ? ctas % sms.num_sms : 0;
  if (rest == 0) return 1;
  if (bf16_rows && kBf16TailShare * rest > sms.num_sms) return 1;
  const int64_t pairs = pair_count(max_keys, bf16_rows);
  *tail_tokens = ceil_div(rest, groups);
  const int64_t slices = std::min(pairs, sms.num_sms / (*tail_tokens * groups));
  const int64_t per = slices > 0 ? ceil_div(pairs, slices) : pairs;
  return per + kMergeCostPairs < pairs ? slices : 1;
}

// Whether the kernels of a plan read bf16 rows: bf16 caches, or decoded keys.
bool reads_bf16_rows(const SparseAttentionParams& p, bool decoded_keys) {
  return p.swa_cache.dtype == CacheDtype::kBf16 || decoded_keys;
}

// A plan under construction: the pair kernels unless `tile32`.
struct Draft {
  Sm90Plan plan;
  bool tile32 = false;
};

// Adds the last wave's slices to an unsplit pair-kernel plan past one wave, its partials after
// the plan's own workspace bytes (decoded keys), when the caller's workspace holds both.
void add_last_wave_slices(const SparseAttentionParams& p, const SmCapacity& sms, int64_t max_keys,
                          int64_t workspace_bytes, Draft& d) {
  Sm90Plan& plan = d.plan;
  int64_t tail_tokens = 0;
  const int64_t slices =
      d.tile32 ? 1
               : last_wave_slices(p, sms, plan.groups, max_keys,
                                  reads_bf16_rows(p, plan.decoded_keys), &tail_tokens);
  const int64_t bytes =
      plan.workspace_bytes + slices * tail_tokens * p.num_heads * kPartialRowBytes;
  if (slices > 1 && workspace_fits(workspace_bytes, bytes)) {
    plan.splits = static_cast<int32_t>(slices);
    plan.whole_tokens = static_cast<int32_t>(p.num_tokens - tail_tokens);
    plan.partials_offset = plan.workspace_bytes;
    plan.workspace_bytes = bytes;
  }
}

// Query groups, decoded keys or slices (docs/design.md#splits) for the 64-row kernels.
Draft spread(const SparseAttentionParams& p, const SmCapacity& sms, int64_t workspace_bytes,
             const AttentionOverrides& o) {
  const int num_sms = sms.num_sms;
  Draft d;
  Sm90Plan& plan = d.plan;
  plan.groups = static_cast<int32_t>(ceil_div(p.num_heads, sm90::kHeadGroup));
  const int64_t ctas = p.num_tokens * plan.groups;
  const int64_t max_keys =
      int64_t{p.swa_indices.width} + (p.extra_indices.rows != 0 ? p.extra_indices.width : 0);
  // The pair kernels take every unsplit call (faster unsplit at every benchmarked shape) and
  // most split ones (below).
  d.tile32 = p.kernel == AttentionKernel::kSm90Tile32;
  if (query_groups_apply(p, max_keys, num_sms)) {
    const int64_t g = p.query_group_size;
    const int64_t bytes = query_group_workspace_bytes(ceil_div(p.num_tokens, g), g * max_keys);
    if (workspace_fits(workspace_bytes, bytes)) {
      plan.query_group = static_cast<int32_t>(g);
      plan.group_cap = g * max_keys;
      plan.workspace_bytes = bytes;
      return d;
    }
  }
  if (const DecodedSlots ds = decoded_slots(p);
      decoded_keys_apply(p, ds.slots, max_keys, num_sms, ctas, o)) {
    const int64_t bytes = ds.slots * sm90::kBf16RowBytes;
    if (workspace_fits(workspace_bytes, bytes)) {
      plan.decoded_keys = true;
      plan.decoded_slots = ds.slots;
      plan.decoded_extra_slot0 = ds.first1;
      plan.workspace_bytes = bytes;
      add_last_wave_slices(p, sms, max_keys, workspace_bytes, d);
      return d;
    }
  }
  const int64_t max_tiles = ceil_div(max_keys, sm90::tile32::kTileKeys);
  if (ctas == 0 || max_tiles < kMinTilesToSplit) return d;
  if (ctas >= num_sms) {
    add_last_wave_slices(p, sms, max_keys, workspace_bytes, d);
    return d;
  }
  // Fill the SMs once. The pair kernels' slices are whole pairs of blocks, as few as give the
  // widest row's pairs the same slice size (so that no CTA of a full row idles); they take every
  // split of fp8_ds_mla rows, and of bf16 rows from kMinBf16PairItems items on or where a slice
  // gets two pairs of 32-key blocks; else the tile32 kernel's single-tile slices.
  const int64_t per_row = num_sms / ctas;
  const bool auto_kernel = p.kernel == AttentionKernel::kAuto;
  const bool fp8 = fp8_rows(p);
  const bool pairs = auto_kernel
                         ? fp8 || even_slice_pairs(pair_count(max_keys, false), per_row) >= 2 ||
                               ctas >= kMinBf16PairItems
                         : !d.tile32;
  const bool clusters = pairs && !(auto_kernel && fp8 && ctas < kMinClusterItems);
  int64_t splits = 0;
  if (pairs) {
    // Counted in the kernel's own pairs, so that every slice holds keys.
    const int64_t kernel_pairs = pair_count(max_keys, !fp8);
    int64_t per = even_slice_pairs(kernel_pairs, per_row);
    splits = ceil_div(kernel_pairs, per);
    // A cluster's slices merge in the kernel, so all of a call's clusters must run at once: a
    // second wave of them would double the time.
    while (clusters && splits > 1 && splits <= sm90::kMaxClusterSplits &&
           ctas > sms.clusters[splits]) {
      splits = ceil_div(kernel_pairs, ++per);
    }
  } else {
    splits = std::min(per_row, max_tiles / kMinTile32SliceTiles);
  }
  const int64_t row_bytes = p.num_tokens * p.num_heads * kPartialRowBytes;
  if (workspace_bytes >= 0) splits = std::min(splits, workspace_bytes / row_bytes);
  if (splits <= 1) return d;
  d.tile32 = !pairs;
  plan.splits = static_cast<int32_t>(splits);
  plan.cluster_merge = clusters && splits <= sm90::kMaxClusterSplits && o.cluster_merge;
  plan.workspace_bytes = splits * row_bytes;
  return d;
}

}  // namespace

bool sm90_reads_caches(const SparseAttentionParams& p) {
  const CacheDtype d = p.swa_cache.dtype;
  if (d != CacheDtype::kFp8DsMla && d != CacheDtype::kBf16) return false;
  return p.extra_indices.rows == 0 || p.extra_cache.dtype == d;
}

SmCapacity SmCapacity::ideal(int32_t num_sms) {
  SmCapacity c;
  c.num_sms = num_sms;
  for (int size = 1; size < 9; ++size) c.clusters[size] = num_sms / size;
  return c;
}

int64_t query_group_part_bytes(int64_t groups, int64_t cap) {
  return formulas::round_up(groups * cap * 4, 16);
}
int64_t query_group_workspace_bytes(int64_t groups, int64_t cap) {
  return 2 * query_group_part_bytes(groups, cap) + formulas::round_up(groups * 2 * 4, 16);
}

Sm90Plan plan_sm90_attention(const SparseAttentionParams& p, const SmCapacity& sms,
                             int64_t workspace_bytes, const AttentionOverrides& o) {
  Draft d = spread(p, sms, workspace_bytes, o);
  Sm90Plan& plan = d.plan;
  const bool bf16_rows = reads_bf16_rows(p, plan.decoded_keys);
  // Few heads (docs/design.md#few-heads): a pair plan with a key list per token on bf16 rows at
  // 1..16 heads, unsplit or with the last wave's slices, never those that fill the SMs once.
  const bool few_heads = o.few_heads && !d.tile32 && bf16_rows &&
                         (plan.splits == 1 || plan.whole_tokens > 0) && plan.query_group == 1 &&
                         p.num_heads <= sm90::few_heads::kMaxHeads && p.num_tokens > 0;
  plan.family = d.tile32    ? Sm90Family::kTile32
                : few_heads ? Sm90Family::kFewHeads
                : bf16_rows ? Sm90Family::kPairsBf16
                            : Sm90Family::kPairsFp8;
  if (plan.splits > 1) {
    const int64_t split_rows = (p.num_tokens - plan.whole_tokens) * p.num_heads;
    plan.merge_row_threads = split_rows * 128 <= sms.num_sms * kMergeWaveThreadsPerSm ? 128 : 32;
  }
  return plan;
}

}  // namespace sparse_swa::detail
