// SPDX-License-Identifier: Apache-2.0
// Sparse MLA attention on the tensor cores for fp8_ds_mla or bf16 caches, sm_90a only (the
// semantics are include/sparse_swa/attention.h's, the CPU reference
// src/cpu/attention_reference.cc; overview in docs/design.md#attention-kernels): the plan and
// launcher of the kernels, the merge of split-KV slices, and the decode kernel, which takes the
// split plans of one or a few tokens (the prefill kernels, attention_ds_mla_prefill_fp8.cu,
// attention_ds_mla_prefill_bf16.cu and attention_ds_mla_prefill_few_heads.cu, the others).
//
// One CTA = one query token x a group of up to 64 heads x one slice of the token's key list.
// The keys of both segments are one list (SWA entries first), walked in tiles of 32 by three
// roles (warp specialisation, 512 threads) that hand tiles on through mbarriers:
//   producer (warpgroup 0)  fp8_ds_mla: cp.async gathers each valid key's 576 data and 8 scale
//       bytes into a raw stage (four stages, three tiles ahead), then decodes the tile into bf16
//       rows (e4m3 * 2^(s - 127) is exact in bf16; masked keys -- -1, past the length, out of
//       range -- become zero rows) in one of two K stages, stored in the 128-byte swizzle layout
//       that wgmma and ldmatrix read. bf16: cp.async copies the rows straight into one of four
//       K stages (three tiles ahead), masked keys as zero rows;
//   QK + softmax (warpgroup 1)  S = Q K^T, fp32 accumulators: one wgmma m64n32k16 chain for the
//       64-row head group (or, forced for tests, m16n8k16 MMAs per 16 heads); then the
//       online softmax in base 2 (masked keys -inf), P written as bf16 hi + lo parts with the
//       rows' rescale factors;
//   PV (warpgroups 2-3)  O += P V with V = the same rows: wgmma m64n128k16 (warpgroup g owns dims
//       256 g + [0, 256) of all 64 rows), or m16n8k16 MMAs (a warp owns 32 heads x 128 dims) when
//       QK uses them; P's two bf16 parts keep ~16 bits of P, as the fp32 reference does.
// When tokens x head groups leave SMs idle and the caller gives a workspace, the key list is split
// over several CTAs (the plan depends on shapes only; each CTA finds its tiles from the device
// lens) and a second kernel merges the slices' (O, max, sum). No host sync, no allocation.
// The roles live in attention_ds_mla_producer.cuh, _qk.cuh and _pv.cuh, the layout they share in
// attention_ds_mla_layout.cuh; this file holds the kernel, the merge and the launcher.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>
#include <utility>
#include <vector>

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Targets other than sm_90a compile the kernel as a stub: its device helpers go unused there.
#pragma nv_diag_suppress 177
#endif

#include "common/swa_formulas.h"
#include "cuda/attention_ds_mla.cuh"
#include "cuda/attention_ds_mla_cluster_merge.cuh"
#include "cuda/attention_ds_mla_layout.cuh"
#include "cuda/attention_ds_mla_prefill.cuh"
#include "cuda/attention_ds_mla_producer.cuh"
#include "cuda/attention_ds_mla_pv.cuh"
#include "cuda/attention_ds_mla_qk.cuh"
#include "cuda/cuda_utils.h"
#include "cuda/mma_ptx.cuh"
#include "sparse_swa/kv_cache.h"

