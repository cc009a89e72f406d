// SPDX-License-Identifier: Apache-2.0
// Decoded keys (docs/design.md#decoded-keys): before a prefill-sized call on fp8_ds_mla caches
// whose tokens share their keys, each slot of the caches is decoded once into a bf16 copy in the
// workspace (row k = slot k), which the bf16 pair kernel then reads through the call's own index
// rows. The fp8_ds_mla pair kernel decodes a key for every token that reads it, and the decoded
// bytes cross the SM's shared memory on top of the loads.
//
// One pass on the stream, no host sync: every slot of the slot space is decoded into its row,
// exactly as the fp8_ds_mla kernels decode into shared memory. The plan takes this path only where
// the call reads at least four entries a slot, so decoding the slots no entry names costs less
// than finding the named ones. Entries < -1 or past a cache are left to the bf16 kernel, which
// masks and counts them as the fp8_ds_mla kernel does.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/attention/fp8_decode.cuh"
#include "cuda/attention/sm90_common.cuh"
#include "cuda/attention/sm90_kernels.h"
#include "cuda/attention/sm90_params.h"

namespace sparse_swa::detail::sm90 {
namespace {

constexpr int kPassThreads = 256;

// One warp a slot: lanes 0..27 decode the 16 e4m3 codes of NoPE chunk `lane` (scale byte
// lane / 4), lanes 28..31 copy 16 RoPE values each.
__global__ void __launch_bounds__(kPassThreads) decode_keys_kernel(const DecodeKeysParams d) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * (kPassThreads / 32);
  for (int64_t k = (int64_t{blockIdx.x} * kPassThreads + threadIdx.x) >> 5; k < d.slots;
       k += warps) {
    const bool swa = k < d.first1;
    const Segment& s = swa ? d.seg0 : d.seg1;
    uint32_t offset;
    const uint8_t* page = slot_page(s, static_cast<uint32_t>(swa ? k : k - d.first1), offset);
    const uint8_t* src = page + static_cast<int64_t>(offset) * kDsMlaTokenBytes;
    uint4* dst = reinterpret_cast<uint4*>(d.rows + k * kBf16RowBytes) + 2 * lane;
    if (lane < kNopeChunks) {
      const uint2 sc = *reinterpret_cast<const uint2*>(
          page + static_cast<int64_t>(s.block_size) * kDsMlaTokenBytes +
          static_cast<int64_t>(offset) * kDsMlaScaleBytes);
      const uint4 v = *reinterpret_cast<const uint4*>(src + lane * 16);
      uint4 lo, hi;
      if (has_huge_scale(sc)) {
        decode_nope_chunk<true>(v, sc, lane / 4, lo, hi);
      } else {
        decode_nope_chunk<false>(v, sc, lane / 4, lo, hi);
      }
      dst[0] = lo;
      dst[1] = hi;
    } else {
      const uint4* rope = reinterpret_cast<const uint4*>(src + kNopeDim) + 2 * (lane - kNopeChunks);
      dst[0] = rope[0];
      dst[1] = rope[1];
    }
  }
}

}  // namespace

Status launch_decode_keys(const DecodeKeysParams& d, int num_sms, cudaStream_t stream) {
  const unsigned slots_grid = static_cast<unsigned>(std::min<int64_t>(
      (d.slots + kPassThreads / 32 - 1) / (kPassThreads / 32), int64_t{num_sms} * 16));
  decode_keys_kernel<<<slots_grid, kPassThreads, 0, stream>>>(d);
  return Status::Ok();
}

}  // namespace sparse_swa::detail::sm90
