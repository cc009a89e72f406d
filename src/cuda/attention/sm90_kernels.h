// SPDX-License-Identifier: Apache-2.0
// The launch of each sm_90a attention kernel, one per kernel file; the launcher
// (sm90_launch.cc) builds their params from the plan and calls them in order on the stream.
#pragma once

#include <cuda_runtime.h>

#include "cuda/attention/sm90_params.h"
#include "sparse_swa/status.h"

namespace sparse_swa::detail::sm90 {

// sm90_tile32_kernel.cu: one CTA per item; bf16_cache picks the form that copies bf16 rows.
Status launch_sm90_tile32(const Tile32Params& a, bool bf16_cache, cudaStream_t stream);
// Whether this device runs the sm_90a machine code (the kernels' only code).
bool sm90_kernels_loaded();

// sm90_pairs_fp8_kernel.cu: one CTA per item, or clusters of a token's slices (a.cluster_merge).
Status launch_sm90_pairs_fp8(const PairsFp8Params& a, cudaStream_t stream);
// sm90_pairs_bf16_kernel.cu: CTAs that walk items (at most max_ctas; 0: one per item), or
// clusters of a token's slices (a.cluster_merge, one CTA per item).
Status launch_sm90_pairs_bf16(const PairsBf16Params& a, unsigned max_ctas, cudaStream_t stream);
// Whether clusters of `splits` (2..8) CTAs of that pair kernel can run on this device at all (a
// partition with few SMs per GPC may hold none); asked once per size.
bool sm90_pairs_fp8_clusters_fit(int splits);
bool sm90_pairs_bf16_clusters_fit(int splits);

// sm90_few_heads_kernel.cu: CTAs that walk items (at most max_ctas; 0: one per item).
Status launch_sm90_few_heads(const FewHeadsParams& a, unsigned max_ctas, cudaStream_t stream);

// split_merge_kernel.cu: the split rows' partials into finished rows, row_threads (128 or 32)
// threads a row.
Status launch_split_merge(const MergeParams& a, int row_threads, cudaStream_t stream);

// query_group_union_kernel.cu: each query group's union of key lists, before the pair kernel.
Status launch_query_group_union(const UnionParams& a, cudaStream_t stream);

// decode_keys_kernel.cu: every slot of the slot space decoded into the workspace's bf16 rows.
Status launch_decode_keys(const DecodeKeysParams& a, int num_sms, cudaStream_t stream);

}  // namespace sparse_swa::detail::sm90
