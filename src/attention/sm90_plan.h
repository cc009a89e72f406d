// SPDX-License-Identifier: Apache-2.0
// The plan of the sm_90a attention kernels: which kernel family runs a call, how many slices a
// token's keys take, query groups, decoded keys and the workspace they use -- from shapes and
// plain device facts only, never from device data. Plain C++ (CPU-only builds compile it and
// its unit tests, tests/attention/sm90_plan_test.cc); the CUDA launcher
// (src/cuda/attention/sm90_launch.cc) runs what it plans. Each rule is docs/design.md's
// (#splits, #query-groups, #decoded-keys, #few-heads).
#pragma once

#include <cstdint>

#include "attention/overrides.h"
#include "sparse_swa/attention.h"

namespace sparse_swa::detail {

// How many CTAs that fill an SM each (the pair kernels: one CTA an SM) run at once, alone and in
// clusters of `size` (2..8, the portable sizes): a GPC holds whole clusters only, so a device
// holds fewer than num_sms / size of them (an H100 SXM with 132 SMs: 66 pairs, 39 of 3, 30 of 4,
// 22 of 5, 17 of 6, 15 of 7 or 8).
struct SmCapacity {
  int32_t num_sms = 0;
  int32_t clusters[9] = {};  // [size], size 2..8
  // num_sms / size clusters of every size: a device whose GPCs never leave SMs idle.
  static SmCapacity ideal(int32_t num_sms);
};

// The kernel a plan runs (docs/design.md#attention-kernels).
enum class Sm90Family : int32_t {
  kTile32 = 0,     // 32-key tiles, P in two bf16 parts (src/cuda/attention/sm90_tile32_kernel.cu)
  kPairsFp8 = 1,   // pairs of 32-key blocks decoded from fp8_ds_mla rows
  kPairsBf16 = 2,  // pairs of 64-key blocks of bf16 rows (bf16 caches or decoded keys)
  kFewHeads = 3,   // 1..16 heads on bf16 rows, keys as the MMA's rows
};

// How one call is spread over CTAs. A CTA (an item, for kernels whose CTAs walk items) takes one
// query token, up to 64 of its heads and one of `splits` slices of the token's key list.
struct Sm90Plan {
  Sm90Family family = Sm90Family::kPairsFp8;
  int32_t groups = 0;  // head groups of 64: ceil(H / 64) items per token and split
  int32_t splits = 1;  // > 1 only with a workspace of workspace_bytes
  // With splits > 1 on a pair or few-heads kernel, not cluster-merged: the first tokens, which
  // fill whole waves of SMs, run unsplit and only the last wave's tokens take `splits` slices
  // (docs/design.md#splits). 0: every token is split.
  int32_t whole_tokens = 0;
  // A pair kernel's 2..8 slices of a (token, head group) as one cluster, merged in the kernel;
  // else partials for the merge kernel. The launcher still falls back to the merge kernel where
  // such clusters cannot run.
  bool cluster_merge = false;
  // The merge kernel's threads a row (128 while the rows fill the SMs about once, else 32), for
  // split plans.
  int32_t merge_row_threads = 0;
  // > 1: a kPairsFp8 CTA takes a query group of this many tokens (all heads) over the union of
  // their key lists (docs/design.md#query-groups), built into the workspace; never split.
  int32_t query_group = 1;
  int64_t group_cap = 0;  // entries per group's union: query_group x (both row widths)
  // Decoded keys (docs/design.md#decoded-keys): the fp8_ds_mla slots decoded once into a bf16
  // copy at the workspace's start, read by the bf16 kernels as caches of `decoded_slots` slots,
  // the extra cache's from `decoded_extra_slot0` on.
  bool decoded_keys = false;
  int64_t decoded_slots = 0;
  int64_t decoded_extra_slot0 = 0;
  int64_t workspace_bytes = 0;
  // With splits > 1 and not cluster-merged: where the slices' partials start in the workspace
  // (after the decoded keys' rows, where the plan has them).
  int64_t partials_offset = 0;
};

// Every segment an fp8_ds_mla cache, or every segment a bf16 cache: the caches the sm_90a
// kernels read (the device must also run their sm_90a code).
bool sm90_reads_caches(const SparseAttentionParams& p);

// The plan for p (whose caches sm90_reads_caches) on a device of `sms`; `workspace_bytes` < 0
// plans as much workspace as wanted (for sizing), else never more than it. params.kernel forces
// a family (kSm90Tile32: the tile32 kernel; kSm90Pairs: the pair or few-heads kernels).
Sm90Plan plan_sm90_attention(const SparseAttentionParams& p, const SmCapacity& sms,
                             int64_t workspace_bytes, const AttentionOverrides& overrides = {});

// The query groups' unions in the workspace, from its start: [groups, cap] slots, [groups, cap]
// token bits, [groups, 2] lens, each part 16-byte aligned.
int64_t query_group_part_bytes(int64_t groups, int64_t cap);
int64_t query_group_workspace_bytes(int64_t groups, int64_t cap);

}  // namespace sparse_swa::detail