namespace sparse_swa::detail {
namespace ds_mla {

template <bool kWgmma, bool kWgmmaPv, bool kBf16>
__global__ void __launch_bounds__(kThreads, 1)
    ds_mla_attention_kernel(const __grid_constant__ Args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Layout<kBf16>;
  extern __shared__ uint8_t smem_raw[];
  Cta<L> c;
  place_smem(c, smem_raw);
  const int tid = threadIdx.x;
  c.split = static_cast<int>(blockIdx.x % a.splits);
  const int64_t tg = blockIdx.x / a.splits;
  c.h0 = static_cast<int>(tg % a.groups) * kGroupHeads;
  c.t = tg / a.groups;
  c.heads = min(kGroupHeads, a.num_heads - c.h0);
  // The lens and the producer's first index entries go out before the barrier; the lens are used
  // only after Q's load has been issued (nothing waits for them ahead of it).
  const int32_t raw0 = a.seg0.lens[c.t];
  const int32_t raw1 = a.num_segments > 1 ? a.seg1.lens[c.t] : 0;
  EarlyIndex early;
  if (tid < 128) early = load_early_index(a, c, tid);
  if (tid == 0) {
    for (int s = 0; s < L::kKStages; ++s) {
      ptx::mbar_init(c.k_full(s), 128);
      ptx::mbar_init(c.k_empty(s), 384);
    }
    for (int b = 0; b < L::kPBufs; ++b) {
      ptx::mbar_init(c.p_full(b), 128);
      ptx::mbar_init(c.p_empty(b), 256);
    }
    ptx::mbar_init(c.q_full(), 1);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  if (tid == 0) start_q_load(a, c, c.q_full());
  clamp_lens(a, c, raw0, raw1);
  const int32_t all_tiles = static_cast<int32_t>((c.total + kKeys - 1) / kKeys);
  const int32_t per_split = (all_tiles + a.splits - 1) / a.splits;
  c.tile0 = c.split * per_split;
  c.n = max(0, min(all_tiles, c.tile0 + per_split) - c.tile0);
  if (tid >= 128) ptx::mbar_wait(c.q_full(), 0);  // Q, for the QK and PV warpgroups

  const int wg = tid >> 7;
  if (wg == 0) {
    ptx::setmaxnreg_dec<kProducerRegs>();
    if constexpr (kBf16) {
      copy_producer(a, c, tid, early);
    } else {
      decode_producer(a, c, tid, early);
    }
  } else if (wg == 1) {
    ptx::setmaxnreg_dec<kQkRegs>();
    qk_softmax<kWgmma>(a, c, (tid >> 5) & 3, tid & 31);
  } else {
    ptx::setmaxnreg_inc<kPvRegs>();
    if constexpr (kWgmmaPv) {
      pv_wgmma(a, c, wg - 2, (tid >> 5) & 3, tid & 31);
    } else {
      pv_mma(a, c, (tid >> 5) - 8, tid & 31);
    }
  }
#else
  (void)a;  // sm_90a only (wgmma, setmaxnreg): other targets never launch it
#endif
}

// Merges the splits of a (token, head) row: kThreads threads per row, 512 / kThreads floats of it
// each, the splits read kBatch at a time with every load in flight (a round trip per batch, not
// two per split), their weights 2^(m_s - M) kept against a running M; then the same finish as
// the unsplit kernel. Few rows take 128 threads each, many take a warp (fewer registers per row).
template <int kThreads, int kBatch>
__global__ void __launch_bounds__(256, 4) ds_mla_merge_kernel(const __grid_constant__ Args a) {
  constexpr int kVecs = kHeadDim / 4 / kThreads;            // float4s per thread
  const int64_t first = first_split_row(a);                 // rows before it are finished
  const int64_t rows = a.num_tokens * a.num_heads - first;  // the split rows
  const int64_t r = int64_t{blockIdx.x} * (256 / kThreads) + threadIdx.x / kThreads;
  if (r >= rows) return;
  const int64_t row = first + r;
  const int col = threadIdx.x % kThreads;  // float4 columns col + kThreads j
  float m = -INFINITY, l = 0.0f;
  float4 acc[kVecs];
#pragma unroll
  for (int j = 0; j < kVecs; ++j) acc[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int s0 = 0; s0 < a.splits; s0 += kBatch) {
    float2 ml[kBatch];
    float4 v[kBatch][kVecs];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int64_t prow = int64_t{s0 + k} * rows + r;
      const bool in = s0 + k < a.splits;
      ml[k] = in ? a.partial_ml[prow] : make_float2(-INFINITY, 0.0f);
      const float4* po = reinterpret_cast<const float4*>(a.partial_o + prow * kHeadDim);
#pragma unroll
      for (int j = 0; j < kVecs; ++j) {
        v[k][j] = in ? po[col + kThreads * j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
    float mb = m;
#pragma unroll
    for (int k = 0; k < kBatch; ++k) mb = fmaxf(mb, ml[k].x);
    if (mb == -INFINITY) continue;
    const float corr = exp2f(m - mb);  // m = -inf: 0, and acc, l are still 0
    l *= corr;
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      acc[j].x *= corr;
      acc[j].y *= corr;
      acc[j].z *= corr;
      acc[j].w *= corr;
    }
    m = mb;
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const float w = exp2f(ml[k].x - m);  // an empty split has max -inf: weight 0
      if (w == 0.0f) continue;             // (and its O is not used: 0 * inf would be NaN)
      l += w * ml[k].y;
#pragma unroll
      for (int j = 0; j < kVecs; ++j) {
        acc[j].x += w * v[k][j].x;
        acc[j].y += w * v[k][j].y;
        acc[j].z += w * v[k][j].z;
        acc[j].w += w * v[k][j].w;
      }
    }
  }
  const RowFinish f = finish_row(m, l, a.sinks != nullptr ? a.sinks + row % a.num_heads : nullptr);
  uint16_t* y = a.out + row * kHeadDim;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    *reinterpret_cast<uint2*>(y + 4 * (col + kThreads * j)) =
        make_uint2(pack_bf16(acc[j].x * f.factor, acc[j].y * f.factor),
                   pack_bf16(acc[j].z * f.factor, acc[j].w * f.factor));
  }
  if (col == 0) a.lse[row] = f.lse;
}

// The merge for `rows` rows: 128 threads a row while they fit the SMs in one wave (the 128-thread
// form runs 5 CTAs of 256 threads per SM at 48 registers; 1024 threads keep a margin), else a warp
// a row (bench/README.md#variant-log, run 44).
constexpr int64_t kMergeWaveThreadsPerSm = 1024;
void launch_merge(const Args& a, int64_t rows, int num_sms, cudaStream_t stream) {
  if (rows * 128 <= num_sms * kMergeWaveThreadsPerSm) {
    ds_mla_merge_kernel<128, 4><<<static_cast<unsigned>((rows + 1) / 2), 256, 0, stream>>>(a);
  } else {
    ds_mla_merge_kernel<32, 2><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(a);
  }
}

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

Segment segment(const ConstIndexView& v, const ConstKvCacheView& c) {
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

constexpr int64_t kPartialRowBytes = kHeadDim * sizeof(float) + sizeof(float2);

// A development switch SPARSE_SWA_ATTENTION_* as an integer, `unset` when the variable is not set
// (read once per switch: callers keep it in a function-local static).
int env_int(const char* name, int unset) {
  const char* v = std::getenv(name);
  return v == nullptr ? unset : std::atoi(v);
}

// QK (and PV) with wgmma at every head count: it computes all 64 rows of a group, zero rows
// included, yet measured faster than m16n8k16 MMAs that skip the empty 16-head tiles at 8, 16
// and 32 heads, decode and prefill alike (bench/README.md#variant-log, run 24).
// SPARSE_SWA_ATTENTION_QK=mma forces the MMA variant (the tests run both).
bool use_wgmma_qk() {
  static const bool forced_mma = [] {
    const char* v = std::getenv("SPARSE_SWA_ATTENTION_QK");
    return v != nullptr && std::strcmp(v, "mma") == 0;
  }();
  return !forced_mma;
}

// PV with wgmma unless SPARSE_SWA_ATTENTION_PV=mma.
bool use_wgmma_pv() {
  static const bool forced_mma = [] {
    const char* v = std::getenv("SPARSE_SWA_ATTENTION_PV");
    return v != nullptr && std::strcmp(v, "mma") == 0;
  }();
  return !forced_mma;
}

// Development: the per-role cycle accounts, averaged over the CTAs, per CTA and per tile (the
// bf16 prefill kernel keeps none: its lines read zero).
void print_profile(const unsigned long long* device_profile, int64_t ctas, bool prefill) {
  static const char* const kDecodeRoles[] = {"producer", "qk", "pv"};
  static const char* const kDecodeSlots[3][7] = {
      {"landed wait", "stage wait", "decode", "gather", "", "", ""},
      {"K wait", "QK MMAs", "softmax", "P-buffer wait", "P stores", "", ""},
      {"P/K wait", "rescale", "PV MMAs", "arrives", "end wait", "stores", ""}};
  static const char* const kPrefillRoles[] = {"producer", "math0", "math1"};
  static const char* const kPrefillMath[7] = {"K wait",   "QK issue", "QK MMAs", "max",
                                              "max wait", "P + PV 1", "PV 2"};
  static const char* const kPrefillSlots[3][7] = {
      {"free wait", "copies", "loads", "", "", "", ""},
      {kPrefillMath[0], kPrefillMath[1], kPrefillMath[2], kPrefillMath[3], kPrefillMath[4],
       kPrefillMath[5], kPrefillMath[6]},
      {kPrefillMath[0], kPrefillMath[1], kPrefillMath[2], kPrefillMath[3], kPrefillMath[4],
       kPrefillMath[5], kPrefillMath[6]}};
  const char* const* kRoles = prefill ? kPrefillRoles : kDecodeRoles;
  const char* const(*kSlots)[7] = prefill ? kPrefillSlots : kDecodeSlots;
  const int64_t n = std::min<int64_t>(ctas, kMaxProfiledCtas);
  std::vector<unsigned long long> h(1 + n * 3 * 8);
  cudaDeviceSynchronize();
  cudaMemcpy(h.data(), device_profile, h.size() * 8, cudaMemcpyDeviceToHost);
  for (int role = 0; role < 3; ++role) {
    double tiles = 0, sum[7] = {};
    for (int64_t cta = 0; cta < n; ++cta) {
      const unsigned long long* v = h.data() + 1 + (cta * 3 + role) * 8;
      tiles += v[7];
      for (int k = 0; k < 7; ++k) sum[k] += v[k];
    }
    for (int k = 0; k < 7; ++k) {
      if (kSlots[role][k][0] == 0) continue;
      std::printf("profile %-8s %-13s %10.0f cycles/CTA %8.0f cycles/tile\n", kRoles[role],
                  kSlots[role][k], sum[k] / n, tiles > 0 ? sum[k] / tiles : 0.0);
    }
  }
}

template <bool kWgmma, bool kWgmmaPv, bool kBf16>
Status launch_kernel(const Args& a, cudaStream_t stream) {
  using L = Layout<kBf16>;
  static std::once_flag once;
  static cudaError_t attr_err = cudaSuccess;
  std::call_once(once, [] {
    attr_err = cudaFuncSetAttribute(ds_mla_attention_kernel<kWgmma, kWgmmaPv, kBf16>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(L::kSmem));
  });
  if (attr_err != cudaSuccess) {
    return internal_error("sparse_attention: cannot reserve ", L::kSmem,
                          " bytes of shared memory per CTA: ", cudaGetErrorString(attr_err));
  }
  const int64_t blocks = a.num_tokens * a.groups * a.splits;
  ds_mla_attention_kernel<kWgmma, kWgmmaPv, kBf16>
      <<<static_cast<unsigned>(blocks), kThreads, L::kSmem, stream>>>(a);
  return Status::Ok();
}

template <bool kBf16>
Status launch_variant(bool qk, bool pv, const Args& a, cudaStream_t stream) {
  return qk ? (pv ? launch_kernel<true, true, kBf16>(a, stream)
                  : launch_kernel<true, false, kBf16>(a, stream))
            : launch_kernel<false, false, kBf16>(a, stream);
}

// The kernel exists as sm_90a machine code only; on other devices the general kernel runs.
bool kernel_loaded_for_device() {
  static const bool loaded = [] {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, ds_mla_attention_kernel<true, true, false>) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return attr.binaryVersion == 90;
  }();
  return loaded;
}

bool applies(const SparseAttentionParams& p) {
  const CacheDtype d = p.swa_cache.dtype;
  if (d != CacheDtype::kFp8DsMla && d != CacheDtype::kBf16) return false;
  if (p.extra_indices.rows != 0 && p.extra_cache.dtype != d) return false;
  return kernel_loaded_for_device();
}

// Split-KV pays a partial (O, max, sum) per slice and a merge: a key list shorter than
// kMinTilesToSplit tiles runs whole, and a slice gets at least kMinSliceTiles tiles
// (bench/README.md#variant-log, runs 21 and 47).
constexpr int64_t kMinTilesToSplit = 8;
constexpr int64_t kMinSliceTiles = 1;

int64_t align16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

// The query groups' part of the workspace, from its start: [G, cap] slots, [G, cap] token bits,
// [G, 2] lens, each 16-byte aligned.
int64_t group_part_bytes(int64_t groups, int64_t cap) { return align16(groups * cap * 4); }
int64_t group_workspace_bytes(int64_t groups, int64_t cap) {
  return 2 * group_part_bytes(groups, cap) + align16(groups * 2 * 4);
}
QueryGroupUnions group_unions(void* workspace, int64_t groups, int64_t cap) {
  uint8_t* w = static_cast<uint8_t*>(workspace);
  const int64_t part = group_part_bytes(groups, cap);
  return {reinterpret_cast<int32_t*>(w), reinterpret_cast<uint32_t*>(w + part),
          reinterpret_cast<int32_t*>(w + 2 * part), cap};
}

// Every segment an fp8_ds_mla cache (read directly unless the plan decodes the keys first).
bool fp8_rows(const SparseAttentionParams& p) {
  return p.swa_cache.dtype == CacheDtype::kFp8DsMla &&
         (p.extra_indices.rows == 0 || p.extra_cache.dtype == CacheDtype::kFp8DsMla);
}

// Query groups (docs/design.md#query-groups) go to the fp8_ds_mla prefill kernel when a group's
// rows fit one CTA (g x H <= 64), its entries one union CTA, and the two caches' slot ids one
// 31-bit key space; and, unforced, only when the groups alone fill the SMs: a CTA walks its
// group's union, longer than one token's list, so fewer CTAs pay only with several waves
// (bench/README.md#variant-log, run 61).
bool query_groups_apply(const SparseAttentionParams& p, int64_t max_keys, int num_sms) {
  const int64_t g = p.query_group_size;
  const bool extra = p.extra_indices.rows != 0;
  const int64_t slots = p.swa_cache.num_slots() + (extra ? p.extra_cache.num_slots() : 0);
  const int64_t groups = (p.num_tokens + g - 1) / g;
  return g > 1 && p.num_tokens > 0 && p.kernel != AttentionKernel::kDecode &&
         (p.kernel == AttentionKernel::kPrefill || groups >= num_sms) && fp8_rows(p) &&
         g * p.num_heads <= kGroupHeads && g * max_keys <= kMaxGroupEntries &&
         slots < (int64_t{1} << 31);
}

// Whether a caller's workspace of workspace_bytes (< 0: any size, for sizing) holds `bytes`.
bool workspace_fits(int64_t workspace_bytes, int64_t bytes) {
  return workspace_bytes < 0 || workspace_bytes >= bytes;
}

// Decoded keys (docs/design.md#decoded-keys): the slot space of the two caches (one cache's
// when both segments view the same one) and where the extra cache's slots start in it.
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
// The workspace: [slots] bf16 rows of 1024 bytes.
int64_t decoded_keys_bytes(int64_t slots) { return slots * kBf16TokenBytes; }
// The bf16 kernel reads the rows as pages of 64 slots, back to back.
constexpr int32_t kDecodedPage = 64;

// Decoding each key once (`slots`: the decoded_slots space) pays where a call reads its keys
// many times over (the benchmark's prefill shapes, ~80 reads a key: 20-30 % faster,
// bench/README.md#variant-log, run 125): fp8_ds_mla caches, a prefill-sized call (two waves of CTAs
// or more; split only in its last wave's tokens) and at least four entries a slot of the slot
// space, which bounds the pass's work (one decode a slot: a quarter of a decode an entry or less)
// by a fraction of the attention's. SPARSE_SWA_ATTENTION_DECODED_KEYS=0 turns it off (development
// A/B).
bool decoded_keys_apply(const SparseAttentionParams& p, int64_t slots, int64_t max_keys,
                        int num_sms, int64_t ctas) {
  static const bool enabled = env_int("SPARSE_SWA_ATTENTION_DECODED_KEYS", 1) != 0;
  return enabled && p.kernel != AttentionKernel::kDecode && fp8_rows(p) &&
         ctas >= 2 * int64_t{num_sms} && slots > 0 && slots < (int64_t{1} << 31) &&
         p.num_tokens * max_keys >= 4 * slots;
}

// Unforced split calls of fewer (token, head group) items than this merge their fp8_ds_mla slices
// through the merge kernel: in clusters they were slower (bench/README.md#variant-log, runs 137,
// 140). (A forced prefill kernel keeps clusters, so that the tests reach every cluster size.)
constexpr int64_t kMinClusterItems = 16;

// The pairs of blocks a row of max_keys keys takes in the prefill kernels, whose slices are whole
// pairs: of 32-key blocks (fp8_ds_mla rows), of 64-key blocks (bf16 rows).
int64_t prefill_pairs(int64_t max_keys, bool bf16_rows) {
  return formulas::ceil_div(max_keys, bf16_rows ? 128 : 64);
}

// Split calls of bf16 rows take the decode kernel's single tiles below this many items, the
// prefill kernel's pairs from it on (bench/README.md#variant-log, runs 142-144: V4-Flash at 8
// tokens 20.3 -> 18.0 µs, at 1 token 14.2 against 16.5).
constexpr int64_t kMinBf16PrefillItems = 5;

// Past one wave of CTAs on the 64-row prefill kernels -- fp8_ds_mla rows read directly (one CTA
// per item) and bf16 rows (CTAs walking items, one per SM) -- the items of the last, partial wave
// would take a whole row's time on a few SMs (or after a whole item on a few CTAs). Instead the
// tokens of the full waves run whole and the last wave's tokens take slices that spread them over
// every SM: returns how many (1: none), the last wave's whole tokens (tail_tokens) split, so that
// tail_tokens x groups x slices <= SMs. bf16_rows: the kernel reads bf16 rows (bf16 caches or
// decoded keys; at 1..16 heads the few-heads kernel, whose CTAs walk items as the bf16 kernel's).
int64_t last_wave_slices(const SparseAttentionParams& p, const SmCapacity& sms, int64_t groups,
                         int64_t max_keys, bool bf16_rows, int64_t* tail_tokens) {
  const int64_t ctas = p.num_tokens * groups;
  const int64_t rest = sms.num_sms > 0 ? ctas % sms.num_sms : 0;
  if (rest == 0) return 1;
  // bf16: a walking CTA starts its next item as the last one ends, so a whole tail costs little
  // more than one item's time whatever its size, while the partials and the merge grow with it:
  // slices only for a tail of at most a quarter of the SMs' items (bench/README.md#variant-log,
  // runs 142-144 and 148).
  if (bf16_rows && 4 * rest > sms.num_sms) return 1;
  const int64_t pairs = prefill_pairs(max_keys, bf16_rows);
  *tail_tokens = formulas::ceil_div(rest, groups);
  const int64_t slices = std::min(pairs, sms.num_sms / (*tail_tokens * groups));
  // Whole, the last wave takes a CTA's overhead + the row's pairs; sliced, the overhead + a slice
  // + the merge (about a pair): slices pay where that is shorter.
  const int64_t per = slices > 0 ? formulas::ceil_div(pairs, slices) : pairs;
  return per + 1 < pairs ? slices : 1;
}

// Whether the kernels of a plan read bf16 rows: bf16 caches, or fp8_ds_mla keys decoded into the
// workspace (docs/design.md#decoded-keys).
bool reads_bf16_rows(const SparseAttentionParams& p, const DsMlaPlan& plan) {
  return p.swa_cache.dtype == CacheDtype::kBf16 || plan.decoded_keys;
}

// Adds the last wave's slices to an unsplit prefill plan past one wave, its partials after the
// plan's own workspace bytes (decoded keys), when the caller's workspace holds both.
void add_last_wave_slices(const SparseAttentionParams& p, const SmCapacity& sms, int64_t max_keys,
                          int64_t workspace_bytes, DsMlaPlan& plan) {
  int64_t tail_tokens = 0;
  const int64_t slices = plan.prefill ? last_wave_slices(p, sms, plan.groups, max_keys,
                                                         reads_bf16_rows(p, plan), &tail_tokens)
                                      : 1;
  const int64_t bytes =
      plan.workspace_bytes + slices * tail_tokens * p.num_heads * kPartialRowBytes;
  if (slices > 1 && workspace_fits(workspace_bytes, bytes)) {
    plan.splits = static_cast<int32_t>(slices);
    plan.whole_tokens = static_cast<int32_t>(p.num_tokens - tail_tokens);
    plan.partials_offset = plan.workspace_bytes;
    plan.workspace_bytes = bytes;
  }
}

// Pairs a slice when a row's `pairs` go into at most n slices of one size (as few as that size
// needs: ceil_div(pairs, the result)).
int64_t even_slice_pairs(int64_t pairs, int64_t n) {
  return formulas::ceil_div(pairs, std::min(n, pairs));
}

DsMlaPlan spread_plan(const SparseAttentionParams& p, const SmCapacity& sms,
                      int64_t workspace_bytes) {
  const int num_sms = sms.num_sms;
  DsMlaPlan plan;
  plan.group_heads = kGroupHeads;
  plan.groups = (p.num_heads + plan.group_heads - 1) / plan.group_heads;
  const int64_t ctas = p.num_tokens * plan.groups;
  const int64_t max_keys =
      int64_t{p.swa_indices.width} + (p.extra_indices.rows != 0 ? p.extra_indices.width : 0);
  // The prefill kernel takes every unsplit call (it measured faster unsplit at every shape of the
  // attention benchmark: bench/README.md#variant-log, run 34) and most split ones (below).
  plan.prefill = p.kernel != AttentionKernel::kDecode;
  if (query_groups_apply(p, max_keys, num_sms)) {
    const int64_t g = p.query_group_size;
    const int64_t bytes = group_workspace_bytes((p.num_tokens + g - 1) / g, g * max_keys);
    if (workspace_fits(workspace_bytes, bytes)) {
      plan.query_group = static_cast<int32_t>(g);
      plan.group_cap = g * max_keys;
      plan.workspace_bytes = bytes;
      return plan;
    }
  }
  if (const int64_t slots = decoded_slots(p).slots;
      decoded_keys_apply(p, slots, max_keys, num_sms, ctas)) {
    const int64_t bytes = decoded_keys_bytes(slots);
    if (workspace_fits(workspace_bytes, bytes)) {
      plan.decoded_keys = true;
      plan.workspace_bytes = bytes;
      add_last_wave_slices(p, sms, max_keys, workspace_bytes, plan);
      return plan;
    }
  }
  const int64_t max_tiles = (max_keys + kKeys - 1) / kKeys;
  if (ctas == 0 || max_tiles < kMinTilesToSplit) return plan;
  const int64_t pairs = prefill_pairs(max_keys, false);  // of 32-key blocks
  const int64_t row_bytes = p.num_tokens * p.num_heads * kPartialRowBytes;
  // Development: SPARSE_SWA_ATTENTION_SPLITS=N asks for N prefill-kernel slices (policy A/B).
  static const int asked = env_int("SPARSE_SWA_ATTENTION_SPLITS", 0);
  if (asked > 0 && plan.prefill) {
    const int64_t n = formulas::ceil_div(pairs, even_slice_pairs(pairs, asked));
    if (n > 1 && workspace_fits(workspace_bytes, n * row_bytes)) {
      plan.splits = static_cast<int32_t>(n);
      plan.cluster_merge = n <= kMaxClusterSplits;
      plan.workspace_bytes = n * row_bytes;
    }
    return plan;
  }
  if (ctas >= num_sms) {
    add_last_wave_slices(p, sms, max_keys, workspace_bytes, plan);
    return plan;
  }
  // Fill the SMs once. The prefill kernel's slices are whole pairs of blocks, as few as give the
  // widest row's pairs the same slice size (so that no CTA of a full row idles). It takes every
  // split of fp8_ds_mla rows, and of bf16 rows from kMinBf16PrefillItems items on, its slices at
  // least a pair of 64-key blocks (its pairs: slices of one 32-key pair would leave half its CTAs
  // empty); the decode kernel's single-tile slices take bf16 rows of fewer items
  // (bench/README.md#variant-log, runs 64, 137, 140 and 142-144).
  const int64_t per_row = num_sms / ctas;
  const bool auto_kernel = p.kernel == AttentionKernel::kAuto;
  const bool fp8 = fp8_rows(p);
  const bool prefill =
      auto_kernel ? fp8 || even_slice_pairs(pairs, per_row) >= 2 || ctas >= kMinBf16PrefillItems
                  : plan.prefill;
  const bool clusters = prefill && !(auto_kernel && fp8 && ctas < kMinClusterItems);
  int64_t splits = 0;
  if (prefill) {
    // Counted in the kernel's own pairs, so that every slice holds keys.
    const int64_t kernel_pairs = prefill_pairs(max_keys, !fp8);
    int64_t per = even_slice_pairs(kernel_pairs, per_row);
    splits = formulas::ceil_div(kernel_pairs, per);
    // A cluster's slices merge in the kernel, so all of a call's clusters must run at once: a
    // second wave of them doubles the time (bench/README.md#variant-log, run 137).
    while (clusters && splits > 1 && splits <= kMaxClusterSplits && ctas > sms.clusters[splits]) {
      splits = formulas::ceil_div(kernel_pairs, ++per);
    }
  } else {
    splits = std::min<int64_t>(per_row, max_tiles / kMinSliceTiles);
  }
  if (workspace_bytes >= 0) splits = std::min(splits, workspace_bytes / row_bytes);
  if (splits <= 1) return plan;
  plan.prefill = prefill;
  plan.splits = static_cast<int32_t>(splits);
  plan.cluster_merge = clusters && splits <= kMaxClusterSplits;
  plan.workspace_bytes = splits * row_bytes;
  return plan;
}

// Few heads (docs/design.md#few-heads): a prefill plan with a key list per token on bf16 rows
// (bf16 caches, or decoded keys) at 1..16 heads takes the few-heads kernel, unsplit or with the
// last wave's slices (whole_tokens > 0), never those that fill the SMs once.
// SPARSE_SWA_ATTENTION_FEW_HEADS=0 keeps the 64-row bf16 kernel (development A/B, tests).
bool few_heads_apply(const SparseAttentionParams& p, const DsMlaPlan& plan) {
  static const bool enabled = env_int("SPARSE_SWA_ATTENTION_FEW_HEADS", 1) != 0;
  return enabled && plan.prefill && reads_bf16_rows(p, plan) &&
         (plan.splits == 1 || plan.whole_tokens > 0) && plan.query_group == 1 &&
         p.num_heads <= kFewHeads && p.num_tokens > 0;
}

DsMlaPlan choose_plan(const SparseAttentionParams& p, const SmCapacity& sms,
                      int64_t workspace_bytes) {
  DsMlaPlan plan = spread_plan(p, sms, workspace_bytes);
  plan.few_heads = few_heads_apply(p, plan);
  return plan;
}

Status check_forced(const SparseAttentionParams& p) {
  if (!kernel_loaded_for_device()) {
    return invalid_argument(
        "params.kernel: the tensor-core kernels need an sm_90 device; this one runs the general "
        "kernel (leave params.kernel at kAuto)");
  }
  const CacheDtype d = p.swa_cache.dtype;
  const bool alike = p.extra_indices.rows == 0 || p.extra_cache.dtype == d;
  if ((d != CacheDtype::kFp8DsMla && d != CacheDtype::kBf16) || !alike) {
    return invalid_argument(
        "params.kernel: the tensor-core kernels read fp8_ds_mla or bf16 caches, both segments "
        "alike, got ",
        cache_dtype_name(d), " and ",
        p.extra_indices.rows == 0 ? "no extra segment" : cache_dtype_name(p.extra_cache.dtype));
  }
  return Status::Ok();
}

Status launch(const SparseAttentionParams& p, cudaStream_t stream) {
  int device = 0, num_sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return internal_error("sparse_attention: cannot read the device's SM count: ",
                          cudaGetErrorString(err));
  }
  const DsMlaPlan plan = choose_plan(p, SmCapacity::of_device(device, num_sms),
                                     p.workspace == nullptr ? 0 : p.workspace_bytes);
  Args a{};
  a.q = p.q;
  a.out = p.out;
  a.lse = p.lse;
  a.sinks = p.sinks;
  a.bad_count = p.bad_index_count;
  a.scale_log2 = p.softmax_scale * kLog2e;
  a.num_tokens = p.num_tokens;
  a.num_heads = p.num_heads;
  a.query_group = plan.query_group;
  a.key_rows = (p.num_tokens + plan.query_group - 1) / plan.query_group;
  a.groups = plan.groups;
  a.splits = plan.splits;
  a.whole_tokens = plan.whole_tokens;
  // Splits of the prefill kernels merge inside a cluster (attention_ds_mla_cluster_merge.cuh);
  // SPARSE_SWA_ATTENTION_CLUSTER_MERGE=0 sends them through the merge kernel (development A/B).
  static const bool cluster_env = env_int("SPARSE_SWA_ATTENTION_CLUSTER_MERGE", 1) != 0;
  a.cluster_merge = plan.cluster_merge && cluster_env ? 1 : 0;
  // The bf16 and few-heads prefill kernels' CTAs walk items, at most one CTA per SM;
  // SPARSE_SWA_ATTENTION_WALK_CTAS=N caps them at N (tests: every CTA walks), 0 = one per item.
  static const int walk_env = env_int("SPARSE_SWA_ATTENTION_WALK_CTAS", -1);
  a.max_ctas = a.cluster_merge ? 0 : walk_env < 0 ? num_sms : std::min(walk_env, num_sms);
  a.num_segments = p.extra_indices.rows != 0 ? 2 : 1;
  static const int ablate = env_int("SPARSE_SWA_ATTENTION_ABLATE", 0);
  a.ablate = ablate;
  a.seg0 = segment(p.swa_indices, p.swa_cache);
  a.seg1 = a.num_segments > 1 ? segment(p.extra_indices, p.extra_cache) : a.seg0;
  if (plan.query_group > 1) a.unions = group_unions(p.workspace, a.key_rows, plan.group_cap);
  // The rows that take slices: those of the tokens after the whole ones.
  const int64_t split_rows = p.num_tokens * p.num_heads - first_split_row(a);
  if (plan.splits > 1) {
    // [splits, split_rows, 512] fp32, then [splits, split_rows] (max, sum); both 16-byte aligned,
    // after the decoded keys' rows where the plan has them.
    a.partial_o =
        reinterpret_cast<float*>(static_cast<uint8_t*>(p.workspace) + plan.partials_offset);
    a.partial_ml =
        reinterpret_cast<float2*>(a.partial_o + int64_t{plan.splits} * split_rows * kHeadDim);
  }
  const int64_t blocks = launch_items(a);
  if (blocks > 0x7fffffff) {
    const int64_t per_token = plan.groups * (plan.whole_tokens > 0 ? 1 : int64_t{plan.splits});
    return invalid_argument("params.num_tokens: expected at most ", 0x7fffffff / per_token,
                            " tokens at ", p.num_heads, " heads, got ", p.num_tokens);
  }
  if (p.num_tokens > 0) {
    SPARSE_SWA_RETURN_IF_ERROR(encode_head_rows(a.q_map, p.q, p.num_tokens, p.num_heads));
    SPARSE_SWA_RETURN_IF_ERROR(encode_head_rows(a.out_map, p.out, p.num_tokens, p.num_heads));
  }
  static unsigned long long* timeline = nullptr;
#if defined(SPARSE_SWA_ATTENTION_PROFILE)
  const bool record = (ablate & kTimeline) && !stream_capturing(stream);
#else
  const bool record = false;
#endif
  if (record) {
    const size_t bytes = (1 + size_t{kMaxProfiledCtas} * 3 * 8) * 8;
    if (timeline == nullptr) cudaMalloc(&timeline, bytes);
    cudaMemset(timeline, 0, bytes);
    a.timeline = timeline;
  }
  // Three variants per cache kind: wgmma QK with wgmma or m16n8k16 PV, and m16n8k16 for both (ptxas
  // cannot fit m16n8k16 QK beside wgmma PV in the register budget).
  const bool qk = use_wgmma_qk(), pv = qk && use_wgmma_pv();
  if (plan.query_group > 1) SPARSE_SWA_RETURN_IF_ERROR(launch_query_group_union(a, stream));
  if (plan.decoded_keys) {
    // The keys decoded into the workspace; the kernel reads them as bf16 caches through the
    // call's own rows (so it also masks and counts their bad entries).
    const DecodedSlots ds = decoded_slots(p);
    const DecodedKeys d{static_cast<uint8_t*>(p.workspace), ds.slots, ds.first1};
    SPARSE_SWA_RETURN_IF_ERROR(launch_decoded_keys(a, d, num_sms, stream));
    const auto [magic, shift] = block_divider(kDecodedPage);
    for (Segment* s : {&a.seg0, &a.seg1}) {
      s->block_size = kDecodedPage;
      s->block_magic = magic;
      s->block_shift = shift;
      s->page_stride = int64_t{kDecodedPage} * kBf16TokenBytes;
    }
    a.seg0.cache = d.rows;
    a.seg1.cache = d.rows + ds.first1 * kBf16TokenBytes;
  }
  const Status launched =
      plan.few_heads ? launch_prefill_few_heads(a, stream)
      : plan.prefill ? (reads_bf16_rows(p, plan) ? launch_prefill_bf16(a, stream)
                                                 : launch_prefill_fp8(a, stream))
      : p.swa_cache.dtype == CacheDtype::kBf16 ? launch_variant<true>(qk, pv, a, stream)
                                               : launch_variant<false>(qk, pv, a, stream);
  SPARSE_SWA_RETURN_IF_ERROR(launched);
  if (record) print_profile(timeline, blocks, plan.prefill);
  if (plan.splits > 1 && !a.cluster_merge) launch_merge(a, split_rows, num_sms, stream);
  err = cudaGetLastError();
  if (err != cudaSuccess) {
    return internal_error("sparse_attention: kernel launch failed: ", cudaGetErrorString(err));
  }
  return Status::Ok();
}

}  // namespace ds_mla

