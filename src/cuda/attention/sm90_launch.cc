// SPDX-License-Identifier: Apache-2.0
// The launcher of the sm_90a attention: the plan (src/attention/sm90_plan.h) of a call on the
// current device turned into each kernel's params (sm90_params.h) and launched in order on the
// stream -- the query groups' unions or the decoded keys, the planned kernel, the merge of its
// slices. Never mutates what it was given; no host sync, no allocation.
#include "cuda/attention/sm90_launch.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <utility>

#include "attention/sm90_shapes.h"
#include "cuda/attention/sm90_kernels.h"
#include "cuda/attention/sm90_params.h"

namespace sparse_swa::detail {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
// The pair kernels read the decoded keys' copy as bf16 caches of pages of this many slots.
constexpr int32_t kDecodedPage = 64;

// n / d as (n * m) >> (31 + l) for every n < 2^31 and 1 <= d < 2^31: with 2^l >= d and
// m = floor(2^(31 + l) / d) + 1 = (2^(31 + l) + e) / d, 0 < e <= d, the quotient is
// n / d + n e / (d 2^(31 + l)) < n / d + 2^-l <= n / d + 1 / d, whose floor is floor(n / d).
// m <= 2^32 keeps n * m inside 64 bits.
std::pair<uint64_t, uint32_t> block_divider(uint32_t d) {
  uint32_t l = 0;
  while ((uint64_t{1} << l) < d) ++l;
  const uint64_t m = (uint64_t{1} << (31 + l)) / d + 1;
  return {m, 31 + l};
}

sm90::Segment segment(const ConstIndexView& v, const ConstKvCacheView& c) {
  const int64_t slots = c.num_slots();
  const auto [magic, shift] = block_divider(static_cast<uint32_t>(c.block_size));
  return {v.data,
          v.lens,
          v.row_stride,
          v.width,
          static_cast<uint32_t>(std::min<int64_t>(slots, int64_t{1} << 31)),
          static_cast<uint32_t>(c.block_size),
          magic,
          shift,
          static_cast<const uint8_t*>(c.data),
          c.page_stride_bytes};
}

sm90::CallRows call_rows(const SparseAttentionParams& p) {
  const bool extra = p.extra_indices.rows != 0;
  const sm90::Segment seg0 = segment(p.swa_indices, p.swa_cache);
  return {p.q,
          p.out,
          p.lse,
          p.sinks,
          p.bad_index_count,
          p.softmax_scale * kLog2e,
          p.num_tokens,
          p.num_heads,
          static_cast<int32_t>(formulas::ceil_div(p.num_heads, sm90::kHeadGroup)),
          extra ? 2 : 1,
          seg0,
          extra ? segment(p.extra_indices, p.extra_cache) : seg0};
}

// `call` with both segments reading the decoded keys' rows (the workspace's first bytes) as bf16
// caches: the bf16 kernels then mask and count the call's bad entries themselves.
sm90::CallRows over_decoded_keys(sm90::CallRows call, const Sm90Plan& plan, uint8_t* rows) {
  const auto [magic, shift] = block_divider(kDecodedPage);
  for (sm90::Segment* s : {&call.seg0, &call.seg1}) {
    s->block_size = kDecodedPage;
    s->block_magic = magic;
    s->block_shift = shift;
    s->page_stride = int64_t{kDecodedPage} * sm90::kBf16RowBytes;
  }
  call.seg0.cache = rows;
  call.seg1.cache = rows + plan.decoded_extra_slot0 * sm90::kBf16RowBytes;
  return call;
}

// The slices' partials: [splits, split rows, 512] fp32, then [splits, split rows] (max, sum), both
// 16-byte aligned, after the decoded keys' rows where the plan has them.
sm90::SplitRows split_rows(const SparseAttentionParams& p, const Sm90Plan& plan) {
  sm90::SplitRows s{nullptr, nullptr, plan.splits, plan.whole_tokens};
  if (plan.splits > 1) {
    const int64_t rows = (p.num_tokens - plan.whole_tokens) * p.num_heads;
    s.partial_o =
        reinterpret_cast<float*>(static_cast<uint8_t*>(p.workspace) + plan.partials_offset);
    s.partial_ml = reinterpret_cast<float2*>(s.partial_o + int64_t{plan.splits} * rows * kHeadDim);
  }
  return s;
}

// `map` describes rows [T][H][512] bf16 at `base` (q or out) in boxes of 64 dims x 64 heads x one
// token with the 128-byte swizzle (a box is one sw128 column block of a head group). The driver's
// encoder is looked up once.
Status encode_head_rows(CUtensorMap& map, const uint16_t* base, int64_t tokens, int heads) {
  static std::once_flag once;
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  std::call_once(once, [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess) {
      encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    } else {
      cudaGetLastError();
    }
  });
  if (encode == nullptr) {
    return internal_error("sparse_attention: the CUDA driver offers no cuTensorMapEncodeTiled");
  }
  const cuuint64_t dims[3] = {kHeadDim, static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(tokens)};
  const cuuint64_t strides[2] = {kHeadDim * 2, static_cast<cuuint64_t>(heads) * kHeadDim * 2};
  const cuuint32_t box[3] = {64, sm90::kHeadGroup, 1};
  const cuuint32_t unit[3] = {1, 1, 1};
  const CUresult r =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<uint16_t*>(base), dims, strides,
             box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return internal_error("sparse_attention: cuTensorMapEncodeTiled refused [", tokens, ", ", heads,
                          ", 512] bf16 rows (CUresult ", static_cast<int>(r), ")");
  }
  return Status::Ok();
}

