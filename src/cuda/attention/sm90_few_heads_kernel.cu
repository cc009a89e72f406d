// SPDX-License-Identifier: Apache-2.0
// The few-heads kernel (1..16 heads) on bf16 rows (bf16 caches, or fp8_ds_mla keys decoded into
// the workspace; docs/design.md#few-heads). sm_90a only; semantics and precision as the bf16 pair
// kernel's (sm90_pairs_bf16_kernel.cu): exact running maximum, P rounded to bf16 once, sums over
// P before rounding.
//
// The keys go in the MMA's M dimension, so that the tensor cores work on the heads there are
// instead of 64 rows of which most are padding: per block of 64 keys,
//   S^T [64 keys, kN heads] = K Q^T      (32 wgmma m64nNk16 steps over the 512 dims, A = K)
//   O^T [512 dims, kN heads] += V^T P^T  (8 dim tiles x 4 key steps, A = V read transposed)
// with kN = 8 or 16 columns (heads past H are zero rows of Q and are never written). A column's
// maximum and sum run over rows: within a warp by shuffles, across the warpgroup's four warps
// through shared memory.
//
// 256 threads: a math warpgroup (0) and a producer warpgroup (1) that copies each block's bf16
// rows by cp.async (8 threads a row, as the bf16 kernel) into a ring of kStages 64 KB stages, and
// each item's Q rows once the math has done the previous item's last QK step. A CTA walks items
// (one query token, all heads, or a slice of a last-wave token's keys: docs/design.md#splits)
// blockIdx.x, + gridDim.x, ...; the ring's phases count the CTA's blocks over all its items, so
// the next item's keys load while this one finishes.
#include <cuda_runtime.h>

#include <cstdint>

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#pragma nv_diag_suppress 177
#endif

#include "attention/sm90_shapes.h"
#include "cuda/attention/grid_launch.cuh"
#include "cuda/attention/pairs_common.cuh"
#include "cuda/attention/ptx.cuh"
#include "cuda/attention/sm90_common.cuh"
#include "cuda/attention/sm90_kernels.h"
#include "cuda/attention/sm90_params.h"
#include "sparse_swa/kv_cache.h"

namespace sparse_swa::detail::sm90 {
namespace {

using few_heads::kBlockKeys;
constexpr int kStages = 3;
constexpr int kFewThreads = 256;
constexpr int kColBlock = kBlockKeys * 128;  // one [64 keys, 64 dims] sw128 column block

// Shared memory from a 1024-aligned base. kN: the MMA's N (8 or 16 heads).
template <int kN>
struct FewHeadsLayout {
  static constexpr bool kQueryGroups = false;
  static constexpr int kQBytes = kN * kHeadDim * 2;  // [kN heads, 512] bf16, 8 sw128 col blocks
  static constexpr int kStageBytes = kBlockKeys * kHeadDim * 2;  // [64 keys, 512] bf16, sw128
  static constexpr int kKOff = kQBytes;
  static constexpr int kPOff = kKOff + kStages * kStageBytes;  // [kN heads, 64 keys] bf16, sw128
  static constexpr int kPBytes = kN * 128;
  static constexpr int kMaskOff = kPOff + (kPBytes + 1023) / 1024 * 1024;  // [kStages] uint64
  static constexpr int kRedOff = kMaskOff + kStages * 8;                   // [2][4 warps][kN] fp32
  static constexpr int kBarOff = kRedOff + 2 * 4 * kN * 4;
  // full[kStages], empty[kStages], Q's arrival, Q's release.
  static constexpr size_t kSmem = kBarOff + (2 * kStages + 2) * 8 + 1024;
  static_assert(kSmem <= 227 * 1024, "more shared memory than an sm_90 CTA can have");
  static_assert(kKOff % 1024 == 0 && kPOff % 1024 == 0);
};

struct Bars {
  uint32_t base;
  __device__ uint32_t full(int s) const { return base + 8 * s; }
  __device__ uint32_t empty(int s) const { return base + 8 * (kStages + s); }
  __device__ uint32_t q_full() const { return base + 8 * (2 * kStages); }
  __device__ uint32_t q_empty() const { return base + 8 * (2 * kStages + 1); }
};

// d[64 x kN] (+)= a[64 x 16] * b[16 x kN]; b K-major in shared memory, a K-major (kTransA = 0)
// or MN-major (1: a's 16 columns each contiguous along M). Thread layout as wgmma_m64n32k16.
template <int kN, int kTransA>
__device__ __forceinline__ void wgmma_narrow(float (&d)[kN / 2], uint64_t a, uint64_t b,
                                             bool accumulate) {
  if constexpr (kN == 8) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %6, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, "
        "%7, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(kTransA));
  } else {
    static_assert(kN == 16);
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, "
        "%8, %9, p, 1, 1, %11, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7])
        : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(kTransA));
  }
}