bool ds_mla_attention_applies(const SparseAttentionParams& p) { return ds_mla::applies(p); }

DsMlaPlan plan_ds_mla_attention(const SparseAttentionParams& p, const SmCapacity& sms,
                                int64_t workspace_bytes) {
  return ds_mla::choose_plan(p, sms, workspace_bytes);
}

DsMlaPlan plan_ds_mla_attention(const SparseAttentionParams& p, int num_sms,
                                int64_t workspace_bytes) {
  return ds_mla::choose_plan(p, SmCapacity::ideal(num_sms), workspace_bytes);
}

SmCapacity SmCapacity::ideal(int32_t num_sms) {
  SmCapacity c;
  c.num_sms = num_sms;
  for (int size = 1; size < 9; ++size) c.clusters[size] = num_sms / size;
  return c;
}

namespace {

// Stands in for the prefill kernels in the cluster query: a CTA of theirs fills an SM, and so
// does one of this with more than half an SM's shared memory.
__global__ void sm_filling_kernel() {}
constexpr int kSmFillingBytes = 160 * 1024;
static_assert(ds_mla::kMaxClusterSplits < static_cast<int>(std::size(SmCapacity{}.clusters)));

SmCapacity ask_device(int device, int32_t num_sms) {
  SmCapacity c = SmCapacity::ideal(num_sms);
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device ||
      cudaFuncSetAttribute(sm_filling_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           kSmFillingBytes) != cudaSuccess) {
    cudaGetLastError();
    return c;
  }
  for (int size = 2; size <= ds_mla::kMaxClusterSplits; ++size) {
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = static_cast<unsigned>(size);
    cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(size));
    config.blockDim = dim3(ds_mla::kPrefillThreads);
    config.dynamicSmemBytes = kSmFillingBytes;
    config.attrs = &cluster;
    config.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, sm_filling_kernel, &config) == cudaSuccess) {
      c.clusters[size] = n;
    } else {
      cudaGetLastError();  // no answer: the ideal count stays
    }
  }
  return c;
}

}  // namespace

SmCapacity SmCapacity::of_device(int device, int32_t num_sms) {
  // Asked once per device (every call plans, so no lock after that); past kDevices, every time.
  constexpr int kDevices = 64;
  static std::once_flag once[kDevices];
  static SmCapacity known[kDevices];
  if (device < 0 || device >= kDevices) return ask_device(device, num_sms);
  std::call_once(once[device], [&] { known[device] = ask_device(device, num_sms); });
  return known[device].num_sms == num_sms ? known[device] : ask_device(device, num_sms);
}

Status launch_ds_mla_attention(const SparseAttentionParams& p, cudaStream_t stream) {
  return ds_mla::launch(p, stream);
}

Status check_forced_ds_mla_kernel(const SparseAttentionParams& p) {
  return ds_mla::check_forced(p);
}

}  // namespace sparse_swa::detail
