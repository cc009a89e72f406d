// SPDX-License-Identifier: Apache-2.0
// The kernel parameters of the sm_90a attention, one POD per kernel family, built by the
// launcher (sm90_launch.cc) and passed as __grid_constant__: the call's rows and key segments
// (CallRows) and its split-KV slices (SplitRows) as parts, and each family's own fields. Host
// and device code include it (no device functions here).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/sm90_shapes.h"
#include "common/swa_formulas.h"

namespace sparse_swa::detail::sm90 {

// One key segment: its index rows and its paged cache.
struct Segment {
  const int32_t* indices;  // [T, row_stride] slot ids
  const int32_t* lens;     // [T]
  int64_t row_stride;
  int32_t width;
  uint32_t num_slots;  // clamped to 2^31: an int32 slot id >= it is out of range either way
  uint32_t block_size;
  // idx / block_size for idx < 2^31 as (idx * block_magic) >> block_shift (block_divider()).
  uint64_t block_magic;
  uint32_t block_shift;
  const uint8_t* cache;  // [num_blocks, page_stride] bytes
  int64_t page_stride;
};

// The query groups' key lists (docs/design.md#query-groups): one union per group, its rows of
// `cap` entries (query_group x (SWA width + extra width)); built by query_group_union_kernel.
struct QueryGroupUnions {
  int32_t* slots;    // [groups, cap] slot ids, SWA entries first
  uint32_t* tokens;  // [groups, cap] bit j: the group's token j uses the entry
  int32_t* lens;     // [groups, 2] (SWA entries, all entries)
  int64_t cap;
  SPARSE_SWA_HD int32_t* slots_of(int64_t group) const { return slots + group * cap; }
  SPARSE_SWA_HD uint32_t* tokens_of(int64_t group) const { return tokens + group * cap; }
};

// What every attention family reads of the call: q and the outputs [T, H, 512] (in `groups` head
// groups of 64 a token), both segments. (The order keeps the 32-bit fields that the kernels read
// together in one 8-byte word.)
struct CallRows {
  const uint16_t* q;   // [T, H, 512] bf16
  uint16_t* out;       // [T, H, 512] bf16
  float* lse;          // [T, H] natural log
  const float* sinks;  // [H] or nullptr
  int32_t* bad_count;  // [1] or nullptr
  float scale_log2;    // softmax_scale * log2(e)
  int64_t num_tokens;
  int32_t num_heads;
  int32_t groups;        // ceil(H / 64)
  int32_t num_segments;  // 1 or 2
  Segment seg0, seg1;
};

// How a launch's items are split: `splits` slices of a token's key list (docs/design.md#splits).
struct SplitRows {
  // [splits, T - whole_tokens, H, 512] fp32, unnormalised; splits > 1, not cluster-merged
  float* partial_o;
  float2* partial_ml;  // [splits, T - whole_tokens, H] (running max in log2 units, sum of exp2)
  int32_t splits;
  // Split launches of the pair and few-heads kernels: tokens [0, whole_tokens) take one item per
  // (token, head group) with the whole key list and finished rows; the slices cover the later
  // tokens only (the last wave's). 0 elsewhere.
  int32_t whole_tokens;
};

// q and out for the tensor-memory accelerator (encode_head_rows): [T][H][512] bf16 tensors in
// boxes of one token's 64 heads x 64 dims, laid out as sw128 tiles; heads past H are zeros when
// loaded and left alone when stored.
struct HeadRowMaps {
  CUtensorMap q_map, out_map;
};

// sm90_tile32_kernel.cu: 32-key tiles, one CTA per (token, head group, slice).
struct Tile32Params : CallRows, SplitRows, HeadRowMaps {};

// sm90_pairs_fp8_kernel.cu: pairs of 32-key blocks decoded from fp8_ds_mla rows.
struct PairsFp8Params : CallRows, SplitRows, HeadRowMaps {
  // Query groups (SparseAttentionParams::query_group_size): a CTA's key list is its group's
  // union; rows r of the CTA are the group's (token r / H, head r % H). 1: a key list per token.
  int32_t query_group;
  int64_t key_rows;  // T, or ceil(T / query_group) groups
  QueryGroupUnions unions;
  // 1: a (token, head group)'s slices run as one cluster of `splits` CTAs and merge through
  // distributed shared memory (cluster_merge.cuh); partial_o, partial_ml unused.
  int32_t cluster_merge;
};

// sm90_pairs_bf16_kernel.cu: pairs of 64-key blocks of bf16 rows, CTAs walking items.
struct PairsBf16Params : CallRows, SplitRows, HeadRowMaps {
  int32_t cluster_merge;  // as PairsFp8Params::cluster_merge
};

// sm90_few_heads_kernel.cu: 1..16 heads on bf16 rows, CTAs walking items.
struct FewHeadsParams : CallRows, SplitRows {};

// split_merge_kernel.cu: the partials of the split rows into finished rows.
struct MergeParams : SplitRows {
  uint16_t* out;
  float* lse;
  const float* sinks;
  int64_t num_tokens;
  int32_t num_heads;
};

// query_group_union_kernel.cu: one CTA per query group.
struct UnionParams {
  int32_t* bad_count;
  int64_t num_tokens;
  int32_t num_segments;
  Segment seg0, seg1;
  int32_t query_group;
  int64_t groups;  // ceil(T / query_group)
  QueryGroupUnions unions;
};

// decode_keys_kernel.cu (docs/design.md#decoded-keys): the two caches' slots are one slot space:
// SWA slot s is k = s, extra slot s is k = first1 + s (first1 = 0 when both segments view one
// cache, else the SWA cache's slots).
struct DecodeKeysParams {
  Segment seg0, seg1;
  uint8_t* rows;  // [slots, 512] bf16: row k = slot k decoded
  int64_t slots;
  int64_t first1;
};

// The key rows (tokens, or query groups) of a launch.
SPARSE_SWA_HD int64_t key_rows(const CallRows& a) { return a.num_tokens; }
SPARSE_SWA_HD int64_t key_rows(const PairsFp8Params& a) { return a.key_rows; }
// The items a launch covers: one per whole token and head group, `splits` per split one.
template <class P>
SPARSE_SWA_HD int64_t launch_items(const P& a) {
  return (key_rows(a) * a.splits - int64_t{a.whole_tokens} * (a.splits - 1)) * a.groups;
}
// Whether token t's rows are finished in the kernel (an unsplit call, or a whole token of a
// last-wave split), not partials for the merge.
SPARSE_SWA_HD bool finished_token(const SplitRows& a, int64_t t) {
  return a.splits == 1 || t < a.whole_tokens;
}
// The first (token x heads + head) row that takes slices; the rows before it are finished whole.
template <class P>
SPARSE_SWA_HD int64_t first_split_row(const P& a) {
  return int64_t{a.whole_tokens} * a.num_heads;
}
// Where slice `split` of split row `row` (token x heads + head, >= first_split_row) goes in
// partial_o (x 512) and partial_ml.
template <class P>
SPARSE_SWA_HD int64_t partial_row(const P& a, int split, int64_t row) {
  const int64_t first = first_split_row(a);
  return split * (a.num_tokens * a.num_heads - first) + row - first;
}

}  // namespace sparse_swa::detail::sm90
