// SPDX-License-Identifier: Apache-2.0
// The tile32 kernel's (sm90_tile32_kernel.cu) threads, registers and shared-memory layout per
// cache kind, shared by its roles (tile32_producer.cuh, tile32_qk_softmax.cuh, tile32_pv.cuh).
#pragma once

#include <cstdint>

#include "attention/sm90_shapes.h"
#include "cuda/attention/sm90_common.cuh"
#include "sparse_swa/kv_cache.h"

namespace sparse_swa::detail::sm90 {

using tile32::kTileKeys;
constexpr int kTile32Threads = 512;  // 4 warpgroups: producer, QK + softmax, PV, PV
// Pipeline depths: fp8_ds_mla keys gathered kFp8RawStages tiles deep, decoded into kFp8KStages
// bf16 stages; kPBuffers P tiles between QK and PV.
constexpr int kFp8KStages = 2, kFp8RawStages = 4, kPBuffers = 2;
// Registers per thread of each role (setmaxnreg); 128 x (producer + QK + 2 PV) = the 64 K
// registers of the SM.
constexpr int kProducerRegs = 64;
constexpr int kQkRegs = 80;
constexpr int kPvRegs = (512 - kProducerRegs - kQkRegs) / 2 / 8 * 8;
static_assert(kProducerRegs % 8 == 0 && kProducerRegs + kQkRegs + 2 * kPvRegs <= 512);
constexpr int kChunks = kDsMlaTokenBytes / 16;  // 36 sixteen-byte pieces per key: 28 e4m3, 8 bf16
constexpr int kRawScales = kTileKeys * kDsMlaTokenBytes;              // scale bytes in a raw stage
constexpr int kRawStage = kRawScales + kTileKeys * kDsMlaScaleBytes;  // 18688 bytes
constexpr int kKBytes = kTileKeys * kHeadDim * 2;                     // [32, 512] bf16, swizzled
constexpr int kKOff = kQOff + kQBytes;

// The pipeline of one cache kind. fp8_ds_mla: kRawStages gathered tiles in flight (kRawStages - 1
// ahead), decoded into kKStages bf16 K stages. bf16: rows are copied straight into the K stages
// (no decode), so the raw stages' room holds two more K stages. kPBufs P tiles between QK and PV
// (columns 0-31 the bf16 hi parts of the 32 keys' weights, 32-63 the lo parts).
template <bool kBf16Cache>
struct Tile32Layout {
  static constexpr bool kBf16 = kBf16Cache;
  static constexpr bool kQueryGroups = false;  // a key list per token (Cta::row)
  static constexpr int kKStages = kBf16 ? 4 : kFp8KStages;
  static constexpr int kRawStages = kBf16 ? 0 : kFp8RawStages;
  static constexpr int kPBufs = kPBuffers;
  static constexpr int kPOff = kKOff + kKStages * kKBytes;
  static constexpr int kRawOff = kPOff + kPBufs * kPBytes;
  static constexpr int kCorrOff = kRawOff + kRawStages * kRawStage;  // [kPBufs][64] fp32
  static constexpr int kMlOff = kCorrOff + kPBufs * kHeadGroup * 4;  // [64] (max, sum)
  static constexpr int kValidKOff = kMlOff + kHeadGroup * 8;         // [kKStages] uint32 masks
  static constexpr int kValidRawOff = kValidKOff + kKStages * 4;     // [kRawStages][32] bytes
  static constexpr int kBarOff = (kValidRawOff + kRawStages * kTileKeys + 7) / 8 * 8;  // mbarriers
  static constexpr int kNumBars = 2 * kKStages + 2 * kPBufs + 1;                       // + Q's
  static constexpr size_t kSmem = kBarOff + kNumBars * 8 + 1024;  // + alignment slack
  static_assert(kSmem <= 227 * 1024, "more shared memory than an sm_90 CTA can have");
  static_assert(kKOff % 1024 == 0 && kKBytes % 1024 == 0 && kPOff % 1024 == 0,
                "swizzled tiles need 1024-byte bases");
};

}  // namespace sparse_swa::detail::sm90