// A warp's share of the column reductions: value(j, e) is column 8 j + 2 (lane % 4) + e over the
// lane's rows; reduced by op over the warp's 16 rows (shuffles), stored by lanes 0-3 as row `warp`
// of cols [4 warps][kN].
template <int kN, class Value, class Op>
__device__ __forceinline__ void store_warp_columns(Value value, Op op, float* cols, int warp,
                                                   int lane) {
  float x[kN / 8][2];
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      x[j][e] = value(j, e);
      x[j][e] = op(x[j][e], __shfl_xor_sync(0xffffffffu, x[j][e], 4));
      x[j][e] = op(x[j][e], __shfl_xor_sync(0xffffffffu, x[j][e], 8));
      x[j][e] = op(x[j][e], __shfl_xor_sync(0xffffffffu, x[j][e], 16));
    }
  }
  if (lane < 4) {
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) cols[warp * kN + 8 * j + 2 * lane + e] = x[j][e];
    }
  }
}

// The bf16 row of key j of the item's list (entry idx), or nullptr (masked); entries < -1 or past
// the cache are counted (one resolver thread a key).
template <class L>
__device__ __forceinline__ const uint8_t* row_of(const FewHeadsParams& a, const Cta<L>& c,
                                                 int64_t j, int32_t idx) {
  if (idx == -1) return nullptr;
  const Segment& s = j < c.len0 ? a.seg0 : a.seg1;
  if (idx >= 0 && static_cast<uint32_t>(idx) < s.num_slots) {
    return bf16_slot_row(s, static_cast<uint32_t>(idx));
  }
  if (a.bad_count != nullptr) atomicAdd(a.bad_count, 1);
  return nullptr;
}

