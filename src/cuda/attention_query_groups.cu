// SPDX-License-Identifier: Apache-2.0
// Query groups (docs/design.md#query-groups): the union of the key lists of each group of
// a.query_group consecutive tokens, which the decode kernel then walks once for all of them.
//
// One CTA per group. Its valid entries (inside the length, 0 <= id < num_slots) become sort keys
// (SWA slot s -> s, extra slot s -> n0 + s, so that the SWA entries come first), each with its
// token j in the group as the value; masked and out-of-range entries become a sentinel that
// sorts last (out-of-range ones are counted, as the kernels count them). After a stable radix sort
// (CUB) the equal keys form runs, their tokens in order. A run with c_j entries of token j becomes
// max_j c_j union entries, entry k carrying bit j for every token with c_j > k, so a key listed
// twice by a token still counts twice for it. Output per group: slots [cap], token bits [cap],
// lens (SWA entries, all entries).
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

#include "cuda/attention_ds_mla_layout.cuh"
#include "cuda/cuda_utils.h"

namespace sparse_swa::detail::ds_mla {
namespace {

constexpr int kUnionThreads = 512;
constexpr uint32_t kNoKey = 0xffffffffu;

// Entry e of the group (token e / per; in each token's part, SWA entries then extra entries):
// where its index lives, or nullptr past its row's length (lens: [2][kMaxQueryGroup], the
// group's clamped lens per segment).
__device__ __forceinline__ const int32_t* entry_source(const Args& a, int64_t first, int g, int e,
                                                       const int32_t (&lens)[2][kMaxQueryGroup],
                                                       bool& swa, uint32_t& token) {
  const int w0 = a.seg0.width, w1 = a.num_segments > 1 ? a.seg1.width : 0, per = w0 + w1;
  token = 0;
  swa = true;
  if (e >= g * per) return nullptr;
  const int j = e / per, r = e - j * per;
  swa = r < w0;
  const Segment& s = swa ? a.seg0 : a.seg1;
  const int pos = swa ? r : r - w0;
  if (pos >= lens[swa ? 0 : 1][j]) return nullptr;
  token = static_cast<uint32_t>(j);
  return s.indices + (first + j) * s.row_stride + pos;
}

// The sort key of an entry's index: SWA slot s -> s, extra slot s -> (SWA slots) + s; kNoKey for
// -1 and out-of-range ids (those add to `bad`).
__device__ __forceinline__ uint32_t entry_key(const Args& a, bool swa, int32_t idx, int& bad) {
  const Segment& s = swa ? a.seg0 : a.seg1;
  if (idx < 0 || static_cast<uint32_t>(idx) >= s.num_slots) {
    bad += idx != -1;
    return kNoKey;
  }
  return swa ? static_cast<uint32_t>(idx) : a.seg0.num_slots + static_cast<uint32_t>(idx);
}

// kUnionItems entries per thread (blocked): the smallest of 2, 4, 8 that holds the group's.
template <int kUnionItems>
__global__ void __launch_bounds__(kUnionThreads)
    query_group_union_kernel(const __grid_constant__ Args a, int end_bit) {
  constexpr int kEntries = kUnionThreads * kUnionItems;
  using Sort = cub::BlockRadixSort<uint32_t, kUnionThreads, kUnionItems, uint32_t>;
  using Scan = cub::BlockScan<int32_t, kUnionThreads>;
  __shared__ union {
    typename Sort::TempStorage sort;
    typename Scan::TempStorage scan;
  } tmp;
  __shared__ uint32_t keys_s[kEntries + 1];  // sorted, then kNoKey
  __shared__ uint8_t tokens_s[kEntries];
  const int64_t grp = blockIdx.x;
  const int64_t first = grp * a.query_group;
  const int g = static_cast<int>(min(int64_t{a.query_group}, a.num_tokens - first));
  const int tid = threadIdx.x;

  __shared__ int32_t lens_s[2][kMaxQueryGroup];  // the group's lens, clamped to the widths
  if (tid < 2 * kMaxQueryGroup) {
    const int seg = tid / kMaxQueryGroup, j = tid % kMaxQueryGroup;
    const Segment& s = seg == 0 ? a.seg0 : a.seg1;
    lens_s[seg][j] =
        j < g && (seg == 0 || a.num_segments > 1) ? min(max(s.lens[first + j], 0), s.width) : 0;
  }
  __syncthreads();
  uint32_t key[kUnionItems], token[kUnionItems];
  int32_t idx[kUnionItems];
  bool swa[kUnionItems];
#pragma unroll
  for (int k = 0; k < kUnionItems; ++k) {  // every index load in flight
    const int32_t* src = entry_source(a, first, g, tid * kUnionItems + k, lens_s, swa[k], token[k]);
    idx[k] = src != nullptr ? *src : -1;
  }
  int bad = 0;
#pragma unroll
  for (int k = 0; k < kUnionItems; ++k) {
    key[k] = entry_key(a, swa[k], idx[k], bad);
    if (key[k] == kNoKey) token[k] = 0;
  }
  if (bad != 0 && a.bad_count != nullptr) atomicAdd(a.bad_count, bad);
  Sort(tmp.sort).Sort(key, token, 0, end_bit);  // stable: a run's tokens stay in order
#pragma unroll
  for (int k = 0; k < kUnionItems; ++k) {
    keys_s[tid * kUnionItems + k] = key[k];
    tokens_s[tid * kUnionItems + k] = static_cast<uint8_t>(token[k]);
  }
  if (tid == 0) keys_s[kEntries] = kNoKey;
  __syncthreads();

  // Union entries of the runs that start at this thread's items (a run's first item counts its
  // tokens: runs are short but for lists that repeat one key, which cost time, never a fault).
  int32_t entries[kUnionItems];
  int32_t mine = 0;
#pragma unroll
  for (int k = 0; k < kUnionItems; ++k) {
    const int i = tid * kUnionItems + k;
    entries[k] = 0;
    if (key[k] != kNoKey && (i == 0 || keys_s[i - 1] != key[k])) {
      int32_t count[kMaxQueryGroup] = {};
      for (int m = i; keys_s[m] == key[k]; ++m) {
        entries[k] = max(entries[k], ++count[tokens_s[m]]);
      }
    }
    mine += entries[k];
  }
  int32_t base = 0, total = 0;
  Scan(tmp.scan).ExclusiveSum(mine, base, total);
  int32_t* lens = a.group_lens + 2 * grp;
  if (tid == 0) {
    lens[0] = total;  // no extra entry: all are SWA entries
    lens[1] = total;
  }
  __syncthreads();
  const uint32_t extra_base = a.seg0.num_slots;
  int32_t* slots = a.group_slots + grp * a.group_cap;
  uint32_t* bits = a.group_tokens + grp * a.group_cap;
#pragma unroll
  for (int k = 0; k < kUnionItems; ++k) {
    if (entries[k] == 0) continue;
    const int i = tid * kUnionItems + k;
    const bool swa = key[k] < extra_base;
    if (!swa && (i == 0 || keys_s[i - 1] < extra_base)) lens[0] = base;  // the first extra run
    int32_t count[kMaxQueryGroup] = {};
    for (int m = i; keys_s[m] == key[k]; ++m) ++count[tokens_s[m]];
    for (int32_t e = 0; e < entries[k]; ++e) {
      uint32_t b = 0;
      for (int j = 0; j < g; ++j) b |= static_cast<uint32_t>(count[j] > e) << j;
      slots[base + e] = static_cast<int32_t>(swa ? key[k] : key[k] - extra_base);
      bits[base + e] = b;
    }
    base += entries[k];
  }
}

}  // namespace

Status launch_query_group_union(const Args& a, cudaStream_t stream) {
  // Keys are below n0 + n1 < 2^31 (the plan's condition); kNoKey's low end_bit bits still sort
  // last.
  const uint64_t keys = uint64_t{a.seg0.num_slots} + (a.num_segments > 1 ? a.seg1.num_slots : 0);
  int end_bit = 1;
  while ((uint64_t{1} << end_bit) <= keys) ++end_bit;
  const int64_t entries =
      int64_t{a.query_group} * (a.seg0.width + (a.num_segments > 1 ? a.seg1.width : 0));
  const auto grid = static_cast<unsigned>(a.key_rows);
  if (entries <= 2 * kUnionThreads) {
    query_group_union_kernel<2><<<grid, kUnionThreads, 0, stream>>>(a, end_bit);
  } else if (entries <= 4 * kUnionThreads) {
    query_group_union_kernel<4><<<grid, kUnionThreads, 0, stream>>>(a, end_bit);
  } else {
    static_assert(8 * kUnionThreads == kMaxGroupEntries);
    query_group_union_kernel<8><<<grid, kUnionThreads, 0, stream>>>(a, end_bit);
  }
  return Status::Ok();
}

}  // namespace sparse_swa::detail::ds_mla
