// SPDX-License-Identifier: Apache-2.0
// The tile shapes of the sm_90a attention kernels, one namespace per kernel family: plain C++,
// shared by the planner (src/attention/sm90_plan.cc) and the kernels (src/cuda/attention/), so
// that each value is written once. docs/design.md#attention-kernels describes the families.
#pragma once

#include <cstdint>

#include "sparse_swa/kv_cache.h"

namespace sparse_swa::detail::sm90 {

// Heads (MMA rows) of a CTA of the 64-row kernels: the wgmma M; fewer heads are zero rows.
inline constexpr int kHeadGroup = 64;

// A split's partial row in the workspace: 512 fp32 values and its (max, sum).
inline constexpr int64_t kPartialRowBytes = kHeadDim * 4 + 8;

// Slices of one (token, head group) merged inside a cluster: at most the portable cluster size.
inline constexpr int kMaxClusterSplits = 8;

// The tile32 kernel: 512 threads (producer, QK + softmax, two P V warpgroups) over tiles of 32
// keys, P kept as two bf16 parts.
namespace tile32 {
inline constexpr int kTileKeys = 32;
}  // namespace tile32

// The pair kernels: 384 threads (two math warpgroups, one producer) over pairs of key blocks, P
// rounded to bf16 once. fp8_ds_mla rows: blocks of 32 keys; bf16 rows: blocks of 64.
namespace pairs {
inline constexpr int kThreads = 384;
}  // namespace pairs
namespace pairs_fp8 {
inline constexpr int kBlockKeys = 32;
// A query group's entries (query_group x both row widths) that one union CTA takes.
inline constexpr int kMaxGroupEntries = 4096;
}  // namespace pairs_fp8
namespace pairs_bf16 {
inline constexpr int kBlockKeys = 64;
}  // namespace pairs_bf16

// The few-heads kernel: keys as the MMA's rows (blocks of 64), 8 or 16 heads as its columns.
namespace few_heads {
inline constexpr int kBlockKeys = 64;
inline constexpr int kMaxHeads = 16;
}  // namespace few_heads

// A bf16 key row (bf16 caches; the decoded keys' copy in the workspace): 1 KB.
inline constexpr int kBf16RowBytes = kHeadDim * 2;

}  // namespace sparse_swa::detail::sm90