// The producer over the CTA's items: per item its Q rows (once the math released the last
// item's), then its blocks into the ring. Thread i < 4 of each 8-thread group (tid % 8) resolves
// key i of the group's four keys and shares its row by a shuffle.
template <int kN>
__device__ void few_heads_producer(const FewHeadsParams& a, Cta<FewHeadsLayout<kN>> c, int tid,
                                   const Bars& bars) {
  using L = FewHeadsLayout<kN>;
  const uint32_t items = static_cast<uint32_t>(launch_items(a));
  const int lane = tid & 31, chunk = tid & 7, group_lane0 = lane & 24;
  const int my_key = copy_key(tid, chunk & 3);  // the key this thread resolves (chunk < 4)
  uint32_t g = 0;                               // the CTA's blocks so far
  for (uint32_t item = blockIdx.x, seq = 0; item < items; item += gridDim.x, ++seq) {
    start_item<true>(a, c, item);
    settle_item<true>(a, c, kBlockKeys);
    if (seq > 0) ptx::mbar_wait(bars.q_empty(), (seq - 1) & 1);
    // Q: [kN, 512] bf16, rows past the heads as zeros.
    for (int i = tid; i < kN * 64; i += 128) {
      const int h = i >> 6, c16 = i & 63;
      const bool valid = h < c.heads;
      const uint16_t* src = valid ? a.q + (c.t * a.num_heads + h) * kHeadDim + c16 * 8 : a.q;
      const uint32_t dst =
          c.sbase + (c16 >> 3) * (kN * 128) + h * 128 + (((c16 & 7) ^ (h & 7)) << 4);
      ptx::cp_async_16_or_zero(dst, src, valid);
    }
    ptx::cp_async_mbar_arrive(bars.q_full());
    // Index entries one block ahead (four blocks ahead measured the same).
    int32_t next = chunk < 4 ? item_key_index(a, c, item_key(c.tile0, 0, kBlockKeys, my_key)) : -1;
    for (int b = 0; b < c.n; ++b, ++g) {
      const int s = static_cast<int>(g % kStages);
      const int64_t j = item_key(c.tile0, b, kBlockKeys, my_key);
      const uint8_t* mine = chunk < 4 ? row_of(a, c, j, next) : nullptr;
      if (chunk < 4) next = item_key_index(a, c, j + kBlockKeys);
      if (g >= kStages) ptx::mbar_wait(bars.empty(s), (g / kStages - 1) & 1);
      // The warp's 16 keys' validity: ballot bit 8 grp + i is key 16 w + 4 i + grp, stored as
      // bit 4 i + grp of the warp's word of the block's 64-bit mask.
      const uint32_t ballot = __ballot_sync(0xffffffffu, mine != nullptr);
      if (lane == 0) {
        uint32_t bits = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
          for (int grp = 0; grp < 4; ++grp)
            bits |= ((ballot >> (8 * grp + i)) & 1u) << (4 * i + grp);
        }
        reinterpret_cast<uint16_t*>(c.base + L::kMaskOff + 8 * s)[tid >> 5] =
            static_cast<uint16_t>(bits);
        ptx::mbar_arrive(bars.full(s));  // the mask word (release)
      }
      const uint32_t dst0 = c.sbase + L::kKOff + s * L::kStageBytes;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint8_t* row = reinterpret_cast<const uint8_t*>(
            __shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(mine), group_lane0 + i));
        const int key = copy_key(tid, i);
        const bool valid = row != nullptr;
        const uint8_t* src = valid ? row + chunk * 16 : reinterpret_cast<const uint8_t*>(a.q);
#pragma unroll
        for (int cb = 0; cb < 8; ++cb) {
          ptx::cp_async_16_or_zero(dst0 + cb * kColBlock + key * 128 + ((chunk ^ (key & 7)) << 4),
                                   src + cb * 128, valid);
        }
      }
      ptx::cp_async_mbar_arrive(bars.full(s));
    }
  }
  ptx::cp_async_wait<0>();
}

