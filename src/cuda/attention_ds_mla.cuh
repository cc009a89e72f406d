// SPDX-License-Identifier: Apache-2.0
// The tensor-core sparse attention over fp8_ds_mla or bf16 caches (src/cuda/attention_ds_mla.cu):
// its plan and launcher. Plain C++ apart from the stream type.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "sparse_swa/attention.h"

namespace sparse_swa::detail {

// How one call is spread over CTAs. A CTA takes one query token, up to 64 of its heads
// (`group_heads`) and one of `splits` contiguous slices of the token's key list.
struct DsMlaPlan {
  int32_t group_heads = 0;
  int32_t groups = 0;  // ceil(H / group_heads) CTAs per token and split
  int32_t splits = 1;  // > 1 only with a workspace of workspace_bytes
  // With splits > 1 on the prefill kernel, not cluster-merged: the first tokens, which fill whole
  // waves of SMs, run unsplit and only the last wave's tokens take `splits` slices each
  // (docs/design.md#splits). 0: every token is split.
  int32_t whole_tokens = 0;
  bool prefill = false;  // the prefill kernel (slices of whole 64-key pairs), else the decode one
  // The prefill kernel's 2..8 slices of a (token, head group) as one cluster, merged in the
  // kernel (docs/design.md#attention-kernels); else partials for the merge kernel. The launcher
  // still falls back to the merge kernel where such clusters cannot run.
  bool cluster_merge = false;
  // > 1: a prefill CTA takes a query group of this many tokens (all heads) over the union of
  // their key lists (docs/design.md#query-groups), built into the workspace; never split.
  int32_t query_group = 1;
  int64_t group_cap = 0;  // entries per group's union: query_group x (both row widths)
  // Decoded keys (docs/design.md#decoded-keys): the fp8_ds_mla keys the rows name are decoded once
  // into a bf16 copy of the caches in the workspace, which the bf16 prefill kernel reads.
  bool decoded_keys = false;
  // The few-heads kernel (docs/design.md#few-heads) instead of the bf16 prefill kernel: an unsplit
  // prefill plan on bf16 rows (bf16 caches or decoded keys) at 1..16 heads.
  bool few_heads = false;
  int64_t workspace_bytes = 0;
  // With splits > 1 and not cluster-merged: where the slices' partials start in the workspace
  // (after the decoded keys' rows, where the plan has them).
  int64_t partials_offset = 0;
};

// How many CTAs of a kernel that fills an SM (the prefill kernels: one CTA an SM) run at once,
// alone and in clusters of `size` (2..8, the portable cluster sizes): a GPC holds whole clusters
// only, so a device holds fewer than num_sms / size of them (an H100 SXM with 132 SMs: 66 pairs,
// 39 of 3, 30 of 4, 22 of 5, 17 of 6, 15 of 7 or 8).
struct SmCapacity {
  int32_t num_sms = 0;
  int32_t clusters[9] = {};  // [size], size 2..8
  // num_sms / size clusters of every size: a device whose GPCs never leave SMs idle.
  static SmCapacity ideal(int32_t num_sms);
  // The current device's (cached per device; `ideal` where it cannot be asked).
  static SmCapacity of_device(int device, int32_t num_sms);
};

// True when the tensor-core kernel takes this call: every segment an fp8_ds_mla cache, or every
// segment a bf16 cache, and the
// device runs its sm_90a machine code (elsewhere the general kernel of attention.cu runs).
bool ds_mla_attention_applies(const SparseAttentionParams& p);

// OK when the kernel params.kernel forces can take the call: the tensor-core kernels (decode and
// prefill alike) need the sm_90a code and fp8_ds_mla or bf16 caches (both segments alike).
// Otherwise INVALID_ARGUMENT naming params.kernel.
Status check_forced_ds_mla_kernel(const SparseAttentionParams& p);

// The plan from shapes alone (tokens, heads, row widths, query group size, cache sizes, the
// device's SMs and cluster capacity), never from device data: query groups (prefill kernel) when
// they fill the SMs and the workspace holds their unions; else decoded keys for prefill-sized calls
// on fp8_ds_mla caches that name each slot several times, when the workspace holds them (and, as on
// bf16 rows, slices of a small last wave); else slices of the key lists (docs/design.md#splits):
// when tokens x head groups leave SMs idle, slices that fill them once -- the decode kernel's
// single tiles for bf16 rows of a few items whose slices would hold less than one of the bf16
// kernel's pairs, else the prefill kernel's whole pairs, fewer and larger where their clusters
// would not all run at once --, and past one wave of CTAs on the 64-row prefill kernels (fp8_ds_mla
// rows read directly; bf16 rows with a small tail), slices of the last wave's tokens that spread
// them over every SM; never more than the caller's workspace holds (`workspace_bytes` < 0: as many
// as wanted, for sizing). params.kernel can force either kernel; unsplit prefill plans on bf16 rows
// at 1..16 heads take the few-heads kernel.
DsMlaPlan plan_ds_mla_attention(const SparseAttentionParams& p, const SmCapacity& sms,
                                int64_t workspace_bytes);
// The same for a device of `num_sms` SMs with SmCapacity::ideal clusters.
DsMlaPlan plan_ds_mla_attention(const SparseAttentionParams& p, int num_sms,
                                int64_t workspace_bytes);

// Launches the kernel (and, when split, the merge of the slices) on `stream`; `p` has passed
// the front end's shape checks (src/attention.cc) and ds_mla_attention_applies(p).
Status launch_ds_mla_attention(const SparseAttentionParams& p, cudaStream_t stream);

}  // namespace sparse_swa::detail