Status head_row_maps(const SparseAttentionParams& p, sm90::HeadRowMaps* maps) {
  SPARSE_SWA_RETURN_IF_ERROR(encode_head_rows(maps->q_map, p.q, p.num_tokens, p.num_heads));
  return encode_head_rows(maps->out_map, p.out, p.num_tokens, p.num_heads);
}

// The query groups' unions in the workspace (sm90_plan.h: query_group_part_bytes).
sm90::QueryGroupUnions group_unions(void* workspace, int64_t groups, int64_t cap) {
  uint8_t* w = static_cast<uint8_t*>(workspace);
  const int64_t part = query_group_part_bytes(groups, cap);
  return {reinterpret_cast<int32_t*>(w), reinterpret_cast<uint32_t*>(w + part),
          reinterpret_cast<int32_t*>(w + 2 * part), cap};
}

// The planned kernel on `call` (the caches', or the decoded keys') with the plan's slices.
// `cluster`: a pair kernel's slices merge inside their clusters; `walking_ctas`: the most CTAs of
// a kernel whose CTAs walk items (0: one per item).
Status launch_kernel(const SparseAttentionParams& p, const Sm90Plan& plan,
                     const sm90::CallRows& call, const sm90::SplitRows& split, bool cluster,
                     unsigned walking_ctas, cudaStream_t stream) {
  sm90::HeadRowMaps maps{};
  if (plan.family != Sm90Family::kFewHeads) SPARSE_SWA_RETURN_IF_ERROR(head_row_maps(p, &maps));
  switch (plan.family) {
    case Sm90Family::kTile32:
      return sm90::launch_sm90_tile32({call, split, maps}, p.swa_cache.dtype == CacheDtype::kBf16,
                                      stream);
    case Sm90Family::kPairsFp8: {
      const int64_t key_rows = formulas::ceil_div(p.num_tokens, plan.query_group);
      return sm90::launch_sm90_pairs_fp8(
          {call, split, maps, plan.query_group, key_rows,
           group_unions(p.workspace, key_rows, plan.group_cap), cluster ? 1 : 0},
          stream);
    }
    case Sm90Family::kPairsBf16:
      return sm90::launch_sm90_pairs_bf16({call, split, maps, cluster ? 1 : 0}, walking_ctas,
                                          stream);
    case Sm90Family::kFewHeads:
      return sm90::launch_sm90_few_heads({call, split}, walking_ctas, stream);
  }
  return internal_error("sparse_attention: no kernel for plan family ",
                        static_cast<int>(plan.family));
}

}  // namespace

bool sm90_applies(const SparseAttentionParams& p) {
  return sm90_reads_caches(p) && sm90::sm90_kernels_loaded();
}

Status launch_sm90_attention(const SparseAttentionParams& p, const AttentionOverrides& overrides,
                             cudaStream_t stream) {
  SmCapacity sms;
  if (const cudaError_t err = current_sm_capacity(&sms); err != cudaSuccess) {
    return internal_error("sparse_attention: cannot read the device's SM count: ",
                          cudaGetErrorString(err));
  }
  const Sm90Plan plan =
      plan_sm90_attention(p, sms, p.workspace == nullptr ? 0 : p.workspace_bytes, overrides);
  const sm90::CallRows call = call_rows(p);
  const sm90::SplitRows split = split_rows(p, plan);
  const int64_t key_rows = formulas::ceil_div(p.num_tokens, plan.query_group);
  const int64_t items =
      (key_rows * plan.splits - int64_t{plan.whole_tokens} * (plan.splits - 1)) * plan.groups;
  if (items > 0x7fffffff) {
    const int64_t per_token = plan.groups * (plan.whole_tokens > 0 ? 1 : int64_t{plan.splits});
    return invalid_argument("params.num_tokens: expected at most ", 0x7fffffff / per_token,
                            " tokens at ", p.num_heads, " heads, got ", p.num_tokens);
  }
  uint8_t* workspace = static_cast<uint8_t*>(p.workspace);
  if (plan.query_group > 1) {
    SPARSE_SWA_RETURN_IF_ERROR(sm90::launch_query_group_union(
        {call.bad_count, p.num_tokens, call.num_segments, call.seg0, call.seg1, plan.query_group,
         key_rows, group_unions(workspace, key_rows, plan.group_cap)},
        stream));
  }
  if (plan.decoded_keys) {
    SPARSE_SWA_RETURN_IF_ERROR(sm90::launch_decode_keys(
        {call.seg0, call.seg1, workspace, plan.decoded_slots, plan.decoded_extra_slot0},
        sms.num_sms, stream));
  }
  // A pair kernel's clusters where they can run at all, else its slices go through the merge.
  const bool cluster =
      plan.cluster_merge &&
      (plan.family == Sm90Family::kPairsFp8 ? sm90::sm90_pairs_fp8_clusters_fit(plan.splits)
                                            : sm90::sm90_pairs_bf16_clusters_fit(plan.splits));
  const int32_t walk = overrides.max_walking_ctas > 0
                           ? std::min(overrides.max_walking_ctas, sms.num_sms)
                           : sms.num_sms;
  SPARSE_SWA_RETURN_IF_ERROR(
      launch_kernel(p, plan, plan.decoded_keys ? over_decoded_keys(call, plan, workspace) : call,
                    split, cluster, plan.cluster_merge ? 0u : static_cast<unsigned>(walk), stream));
  if (plan.splits > 1 && !cluster) {
    SPARSE_SWA_RETURN_IF_ERROR(sm90::launch_split_merge(
        {split, p.out, p.lse, p.sinks, p.num_tokens, p.num_heads}, plan.merge_row_threads, stream));
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return internal_error("sparse_attention: kernel launch failed: ", cudaGetErrorString(err));
  }
  return Status::Ok();
}

}  // namespace sparse_swa::detail