// The math warpgroup over the CTA's items. Accumulator element 4 j + 2 hh + e of a thread is row
// 16 (tid / 32) + lane / 4 + 8 hh (a key; for O^T a dim of the tile) and column 8 j + 2 (lane % 4)
// + e (a head).
template <int kN>
__device__ void few_heads_math(const FewHeadsParams& a, Cta<FewHeadsLayout<kN>> c, int tid,
                               const Bars& bars) {
  using L = FewHeadsLayout<kN>;
  constexpr int kJ = kN / 8;  // n-tiles
  const uint32_t items = static_cast<uint32_t>(launch_items(a));
  const int lane = tid & 31, warp = tid >> 5;
  const int row = 16 * warp + (lane >> 2);
  const uint64_t q_desc = ptx::sw128_desc(c.sbase);
  const uint64_t p_desc = ptx::sw128_desc(c.sbase + L::kPOff);
  float* red = reinterpret_cast<float*>(c.base + L::kRedOff);  // [2][4][kN]
  uint32_t g = 0;
  for (uint32_t item = blockIdx.x, seq = 0; item < items; item += gridDim.x, ++seq) {
    start_item<true>(a, c, item);
    settle_item<true>(a, c, kBlockKeys);
    float o[8][kN / 2];
#pragma unroll
    for (int d = 0; d < 8; ++d) {
#pragma unroll
      for (int k = 0; k < kN / 2; ++k) o[d][k] = 0.0f;
    }
    float m[kJ][2], l[kJ][2];
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      m[j][0] = m[j][1] = -INFINITY;
      l[j][0] = l[j][1] = 0.0f;
    }
    ptx::mbar_wait(bars.q_full(), seq & 1);
    if (c.n == 0) ptx::mbar_arrive(bars.q_empty());
    for (int b = 0; b < c.n; ++b, ++g) {
      const int s = static_cast<int>(g % kStages);
      const uint32_t stage = c.sbase + L::kKOff + s * L::kStageBytes;
      ptx::mbar_wait(bars.full(s), (g / kStages) & 1);
      ptx::fence_proxy_async();  // cp.async rows (generic proxy) read by wgmma (async proxy)
      float sc[kN / 2] = {};
      const uint64_t k_desc = ptx::sw128_desc(stage);
      ptx::wgmma_fence();
#pragma unroll
      for (int step = 0; step < 32; ++step) {
        const int cb = step >> 2;
        const uint32_t inner = (step & 3) * 32;
        wgmma_narrow<kN, 0>(sc, ptx::desc_advance(k_desc, cb * kColBlock + inner),
                            ptx::desc_advance(q_desc, cb * (kN * 128) + inner), step != 0);
      }
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();
      if (b + 1 == c.n) ptx::mbar_arrive(bars.q_empty());  // the item's last QK step is done
      const uint64_t mask = *reinterpret_cast<const uint64_t*>(c.base + L::kMaskOff + 8 * s);
      const bool v0 = (mask >> row) & 1u, v1 = (mask >> (row + 8)) & 1u;
      // Scores scaled (masked keys -inf), and each column's maximum over the block's 64 rows.
      const auto block_max = [&](int jj, int e) {
        float& x0 = sc[4 * jj + e];
        float& x1 = sc[4 * jj + 2 + e];
        x0 = v0 ? x0 * a.scale_log2 : -INFINITY;
        x1 = v1 ? x1 * a.scale_log2 : -INFINITY;
        return fmaxf(x0, x1);
      };
      float* rb = red + (g & 1) * 4 * kN;
      store_warp_columns<kN>(
          block_max, [](float x, float y) { return fmaxf(x, y); }, rb, warp, lane);
      ptx::named_barrier(1, 128);
      float corr[kJ][2];
      bool moved = false;
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = 8 * j + 2 * (lane & 3) + e;
          const float bm =
              fmaxf(fmaxf(rb[col], rb[kN + col]), fmaxf(rb[2 * kN + col], rb[3 * kN + col]));
          const float mn = fmaxf(m[j][e], bm);
          corr[j][e] = mn == -INFINITY ? 1.0f : fast_exp2(m[j][e] - mn);
          moved |= corr[j][e] != 1.0f;
          m[j][e] = mn;
        }
      }
      // P^T into shared memory as P [kN heads, 64 keys] (K-major B of O^T += V^T P^T).
      uint8_t* p_tile = c.base + L::kPOff;
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = 8 * j + 2 * (lane & 3) + e;
          const bool none = m[j][e] == -INFINITY;
          const float p0 = none ? 0.0f : fast_exp2(sc[4 * j + e] - m[j][e]);
          const float p1 = none ? 0.0f : fast_exp2(sc[4 * j + 2 + e] - m[j][e]);
          l[j][e] = l[j][e] * corr[j][e] + (p0 + p1);
          const uint32_t packed = pack_bf16(p0, p1);
          uint8_t* prow = p_tile + (col >> 3) * 1024 + (col & 7) * 128;
          const int r0 = row, r1 = row + 8;
          *reinterpret_cast<uint16_t*>(prow + ((((r0 >> 3) ^ (col & 7))) << 4) + (r0 & 7) * 2) =
              static_cast<uint16_t>(packed & 0xffffu);
          *reinterpret_cast<uint16_t*>(prow + ((((r1 >> 3) ^ (col & 7))) << 4) + (r1 & 7) * 2) =
              static_cast<uint16_t>(packed >> 16);
        }
      }
      if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int d = 0; d < 8; ++d) {
#pragma unroll
          for (int j = 0; j < kJ; ++j) {
#pragma unroll
            for (int k = 0; k < 4; ++k) o[d][4 * j + k] *= corr[j][k & 1];
          }
        }
      }
      ptx::fence_proxy_async();
      ptx::named_barrier(1, 128);  // every warp's P is in
      const uint64_t v_desc = ptx::sw128_desc(stage, kColBlock, 1024);
      ptx::wgmma_fence();
