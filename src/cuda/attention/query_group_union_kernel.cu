// SPDX-License-Identifier: Apache-2.0
// Query groups (docs/design.md#query-groups): the union of the key lists of each group of
// a.query_group consecutive tokens, which the fp8_ds_mla pair kernel then walks once for all of
// them.
//
// One CTA per group. Its valid entries (inside the length, 0 <= id < num_slots) become keys (SWA
// slot s -> s, extra slot s -> n0 + s); out-of-range ones are counted, as the kernels count them.
// Every key goes into a shared-memory hash table that keeps, per key, its first entry in the
// union's order (SWA entries before extra ones, tokens in turn) and the tokens that list it. The
// union is the first entry of each key, in that order, with those tokens' bits: deterministic, and
// each token sees each of its keys once (if a token lists some key twice, every valid entry stands
// alone instead). Output per group: slots [cap], token bits [cap], lens (SWA entries, all).
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_scan.cuh>
#include <mutex>

#include "attention/sm90_shapes.h"
#include "cuda/attention/sm90_kernels.h"
#include "cuda/attention/sm90_params.h"
#include "sparse_swa/attention.h"

namespace sparse_swa::detail::sm90 {
namespace {

constexpr int kUnionThreads = 512;
constexpr uint32_t kNoKey = 0xffffffffu;

// Entry o of the group, in the union's order (the SWA entries of tokens 0..g-1 in turn, then
// their extra entries): where its index lives, or nullptr past its row's length (lens:
// [2][kMaxQueryGroup], the group's clamped lens per segment).
__device__ __forceinline__ const int32_t* entry_source(const UnionParams& a, int64_t first, int g,
                                                       int o,
                                                       const int32_t (&lens)[2][kMaxQueryGroup],
                                                       bool& swa, uint32_t& token) {
  const int w0 = a.seg0.width, w1 = a.num_segments > 1 ? a.seg1.width : 0;
  token = 0;
  swa = o < g * w0;
  const int r = swa ? o : o - g * w0;
  const int w = swa ? w0 : w1;
  if (!swa && r >= g * w1) return nullptr;
  const int j = r / w, pos = r - j * w;
  if (pos >= lens[swa ? 0 : 1][j]) return nullptr;
  token = static_cast<uint32_t>(j);
  const Segment& s = swa ? a.seg0 : a.seg1;
  return s.indices + (first + j) * s.row_stride + pos;
}

// The key of an entry's index: SWA slot s -> s, extra slot s -> (SWA slots) + s, below 2^31 (the
// plan's condition); kNoKey for -1 and out-of-range ids (those add to `bad`).
__device__ __forceinline__ uint32_t entry_key(const UnionParams& a, bool swa, int32_t idx,
                                              int& bad) {
  const Segment& s = swa ? a.seg0 : a.seg1;
  if (idx < 0 || static_cast<uint32_t>(idx) >= s.num_slots) {
    bad += idx != -1;
    return kNoKey;
  }
  return swa ? static_cast<uint32_t>(idx) : a.seg0.num_slots + static_cast<uint32_t>(idx);
}

// kUnionItems entries per thread, consecutive in the union's order: the smallest of 2, 4, 8 that
// holds the group's. Dynamic shared memory: a hash table of kEntries slots (keys, first
// occurrence, token bits), 12 kEntries bytes.
template <int kUnionItems>
__global__ void __launch_bounds__(kUnionThreads)
    query_group_union_kernel(const __grid_constant__ UnionParams a) {
  constexpr int kEntries = kUnionThreads * kUnionItems;  // also the table's slots (a power of 2)
  constexpr int kHashShift = 32 - __builtin_ctz(kEntries);
  using Scan = cub::BlockScan<int32_t, kUnionThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int32_t lens_s[2][kMaxQueryGroup];  // the group's lens, clamped to the widths
  __shared__ int repeated;                       // some token lists some key twice
  extern __shared__ uint32_t table[];
  uint32_t* keys = table;                 // [kEntries] kNoKey = free
  uint32_t* firsts = table + kEntries;    // [kEntries] the key's first entry in the union's order
  uint32_t* seen = table + 2 * kEntries;  // [kEntries] bit j: token j lists the key
  const int64_t grp = blockIdx.x;
  const int64_t first = grp * a.query_group;
  const int g = static_cast<int>(min(int64_t{a.query_group}, a.num_tokens - first));
  const int tid = threadIdx.x;
  for (int i = tid; i < kEntries; i += kUnionThreads) {
    keys[i] = kNoKey;
    firsts[i] = kNoKey;
    seen[i] = 0;
  }
  if (tid < 2 * kMaxQueryGroup) {
    const int seg = tid / kMaxQueryGroup, j = tid % kMaxQueryGroup;
    const Segment& s = seg == 0 ? a.seg0 : a.seg1;
    lens_s[seg][j] =
        j < g && (seg == 0 || a.num_segments > 1) ? min(max(s.lens[first + j], 0), s.width) : 0;
  }
  if (tid == 0) repeated = 0;
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
  int where[kUnionItems];  // the key's table slot, -1 for a masked entry
#pragma unroll
  for (int k = 0; k < kUnionItems; ++k) {
    key[k] = entry_key(a, swa[k], idx[k], bad);
    where[k] = -1;
    if (key[k] == kNoKey) continue;
    uint32_t h = (key[k] * 2654435761u) >> kHashShift;  // linear probing; never full
    for (;;) {
      const uint32_t prev = atomicCAS(&keys[h], kNoKey, key[k]);
      if (prev == kNoKey || prev == key[k]) break;
      h = (h + 1) & (kEntries - 1);
    }
    where[k] = static_cast<int>(h);
    if ((atomicOr(&seen[h], 1u << token[k]) >> token[k]) & 1u) atomicOr(&repeated, 1);
    atomicMin(&firsts[h], static_cast<uint32_t>(tid * kUnionItems + k));
  }
  if (bad != 0 && a.bad_count != nullptr) atomicAdd(a.bad_count, bad);
  __syncthreads();

  // A key's first entry stands for every token that lists it. If some token lists a key twice,
  // every valid entry stands for itself alone instead (each token still sees each of its
  // entries as often as it lists it; such lists are rare, and this keeps the union exact).
  const bool merge = repeated == 0;
  bool emits[kUnionItems];
  int32_t mine = 0;
#pragma unroll
  for (int k = 0; k < kUnionItems; ++k) {
    emits[k] = where[k] >= 0 &&
               (!merge || firsts[where[k]] == static_cast<uint32_t>(tid * kUnionItems + k));
    mine += emits[k];
  }
  int32_t base = 0, total = 0;
  Scan(scan).ExclusiveSum(mine, base, total);
  // Lens: (SWA entries, all). SWA entries come first: the thread holding the first extra entry in
  // the union's order counts them.
  int32_t* lens = a.unions.lens + 2 * grp;
  const int first_extra = g * a.seg0.width;
  const int entries = first_extra + (a.num_segments > 1 ? g * a.seg1.width : 0);
  if (tid == 0) lens[1] = total;
  if (first_extra >= entries) {
    if (tid == 0) lens[0] = total;
  } else if (first_extra / kUnionItems == tid) {
    int32_t swa_entries = base;
    for (int k = 0; k < first_extra % kUnionItems; ++k) swa_entries += emits[k];
    lens[0] = swa_entries;
  }
  int32_t* slots = a.unions.slots_of(grp);
  uint32_t* bits = a.unions.tokens_of(grp);
#pragma unroll
  for (int k = 0; k < kUnionItems; ++k) {
    if (!emits[k]) continue;
    slots[base] = static_cast<int32_t>(swa[k] ? key[k] : key[k] - a.seg0.num_slots);
    bits[base] = merge ? seen[where[k]] : 1u << token[k];
    ++base;
  }
}

template <int kUnionItems>
Status launch_union(const UnionParams& a, cudaStream_t stream) {
  constexpr int kSmem = 12 * kUnionThreads * kUnionItems;
  static std::once_flag once;
  static cudaError_t attr_err = cudaSuccess;
  std::call_once(once, [] {
    attr_err = cudaFuncSetAttribute(query_group_union_kernel<kUnionItems>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  });
  if (attr_err != cudaSuccess) {
    return internal_error(
        "sparse_attention: cannot reserve ", kSmem,
        " bytes of shared memory for the query groups: ", cudaGetErrorString(attr_err));
  }
  query_group_union_kernel<kUnionItems>
      <<<static_cast<unsigned>(a.groups), kUnionThreads, kSmem, stream>>>(a);
  return Status::Ok();
}

}  // namespace

Status launch_query_group_union(const UnionParams& a, cudaStream_t stream) {
  const int64_t entries =
      int64_t{a.query_group} * (a.seg0.width + (a.num_segments > 1 ? a.seg1.width : 0));
  if (entries <= 2 * kUnionThreads) return launch_union<2>(a, stream);
  if (entries <= 4 * kUnionThreads) return launch_union<4>(a, stream);
  static_assert(8 * kUnionThreads == pairs_fp8::kMaxGroupEntries);
  return launch_union<8>(a, stream);
}

}  // namespace sparse_swa::detail::sm90
