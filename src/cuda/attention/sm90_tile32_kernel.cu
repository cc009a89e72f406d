// SPDX-License-Identifier: Apache-2.0
// The tile32 kernel: sparse MLA attention on the tensor cores for fp8_ds_mla or bf16 caches,
// sm_90a only (semantics: include/sparse_swa/attention.h; overview:
// docs/design.md#attention-kernels). The plan gives it the split calls of bf16 rows with few
// items, and params.kernel = kSm90Tile32 any call.
//
// One CTA = one query token x a group of up to 64 heads x one slice of the token's key list.
// The keys of both segments are one list (SWA entries first), walked in tiles of 32 by three
// roles (warp specialisation, 512 threads) that hand tiles on through mbarriers:
//   producer (warpgroup 0, tile32_producer.cuh)  fp8_ds_mla: cp.async gathers each valid key's
//       576 data and 8 scale bytes into a raw stage (four stages, three tiles ahead), then
//       decodes the tile into bf16 rows (e4m3 * 2^(s - 127) is exact in bf16; masked keys -- -1,
//       past the length, out of range -- become zero rows) in one of two K stages, stored in the
//       128-byte swizzle layout that wgmma reads. bf16: cp.async copies the rows straight into one
//       of four K stages (three tiles ahead), masked keys as zero rows;
//   QK + softmax (warpgroup 1, tile32_qk_softmax.cuh)  S = Q K^T, fp32 accumulators: one wgmma
//       m64n32k16 chain for the 64-row head group; then the online softmax in base 2 (masked keys
//       -inf), P written as bf16 hi + lo parts with the rows' rescale factors;
//   PV (warpgroups 2-3, tile32_pv.cuh)  O += P V with V = the same rows: wgmma m64n128k16
//       (warpgroup g owns dims 256 g + [0, 256) of all 64 rows); P's two bf16 parts keep ~16 bits
//       of P, as the fp32 reference does.
// Split, each slice writes partials for the merge kernel (split_merge_kernel.cu). No host sync,
// no allocation.
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Targets other than sm_90a compile the kernel as a stub: its device helpers go unused there.
#pragma nv_diag_suppress 177
#endif

#include "cuda/attention/ptx.cuh"
#include "cuda/attention/sm90_common.cuh"
#include "cuda/attention/sm90_kernels.h"
#include "cuda/attention/sm90_params.h"
#include "cuda/attention/tile32_layout.cuh"
#include "cuda/attention/tile32_producer.cuh"
#include "cuda/attention/tile32_pv.cuh"
#include "cuda/attention/tile32_qk_softmax.cuh"

namespace sparse_swa::detail::sm90 {
namespace {

template <bool kBf16>
__global__ void __launch_bounds__(kTile32Threads, 1)
    sm90_tile32_kernel(const __grid_constant__ Tile32Params a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Tile32Layout<kBf16>;
  extern __shared__ uint8_t smem_raw[];
  Cta<L> c;
  place_smem(c, smem_raw);
  const int tid = threadIdx.x;
  c.split = static_cast<int>(blockIdx.x % a.splits);
  const int64_t tg = blockIdx.x / a.splits;
  c.h0 = static_cast<int>(tg % a.groups) * kHeadGroup;
  c.t = tg / a.groups;
  c.heads = min(kHeadGroup, a.num_heads - c.h0);
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
  const int32_t all_tiles = static_cast<int32_t>((c.total + kTileKeys - 1) / kTileKeys);
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
    qk_softmax(a, c, (tid >> 5) & 3, tid & 31);
  } else {
    ptx::setmaxnreg_inc<kPvRegs>();
    pv_wgmma(a, c, wg - 2, (tid >> 5) & 3, tid & 31);
  }
#else
  (void)a;  // sm_90a only (wgmma, setmaxnreg): other targets never launch it
#endif
}

template <bool kBf16>
Status launch_form(const Tile32Params& a, cudaStream_t stream) {
  using L = Tile32Layout<kBf16>;
  static std::once_flag once;
  static cudaError_t attr_err = cudaSuccess;
  std::call_once(once, [] {
    attr_err =
        cudaFuncSetAttribute(sm90_tile32_kernel<kBf16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(L::kSmem));
  });
  if (attr_err != cudaSuccess) {
    return internal_error("sparse_attention: cannot reserve ", L::kSmem,
                          " bytes of shared memory per CTA: ", cudaGetErrorString(attr_err));
  }
  const int64_t blocks = a.num_tokens * a.groups * a.splits;
  sm90_tile32_kernel<kBf16><<<static_cast<unsigned>(blocks), kTile32Threads, L::kSmem, stream>>>(a);
  return Status::Ok();
}

}  // namespace

Status launch_sm90_tile32(const Tile32Params& a, bool bf16_cache, cudaStream_t stream) {
  return bf16_cache ? launch_form<true>(a, stream) : launch_form<false>(a, stream);
}

bool sm90_kernels_loaded() {
  static const bool loaded = [] {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, sm90_tile32_kernel<false>) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return attr.binaryVersion == 90;
  }();
  return loaded;
}

}  // namespace sparse_swa::detail::sm90