#pragma unroll
      for (int d = 0; d < 8; ++d) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          wgmma_narrow<kN, 1>(o[d], ptx::desc_advance(v_desc, d * kColBlock + kk * 2048),
                              ptx::desc_advance(p_desc, kk * 32), true);
        }
      }
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();
      ptx::mbar_arrive(bars.empty(s));
    }
    // The columns' sums over all 64 rows, then the rows out: out[t, h, 64 d + r] = O^T[r, h].
    float* sums = red;  // the last block's maxima are read (its P barrier), the next's not yet in
    store_warp_columns<kN>([&](int jj, int e) { return l[jj][e]; },
                           [](float x, float y) { return x + y; }, sums, warp, lane);
    ptx::named_barrier(1, 128);
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = 8 * j + 2 * (lane & 3) + e;
        if (col >= c.heads) continue;
        const float total = sums[col] + sums[kN + col] + sums[2 * kN + col] + sums[3 * kN + col];
        const int64_t out_row = c.t * a.num_heads + col;
        if (finished_token(a, c.t)) {
          const RowFinish f =
              finish_row(m[j][e], total, a.sinks != nullptr ? a.sinks + col : nullptr);
          if (tid < 4) a.lse[out_row] = f.lse;
          uint16_t* y = a.out + out_row * kHeadDim;
#pragma unroll
          for (int d = 0; d < 8; ++d) {
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
              const float v = o[d][4 * j + 2 * hh + e] * f.factor;
              y[64 * d + row + 8 * hh] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
            }
          }
        } else {
          // A slice of a last-wave token: unnormalised rows and (max, sum) for the merge kernel.
          const int64_t prow = partial_row(a, c.split, out_row);
          if (tid < 4) a.partial_ml[prow] = make_float2(m[j][e], total);
          float* py = a.partial_o + prow * kHeadDim;
#pragma unroll
          for (int d = 0; d < 8; ++d) {
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) py[64 * d + row + 8 * hh] = o[d][4 * j + 2 * hh + e];
          }
        }
      }
    }
    ptx::named_barrier(1, 128);  // the sums are read before the next item's maxima reuse them
  }
}

template <int kN>
__global__ void __launch_bounds__(kFewThreads, 1)
    sm90_few_heads_kernel(const __grid_constant__ FewHeadsParams a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = FewHeadsLayout<kN>;
  extern __shared__ uint8_t smem_raw[];
  Cta<L> c;
  place_smem(c, smem_raw);
  const Bars bars{c.sbase + L::kBarOff};
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbar_init(bars.full(s), 128 + 4);  // the copies' arrivals, one a warp for its bytes
      ptx::mbar_init(bars.empty(s), 128);
    }
    ptx::mbar_init(bars.q_full(), 128);
    ptx::mbar_init(bars.q_empty(), 128);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  if (tid < 128) {
    few_heads_math<kN>(a, c, tid, bars);
  } else {
    few_heads_producer<kN>(a, c, tid - 128, bars);
  }
#else
  (void)a;  // sm_90a only
#endif
}

template <int kN>
Status launch_few(const FewHeadsParams& a, unsigned max_ctas, cudaStream_t stream) {
  // Never cluster-merged (unsplit, or the last wave's slices through the merge kernel), so the
  // CTAs walk items, or take one each.
  return launch_item_grid<sm90_few_heads_kernel<kN>>(a, FewHeadsLayout<kN>::kSmem, kFewThreads,
                                                     max_ctas, 0, stream);
}

}  // namespace

Status launch_sm90_few_heads(const FewHeadsParams& a, unsigned max_ctas, cudaStream_t stream) {
  static_assert(few_heads::kMaxHeads == 16, "kN = 8 or 16 columns cover the plan's heads");
  return a.num_heads <= 8 ? launch_few<8>(a, max_ctas, stream)
                          : launch_few<16>(a, max_ctas, stream);
}

}  // namespace sparse_swa::detail::sm90
