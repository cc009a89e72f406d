// SPDX-License-Identifier: Apache-2.0
// Sparse MLA attention on the tensor cores for fp8_ds_mla or bf16 caches, sm_90a only (the
// semantics are include/sparse_swa/attention.h's, the CPU reference
// src/cpu/attention_reference.cc; overview in docs/design.md#attention-kernels).
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
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "cuda/attention_ds_mla.cuh"
#include "cuda/cuda_utils.h"
#include "cuda/mma_ptx.cuh"
#include "sparse_swa/kv_cache.h"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Targets other than sm_90a compile the kernel as a stub: its device helpers go unused there.
#pragma nv_diag_suppress 177
#endif

namespace sparse_swa::detail {
namespace {

constexpr int kKeys = 32;        // keys per tile
constexpr int kGroupHeads = 64;  // heads per CTA (fewer: zero rows, skipped where possible)
constexpr int kThreads = 512;    // 4 warpgroups: producer, QK, PV, PV
// Pipeline depths. SPARSE_SWA_ATTENTION_STAGES=KRP (three digits: K stages, raw stages, P
// buffers) overrides them in development builds (bench/README.md#variant-log); shared memory
// allows 242 (the default), 331 or 322.
#if defined(SPARSE_SWA_ATTENTION_STAGES)
constexpr int kStageConfig[3] = {SPARSE_SWA_ATTENTION_STAGES / 100,
                                 SPARSE_SWA_ATTENTION_STAGES / 10 % 10,
                                 SPARSE_SWA_ATTENTION_STAGES % 10};
#else
constexpr int kStageConfig[3] = {2, 4, 2};
#endif
// Registers per thread of each role (setmaxnreg); 128 x (producer + QK + 2 PV) = the 64 K
// registers of the SM. SPARSE_SWA_ATTENTION_PRODUCER_REGS (development builds) moves registers
// from the PV warpgroups to the producer.
#if defined(SPARSE_SWA_ATTENTION_PRODUCER_REGS)
constexpr int kProducerRegs = SPARSE_SWA_ATTENTION_PRODUCER_REGS;
#else
constexpr int kProducerRegs = 64;
#endif
constexpr int kQkRegs = 80;
constexpr int kPvRegs = (512 - kProducerRegs - kQkRegs) / 2 / 8 * 8;
static_assert(kProducerRegs % 8 == 0 && kProducerRegs + kQkRegs + 2 * kPvRegs <= 512);
constexpr int kBf16TokenBytes = kHeadDim * 2;
constexpr int kChunks = kDsMlaTokenBytes / 16;  // 36 sixteen-byte pieces per key: 28 e4m3, 8 bf16
constexpr int kNopeChunks = kNopeDim / 16;
constexpr int kRawScales = kKeys * kDsMlaTokenBytes;              // scale bytes in a raw stage
constexpr int kRawStage = kRawScales + kKeys * kDsMlaScaleBytes;  // 18688 bytes
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared memory, in bytes from a 1024-aligned base.
constexpr int kQBytes = kGroupHeads * kHeadDim * 2;  // [64, 512] bf16, swizzled
constexpr int kKBytes = kKeys * kHeadDim * 2;        // [32, 512] bf16, swizzled
// P of a tile: [64 heads, 64] bf16, columns 0-31 the bf16 hi parts of the 32 keys' weights and
// 32-63 the lo parts, swizzled like a K block (one 128-byte row per head).
constexpr int kPBytes = kGroupHeads * 128;
constexpr int kQOff = 0;
constexpr int kKOff = kQOff + kQBytes;

// The pipeline of one cache kind. fp8_ds_mla: kRawStages gathered tiles in flight (kRawStages - 1
// ahead), decoded into kKStages bf16 K stages. bf16: rows are copied straight into the K stages
// (no decode), so the raw stages' room holds two more K stages. kPBufs P tiles between QK and PV.
template <bool kBf16Cache>
struct Layout {
  static constexpr bool kBf16 = kBf16Cache;
  static constexpr int kKStages = kBf16 ? 4 : kStageConfig[0];
  static constexpr int kRawStages = kBf16 ? 0 : kStageConfig[1];
  static constexpr int kPBufs = kStageConfig[2];
  static constexpr int kPOff = kKOff + kKStages * kKBytes;
  static constexpr int kRawOff = kPOff + kPBufs * kPBytes;
  static constexpr int kCorrOff = kRawOff + kRawStages * kRawStage;   // [kPBufs][64] fp32
  static constexpr int kMlOff = kCorrOff + kPBufs * kGroupHeads * 4;  // [64] (max, sum)
  static constexpr int kValidKOff = kMlOff + kGroupHeads * 8;         // [kKStages] uint32 masks
  static constexpr int kValidRawOff = kValidKOff + kKStages * 4;      // [kRawStages][32] bytes
  static constexpr int kBarOff = (kValidRawOff + kRawStages * kKeys + 7) / 8 * 8;  // mbarriers
  static constexpr int kNumBars = 2 * kKStages + 2 * kPBufs;
  static constexpr size_t kSmem = kBarOff + kNumBars * 8 + 1024;  // + alignment slack
  static_assert(kSmem <= 227 * 1024, "more shared memory than an sm_90 CTA can have");
  static_assert(kKOff % 1024 == 0 && kKBytes % 1024 == 0 && kPOff % 1024 == 0,
                "swizzled tiles need 1024-byte bases");
};

// Byte offset of bf16 element (row, col) in a swizzled [rows, 512] tile: 8 column blocks of
// [rows, 64 values = 128 bytes]; the 16-byte chunk index is XOR-ed with row % 8.
__device__ __forceinline__ uint32_t sw128(int row, int col, int rows) {
  return static_cast<uint32_t>((col >> 6) * rows * 128 + row * 128 +
                               ((((col & 63) >> 3) ^ (row & 7)) << 4) + ((col & 7) << 1));
}

struct Segment {
  const int32_t* indices;  // [T, row_stride] slot ids
  const int32_t* lens;     // [T]
  int64_t row_stride;
  int32_t width;
  uint32_t num_slots;  // clamped to 2^31: an int32 slot id >= it is out of range either way
  uint32_t block_size;
  // idx / block_size for idx < 2^31 as (idx * block_magic) >> block_shift (block_divider()).
  uint64_t block_magic;
  uint32_t block_shift;
  const uint8_t* cache;  // [num_blocks, page_stride] bytes
  int64_t page_stride;
};

struct Args {
  const uint16_t* q;   // [T, H, 512] bf16
  uint16_t* out;       // [T, H, 512] bf16
  float* lse;          // [T, H] natural log
  const float* sinks;  // [H] or nullptr
  int32_t* bad_count;  // [1] or nullptr
  float* partial_o;    // [splits, T, H, 512] fp32, unnormalised; only when splits > 1
  float2* partial_ml;  // [splits, T, H] (running max in log2 units, sum of exp2)
  float scale_log2;    // softmax_scale * log2(e)
  int64_t num_tokens;
  int32_t num_heads;
  int32_t groups;
  int32_t splits;
  int32_t num_segments;
  int32_t ablate;  // development only (SPARSE_SWA_ATTENTION_ABLATE): parts left out, wrong results
  unsigned long long* timeline;  // development only: [1 + kMaxProfiledCtas * 3 * 8] or nullptr
  Segment seg0, seg1;
};
// Ablation bits: the producer gathers only the first two tiles; PV skips its MMAs; QK skips its
// MMAs; the producer skips decoding.
// 16: per-role cycle accounts (RoleClock, profile builds only), printed after an eager call.
constexpr int kMaxProfiledCtas = 1024;
// 32: PV uses P's bf16 hi part only (measures what the lo part costs in time and accuracy).
// 64 / 128: the decode keeps its conversions but skips its shared-memory stores / reads (codes
// made up from the thread and tile instead), to tell the three costs apart; profile builds only.
[[maybe_unused]] constexpr int kAblateGather = 1, kAblatePv = 2, kAblateQk = 4, kAblateDecode = 8,
                               kTimeline = 16, kAblatePLo = 32, kAblateDecodeStores = 64,
                               kAblateDecodeReads = 128;
#if defined(SPARSE_SWA_ATTENTION_PROFILE)
constexpr bool kDecodeAblations = true;
#else
constexpr bool kDecodeAblations = false;  // bits 64 and 128 cost nothing outside profile builds
#endif

// Per-role cycle accounts (development: built with -DSPARSE_SWA_ATTENTION_PROFILE, switched on
// by ablation bit 16): one thread of each role adds the cycles between laps into slots and stores
// them once, per CTA, into timeline[1 + (cta * 3 + role) * 8 + slot]; the launcher prints the
// averages. Without the macro every member is empty and costs nothing.
struct RoleClock {
  unsigned long long* out = nullptr;  // this role's 8 slots, or nullptr
#if defined(SPARSE_SWA_ATTENTION_PROFILE)
  long long t = 0;
  long long acc[8] = {};
#endif
  __device__ RoleClock(const Args& a, int role) {
#if defined(SPARSE_SWA_ATTENTION_PROFILE)
    if (a.timeline != nullptr && (threadIdx.x & 127) == 0) {
      out = a.timeline + 1 + (static_cast<int64_t>(blockIdx.x) * 3 + role) * 8;
      t = clock64();
    }
#else
    (void)a;
    (void)role;
#endif
  }
  __device__ __forceinline__ void lap(int slot) {
#if defined(SPARSE_SWA_ATTENTION_PROFILE)
    if (out != nullptr) {
      const long long now = clock64();
      acc[slot] += now - t;
      t = now;
    }
#else
    (void)slot;
#endif
  }
  __device__ __forceinline__ void store(int tiles) {
#if defined(SPARSE_SWA_ATTENTION_PROFILE)
    if (out != nullptr) {
      acc[7] = tiles;
#pragma unroll
      for (int k = 0; k < 8; ++k) out[k] = static_cast<unsigned long long>(acc[k]);
    }
#else
    (void)tiles;
#endif
  }
};

template <class L>
struct Cta {
  int64_t t;  // query token
  int h0;     // first head of the group
  int heads;  // heads of the group, 1..64
  int split;
  int32_t len0;    // valid SWA entries (clamped)
  int64_t total;   // valid entries of both segments
  int32_t tile0;   // first tile of this split
  int32_t n;       // tiles of this split
  uint8_t* base;   // 1024-aligned shared memory
  uint32_t sbase;  // its shared-window address
  __device__ uint32_t bar(int i) const { return sbase + L::kBarOff + 8 * i; }
  __device__ uint32_t k_full(int s) const { return bar(s); }
  __device__ uint32_t k_empty(int s) const { return bar(L::kKStages + s); }
  __device__ uint32_t p_full(int b) const { return bar(2 * L::kKStages + b); }
  __device__ uint32_t p_empty(int b) const { return bar(2 * L::kKStages + L::kPBufs + b); }
};

// ---- producer: gather and decode ----

// The index entry of key `key` (= tid / 4) of tile i, or -1 past the tile list or the token's
// total (masked). Loaded one tile before resolve_key needs it, so that its latency hides behind a
// decode instead of stalling the producer.
template <class L>
__device__ __forceinline__ int32_t load_index(const Args& a, const Cta<L>& c, int i, int tid) {
  const int64_t j = int64_t{c.tile0 + i} * kKeys + (tid >> 2);
  if (i >= c.n || j >= c.total) return -1;
  const bool swa = j < c.len0;
  const Segment& s = swa ? a.seg0 : a.seg1;
  return s.indices[c.t * s.row_stride + (swa ? j : j - c.len0)];
}

// Where the key with index entry idx of tile i lives: its data (and fp8_ds_mla scale) bytes, or
// nothing (masked). Entries < -1 or >= num_slots are counted (once: head group 0, the thread of
// part 0). 128 threads, 4 per key.
struct KeySource {
  const uint8_t* data = nullptr;
  const uint8_t* scales = nullptr;
};
template <class L>
__device__ __forceinline__ KeySource resolve_key(const Args& a, const Cta<L>& c, int i, int tid,
                                                 int32_t idx) {
  KeySource k;
  if (idx == -1) return k;
  const int64_t j = int64_t{c.tile0 + i} * kKeys + (tid >> 2);
  const Segment& s = j < c.len0 ? a.seg0 : a.seg1;
  if (idx >= 0 && static_cast<uint32_t>(idx) < s.num_slots) {
    const uint32_t block =
        static_cast<uint32_t>((static_cast<uint64_t>(idx) * s.block_magic) >> s.block_shift);
    const uint32_t offset = static_cast<uint32_t>(idx) - block * s.block_size;
    const uint8_t* page = s.cache + static_cast<int64_t>(block) * s.page_stride;
    if constexpr (L::kBf16) {
      k.data = page + static_cast<int64_t>(offset) * kBf16TokenBytes;
    } else {
      k.data = page + static_cast<int64_t>(offset) * kDsMlaTokenBytes;
      k.scales = page + static_cast<int64_t>(s.block_size) * kDsMlaTokenBytes +
                 static_cast<int64_t>(offset) * kDsMlaScaleBytes;
    }
  } else if ((tid & 3) == 0 && c.h0 == 0 && a.bad_count != nullptr) {
    atomicAdd(a.bad_count, 1);
  }
  return k;
}

// Starts the copies of tile i's keys into raw stage i % L::kRawStages and records which keys are
// valid.
template <class L>
__device__ __forceinline__ void gather_tile(const Cta<L>& c, int i, int tid, const KeySource& k) {
  const int key = tid >> 2;
  const int part = tid & 3;
  uint8_t* raw = c.base + L::kRawOff + (i % L::kRawStages) * kRawStage;
  if (k.data != nullptr) {
    const uint32_t dst = ptx::smem_addr(raw + key * kDsMlaTokenBytes);
#pragma unroll
    for (int ch = part; ch < kChunks; ch += 4) ptx::cp_async_16(dst + ch * 16, k.data + ch * 16);
    if (part == 0) {
      ptx::cp_async_8(ptx::smem_addr(raw + kRawScales + key * kDsMlaScaleBytes), k.scales);
    }
  }
  if (part == 0) c.base[L::kValidRawOff + (i % L::kRawStages) * kKeys + key] = k.data != nullptr;
}

// Two e4m3 codes (low byte first) times scale = 2^(s - 127) as a bf16 pair; exact (NaN stays
// NaN). 2^128 (s = 255) is not a float: kHuge keys multiply by scale, then by `twice` (2 for such
// a chunk, else 1), as the CPU does.
template <bool kHuge>
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t two, float scale, float twice) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  float2 f = __half22float2(__half2(h));
  f.x *= scale;
  f.y *= scale;
  if constexpr (kHuge) {
    f.x *= twice;
    f.y *= twice;
  }
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<const uint32_t*>(&b);
}
// 16 e4m3 codes -> 16 bf16 (lo: the first 8).
template <bool kHuge>
__device__ __forceinline__ void decode_chunk(const uint4& v, float scale, float twice, uint4& lo,
                                             uint4& hi) {
  lo.x = e4m3x2_to_bf16x2<kHuge>(v.x, scale, twice);
  lo.y = e4m3x2_to_bf16x2<kHuge>(v.x >> 16, scale, twice);
  lo.z = e4m3x2_to_bf16x2<kHuge>(v.y, scale, twice);
  lo.w = e4m3x2_to_bf16x2<kHuge>(v.y >> 16, scale, twice);
  hi.x = e4m3x2_to_bf16x2<kHuge>(v.z, scale, twice);
  hi.y = e4m3x2_to_bf16x2<kHuge>(v.z >> 16, scale, twice);
  hi.z = e4m3x2_to_bf16x2<kHuge>(v.w, scale, twice);
  hi.w = e4m3x2_to_bf16x2<kHuge>(v.w >> 16, scale, twice);
}

// One thread's seven NoPE chunks of a key (part p: chunks p, p + 4, ..., scale byte r for its
// r-th chunk), with no branch between chunks so that their loads and conversions interleave.
// kHuge: some scale byte of the key is 255.
template <bool kHuge>
__device__ __forceinline__ void decode_nope(const uint8_t* src, uint2 sc, uint8_t* k, int key,
                                            int part, int i, int tid, int ablate) {
  uint32_t sink = 0;
#pragma unroll
  for (int r = 0; r < kNopeChunks / 4; ++r) {
    const int ch = part + 4 * r;
    uint4 v;
    if (kDecodeAblations && (ablate & kAblateDecodeReads)) {
      const uint32_t x = (static_cast<uint32_t>(tid) * 0x9e3779b9u) ^ (i * 0x01010101u) ^ r;
      v = make_uint4(x & 0x3f3f3f3fu, (x >> 1) & 0x3f3f3f3fu, (x >> 2) & 0x3f3f3f3fu,
                     (x >> 3) & 0x3f3f3f3fu);
    } else {
      v = *reinterpret_cast<const uint4*>(src + ch * 16);
    }
    const uint32_t sb = ((r < 4 ? sc.x : sc.y) >> (8 * (r & 3))) & 0xffu;
    // 2^(s - 127) from the exponent bits (s = 0: the subnormal 2^-127; s = 255: 2^127 * 2).
    const uint32_t bits = sb == 0 ? 0x00400000u : (kHuge && sb == 255 ? 254u << 23 : sb << 23);
    const float twice = kHuge && sb == 255 ? 2.0f : 1.0f;
    uint4 lo, hi;
    decode_chunk<kHuge>(v, __uint_as_float(bits), twice, lo, hi);
    if (kDecodeAblations && (ablate & kAblateDecodeStores)) {
      sink ^= lo.x ^ lo.y ^ lo.z ^ lo.w ^ hi.x ^ hi.y ^ hi.z ^ hi.w;
    } else {
      *reinterpret_cast<uint4*>(k + sw128(key, ch * 16, kKeys)) = lo;
      *reinterpret_cast<uint4*>(k + sw128(key, ch * 16 + 8, kKeys)) = hi;
    }
  }
  // Keeps the conversions of a store-less ablation alive (never true for real codes).
  if (kDecodeAblations && sink == 0x7fc17fc1u) *reinterpret_cast<uint32_t*>(k) = sink;
}

// True when one of the key's seven scale bytes is 255 (byte 7 is padding): a 255 byte is a zero
// byte of the complement.
__device__ __forceinline__ bool has_huge_scale(uint2 sc) {
  const uint32_t x = ~sc.x, y = ~(sc.y & 0x00ffffffu);
  return ((((x - 0x01010101u) & ~x) | ((y - 0x01010101u) & ~y)) & 0x80808080u) != 0;
}

// Raw stage i % L::kRawStages -> K stage, swizzled bf16; invalid keys become zero rows. 128
// threads, 4 per key: part p decodes NoPE chunks p, p + 4, ... (scale byte r for its r-th chunk)
// and RoPE chunks 28 + p, 32 + p. No divergence inside a warp but masked keys, every loop unrolled.
template <class L>
__device__ __forceinline__ void decode_tile(const Cta<L>& c, int i, int stage, int tid,
                                            int ablate) {
  const int key = tid >> 2;
  const int part = tid & 3;
  const uint8_t* raw = c.base + L::kRawOff + (i % L::kRawStages) * kRawStage;
  const uint8_t* src = raw + key * kDsMlaTokenBytes;
  uint8_t* k = c.base + kKOff + stage * kKBytes;
  const bool ok = c.base[L::kValidRawOff + (i % L::kRawStages) * kKeys + key] != 0;
  if (ok) {
    const uint2 sc = *reinterpret_cast<const uint2*>(raw + kRawScales + key * kDsMlaScaleBytes);
    if (!has_huge_scale(sc)) {
      decode_nope<false>(src, sc, k, key, part, i, tid, ablate);
    } else {
      decode_nope<true>(src, sc, k, key, part, i, tid, ablate);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int ch = kNopeChunks + part + 4 * r;
      *reinterpret_cast<uint4*>(k + sw128(key, kNopeDim + (ch - kNopeChunks) * 8, kKeys)) =
          *reinterpret_cast<const uint4*>(src + ch * 16);
    }
  } else {
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int r = 0; r < kNopeChunks / 4; ++r) {
      const int ch = part + 4 * r;
      *reinterpret_cast<uint4*>(k + sw128(key, ch * 16, kKeys)) = zero;
      *reinterpret_cast<uint4*>(k + sw128(key, ch * 16 + 8, kKeys)) = zero;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      *reinterpret_cast<uint4*>(k + sw128(key, kNopeDim + (part + 4 * r) * 8, kKeys)) = zero;
    }
  }
  if (tid < 32) {  // warp 0: the stage's valid-key mask, bit k for key k
    const uint32_t mask = __ballot_sync(
        0xffffffffu, c.base[L::kValidRawOff + (i % L::kRawStages) * kKeys + tid] != 0);
    if (tid == 0) *reinterpret_cast<uint32_t*>(c.base + L::kValidKOff + stage * 4) = mask;
  }
}

template <class L>
__device__ void decode_producer(const Args& a, const Cta<L>& c, int tid) {
  RoleClock clk(a, 0);  // slots: landed wait, stage wait, decode, gather
  int32_t idx[L::kRawStages];
#pragma unroll
  for (int i = 0; i < L::kRawStages; ++i) idx[i] = load_index(a, c, i, tid);  // all loads in flight
#pragma unroll
  for (int i = 0; i + 1 < L::kRawStages; ++i) {
    gather_tile(c, i, tid, resolve_key(a, c, i, tid, idx[i]));
    ptx::cp_async_commit();
  }
  int32_t next = idx[L::kRawStages - 1];  // the index entry of tile i + L::kRawStages - 1
  for (int i = 0; i < c.n; ++i) {
    const int stage = i % L::kKStages;
    const int ahead = i + L::kRawStages - 1;
    // The next iteration's entry is in flight while tile i is decoded.
    const int32_t after = (a.ablate & kAblateGather) ? -1 : load_index(a, c, ahead + 1, tid);
    ptx::cp_async_wait<L::kRawStages - 2>();
    ptx::named_barrier(1, 128);  // every producer thread's copies of tile i have landed
    clk.lap(0);
    if (i >= L::kKStages) ptx::mbar_wait(c.k_empty(stage), ((i / L::kKStages) - 1) & 1);
    clk.lap(1);
    if (!(a.ablate & kAblateDecode)) decode_tile(c, i, stage, tid, a.ablate);
    ptx::fence_proxy_async();  // wgmma reads these rows through the async proxy
    ptx::mbar_arrive(c.k_full(stage));
    clk.lap(2);
    ptx::named_barrier(1, 128);  // raw stage i % L::kRawStages is free again
    if (ahead < c.n && !(a.ablate & kAblateGather)) {
      gather_tile(c, ahead, tid, resolve_key(a, c, ahead, tid, next));
    }
    ptx::cp_async_commit();
    next = after;
    clk.lap(3);
  }
  ptx::cp_async_wait<0>();
  clk.store(c.n);
}

// bf16 caches: tile i's rows go straight into K stage i % kKStages by cp.async (the 1024 bytes of
// a key as 64 chunks, 16 per thread), masked keys as zero rows; each warp records the valid bits
// of its 8 keys in the stage's mask. Tiles are published in order; a stage is refilled with the
// tile kKStages - 1 ahead once the tile before the published one has left it.
template <class L>
__device__ __forceinline__ void copy_tile(const Cta<L>& c, int i, int tid, const KeySource& k) {
  const int key = tid >> 2;
  const int part = tid & 3;
  const int stage = i % L::kKStages;
  uint8_t* dst = c.base + kKOff + stage * kKBytes;
  if (k.data != nullptr) {
#pragma unroll
    for (int ch = part; ch < kHeadDim / 8; ch += 4) {
      ptx::cp_async_16(ptx::smem_addr(dst + sw128(key, ch * 8, kKeys)), k.data + ch * 16);
    }
  } else {
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int ch = part; ch < kHeadDim / 8; ch += 4) {
      *reinterpret_cast<uint4*>(dst + sw128(key, ch * 8, kKeys)) = zero;
    }
  }
  // Lanes 4j of warp w hold keys 8w + j: their ballot bits, packed, are the mask's byte w.
  const uint32_t lanes = __ballot_sync(0xffffffffu, part == 0 && k.data != nullptr);
  if ((tid & 31) == 0) {
    uint32_t bits = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) bits |= ((lanes >> (4 * j)) & 1u) << j;
    c.base[L::kValidKOff + stage * 4 + (tid >> 5)] = static_cast<uint8_t>(bits);
  }
}

template <class L>
__device__ void copy_producer(const Args& a, const Cta<L>& c, int tid) {
  RoleClock clk(a, 0);  // slots: landed wait, stage wait, -, copy
  constexpr int kAhead = L::kKStages - 1;
  int32_t idx[kAhead];
#pragma unroll
  for (int i = 0; i < kAhead; ++i) idx[i] = load_index(a, c, i, tid);  // all loads in flight
#pragma unroll
  for (int i = 0; i < kAhead; ++i) {
    if (i < c.n) copy_tile(c, i, tid, resolve_key(a, c, i, tid, idx[i]));
    ptx::cp_async_commit();
  }
  int32_t next = load_index(a, c, kAhead, tid);  // the entry of tile i + kAhead
  for (int i = 0; i < c.n; ++i) {
    const int ahead = i + kAhead;
    const int32_t after = load_index(a, c, ahead + 1, tid);
    ptx::cp_async_wait<kAhead - 1>();  // this thread's copies of tile i have landed
    clk.lap(0);
    ptx::fence_proxy_async();  // wgmma reads these rows through the async proxy
    ptx::mbar_arrive(c.k_full(i % L::kKStages));
    if (ahead < c.n) {
      // Stage ahead % kKStages last held tile i - 1.
      if (i >= 1) ptx::mbar_wait(c.k_empty((i - 1) % L::kKStages), ((i - 1) / L::kKStages) & 1);
      clk.lap(1);
      copy_tile(c, ahead, tid, resolve_key(a, c, ahead, tid, next));
    }
    ptx::cp_async_commit();
    next = after;
    clk.lap(3);
  }
  ptx::cp_async_wait<0>();
  clk.store(c.n);
}

__device__ __forceinline__ uint32_t pack_bf16(float x, float y) {
  const __nv_bfloat162 b = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&b);
}
__device__ __forceinline__ float2 unpack_bf16(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

// ---- QK + softmax: warp q of warpgroup 1 owns head rows 16q..16q+15 ----

__device__ __forceinline__ float fast_exp2(float x) {  // 2^x, -inf -> 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Starts S = Q K^T of K stage `stage` for all 64 rows (wgmma, asynchronous: one commit group);
// d gets the m16n8 accumulator layout (n-tile j in d[4j..4j+3]) of warp q's 16 rows.
template <class L>
__device__ __forceinline__ void qk_issue_wgmma(const Cta<L>& c, int stage, float (&d)[16]) {
  const uint32_t q_base = c.sbase + kQOff;
  const uint32_t k_base = c.sbase + kKOff + stage * kKBytes;
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    const uint32_t step = (kk & 3) * 32;  // 16 bf16 along K inside a 128-byte row
    const uint64_t da = ptx::sw128_desc(q_base + (kk >> 2) * (kGroupHeads * 128) + step);
    const uint64_t db = ptx::sw128_desc(k_base + (kk >> 2) * (kKeys * 128) + step);
    if (kk == 0) {
      ptx::wgmma_m64n32k16_first(d, da, db);
    } else {
      ptx::wgmma_m64n32k16(d, da, db, true);
    }
  }
  ptx::wgmma_commit();
}

// S [16 heads, 32 keys] of warp q with m16n8k16 MMAs, synchronously.
template <class L>
__device__ __forceinline__ void qk_mma(const Cta<L>& c, int stage, int q, int lane,
                                       float (&d)[16]) {
  const uint32_t q_base = c.sbase + kQOff;
  const uint32_t k_base = c.sbase + kKOff + stage * kKBytes;
#pragma unroll
  for (int k = 0; k < 16; ++k) d[k] = 0.0f;
#pragma unroll 4
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    uint32_t qa[4], kb[2][4];
    ptx::ldmatrix_x4(qa,
                     q_base + sw128(16 * q + (lane & 15), kk * 16 + (lane >> 4) * 8, kGroupHeads));
#pragma unroll
    for (int np = 0; np < 2; ++np) {
      ptx::ldmatrix_x4(kb[np], k_base + sw128(np * 16 + (lane & 7) + (lane >> 4) * 8,
                                              kk * 16 + ((lane >> 3) & 1) * 8, kKeys));
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float(&dj)[4] = *reinterpret_cast<float(*)[4]>(d + 4 * j);
      ptx::mma_bf16_16816(dj, qa, kb[j >> 1][(j & 1) * 2], kb[j >> 1][(j & 1) * 2 + 1]);
    }
  }
}

// The online softmax of tile i from warp q's S (rows 16q + lane / 4 and + 8): P's hi and lo
// parts and the rows' rescale factors into P buffer i % 2, then p_full. Releases K stage i.
struct SoftmaxState {
  float m[2] = {-INFINITY, -INFINITY};  // running max, log2 units
  float l[2] = {0.0f, 0.0f};            // this thread's part of the running sum
};
template <class L>
__device__ __forceinline__ void softmax_tile(const Args& a, const Cta<L>& c, int i, bool active,
                                             int q, int lane, const float (&d)[16],
                                             SoftmaxState& st, RoleClock& clk) {
  const int stage = i % L::kKStages;
  const int b = i % L::kPBufs;
  const int row = 16 * q + (lane >> 2);
  const uint32_t mask = *reinterpret_cast<const uint32_t*>(c.base + L::kValidKOff + stage * 4);
  ptx::mbar_arrive(c.k_empty(stage));
  clk.lap(2);
  if (i >= L::kPBufs) ptx::mbar_wait(c.p_empty(b), ((i / L::kPBufs) - 1) & 1);
  clk.lap(3);
  uint8_t* pt = c.base + L::kPOff + b * kPBytes;
  float* corr_s = reinterpret_cast<float*>(c.base + L::kCorrOff) + b * kGroupHeads;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row + 8 * half;
    uint8_t* prow = pt + r * 128 + 4 * (lane & 3);
    if (!active) {  // rows past the group's heads: P = 0 (wgmma PV reads every row)
#pragma unroll
      for (int j = 0; j < 8; ++j) *reinterpret_cast<uint32_t*>(prow + ((j ^ (r & 7)) << 4)) = 0;
      if ((lane & 3) == 0) corr_s[r] = 1.0f;
      continue;
    }
    float x[4][2];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool valid = (mask >> (j * 8 + 2 * (lane & 3) + e)) & 1u;
        x[j][e] = valid ? d[4 * j + 2 * half + e] * a.scale_log2 : -INFINITY;
        mx = fmaxf(mx, x[j][e]);
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(st.m[half], mx);
    const bool none = m_new == -INFINITY;
    const float corr = none ? 1.0f : fast_exp2(st.m[half] - m_new);
    st.m[half] = m_new;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float p0 = none ? 0.0f : fast_exp2(x[j][0] - m_new);
      const float p1 = none ? 0.0f : fast_exp2(x[j][1] - m_new);
      sum += p0 + p1;
      const uint32_t h = pack_bf16(p0, p1);
      const float2 hf = unpack_bf16(h);
      // Column j * 8 + 2 (lane % 4) of the hi half (chunk j) and of the lo half (chunk 4 + j).
      *reinterpret_cast<uint32_t*>(prow + ((j ^ (r & 7)) << 4)) = h;
      *reinterpret_cast<uint32_t*>(prow + (((4 + j) ^ (r & 7)) << 4)) =
          pack_bf16(p0 - hf.x, p1 - hf.y);
    }
    st.l[half] = st.l[half] * corr + sum;
    if ((lane & 3) == 0) corr_s[r] = corr;
  }
  ptx::fence_proxy_async();  // wgmma reads P through the async proxy
  ptx::mbar_arrive(c.p_full(b));
  clk.lap(4);
}

// ---- QK + softmax: warp q of warpgroup 1 owns head rows 16q..16q+15 ----

template <bool kWgmma, class L>
__device__ void qk_softmax(const Args& a, const Cta<L>& c, int q, int lane) {
  // With m16n8k16 MMAs, 16-head tiles past the group's heads are skipped (their P rows are
  // written as zeros); wgmma always computes all 64 rows.
  const bool active = kWgmma || 16 * q < c.heads;
  const bool skip = (a.ablate & kAblateQk) != 0;
  SoftmaxState st;
  RoleClock clk(a, 1);  // slots: K wait, QK MMAs, softmax, P-buffer wait, P stores
  for (int i = 0; i < c.n; ++i) {
    ptx::mbar_wait(c.k_full(i % L::kKStages), (i / L::kKStages) & 1);
    clk.lap(0);
    float d[16];
    if constexpr (kWgmma) {
      // (Tile i + 1's wgmma in flight during tile i's softmax measured 50-70 % slower:
      // bench/README.md#variant-log, runs 10 and 25.)
      qk_issue_wgmma(c, i % L::kKStages, d);
      ptx::wgmma_wait<0>();
    } else if (active && !skip) {
      qk_mma(c, i % L::kKStages, q, lane, d);
    } else {
#pragma unroll
      for (int k = 0; k < 16; ++k) d[k] = 0.0f;
    }
    clk.lap(1);
    softmax_tile(a, c, i, active, q, lane, d, st, clk);
  }
  clk.store(c.n);
  float2* ml = reinterpret_cast<float2*>(c.base + L::kMlOff);
  const int row = 16 * q + (lane >> 2);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float l = st.l[half];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if ((lane & 3) == 0) ml[row + 8 * half] = make_float2(st.m[half], l);
  }
  ptx::named_barrier(2, 384);  // the PV warps read (max, sum) next
}

// ---- PV and the stores ----

// Where one output row goes: finished (bf16 out, lse) or, when split, this slice's partial.
struct RowOut {
  uint16_t* y = nullptr;  // [512] bf16, or nullptr when partial
  float* py = nullptr;    // [512] fp32 partial
  float factor = 0.0f;
};
// Row r of the group; `writer` also stores its lse / (max, sum).
template <class L>
__device__ __forceinline__ RowOut row_out(const Args& a, const Cta<L>& c, int r, bool writer) {
  const float2 st = reinterpret_cast<const float2*>(c.base + L::kMlOff)[r];
  const float m = st.x, l = st.y;
  const int head = c.h0 + r;
  const int64_t row = c.t * a.num_heads + head;
  RowOut o;
  if (a.splits == 1) {
    float lse = INFINITY;  // no valid key: out 0, lse +inf
    if (m != -INFINITY) {
      lse = (m + log2f(l)) * kLn2;
      o.factor = 1.0f / l;
      if (a.sinks != nullptr) o.factor /= 1.0f + expf(a.sinks[head] - lse);
    }
    o.y = a.out + row * kHeadDim;
    if (writer) a.lse[row] = lse;
  } else {
    const int64_t prow = c.split * a.num_tokens * a.num_heads + row;
    o.py = a.partial_o + prow * kHeadDim;
    o.factor = 1.0f;
    if (writer) a.partial_ml[prow] = make_float2(m, l);
  }
  return o;
}
__device__ __forceinline__ void put2(const RowOut& o, int d, float x, float y) {
  if (o.y != nullptr) {
    *reinterpret_cast<uint32_t*>(o.y + d) = pack_bf16(x * o.factor, y * o.factor);
  } else {
    *reinterpret_cast<float2*>(o.py + d) = make_float2(x, y);
  }
}

// m16n8k16 variant: warp v of warpgroups 2-3 owns heads 32 * (v % 2) + [0, 32) and dims
// 128 * (v / 2) + [0, 128); P and V through ldmatrix.
template <class L>
__device__ void pv_mma(const Args& a, const Cta<L>& c, int v, int lane) {
  const int row0 = 32 * (v & 1);
  const int d0 = 128 * (v >> 1);
  // m-tiles past the group's heads: skipped (warp-uniform).
  const bool skip = (a.ablate & kAblatePv) != 0;
  const bool act0 = row0 < c.heads && !skip, act1 = row0 + 16 < c.heads && !skip;
  float o[2][16][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mi][nt][e] = 0.0f;
    }
  }
  for (int i = 0; i < c.n; ++i) {
    const int stage = i % L::kKStages;
    const int b = i % L::kPBufs;
    ptx::mbar_wait(c.p_full(b), (i / L::kPBufs) & 1);
    ptx::mbar_wait(c.k_full(stage), (i / L::kKStages) & 1);
    const float* corr_s = reinterpret_cast<const float*>(c.base + L::kCorrOff) + b * kGroupHeads;
    const uint32_t pt = c.sbase + L::kPOff + b * kPBytes;
    const uint32_t k_base = c.sbase + kKOff + stage * kKBytes;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
      if (!(mi == 0 ? act0 : act1)) continue;
      const int r = row0 + 16 * mi + (lane >> 2);
      const float c0 = corr_s[r], c1 = corr_s[r + 8];
      if (__any_sync(0xffffffffu, c0 != 1.0f || c1 != 1.0f)) {
#pragma unroll
        for (int nt = 0; nt < 16; ++nt) {
          o[mi][nt][0] *= c0;
          o[mi][nt][1] *= c0;
          o[mi][nt][2] *= c1;
          o[mi][nt][3] *= c1;
        }
      }
    }
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      uint32_t ph[2][4], pl[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        if (!(mi == 0 ? act0 : act1)) continue;
        const int r = row0 + 16 * mi + (lane & 15);
        const int col = kk * 16 + (lane >> 4) * 8;
        ptx::ldmatrix_x4(ph[mi], pt + sw128(r, col, kGroupHeads));
        ptx::ldmatrix_x4(pl[mi], pt + sw128(r, kKeys + col, kGroupHeads));
      }
#pragma unroll
      for (int np = 0; np < 8; ++np) {
        uint32_t vb[4];
        ptx::ldmatrix_x4_trans(vb, k_base + sw128(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                  d0 + np * 16 + (lane >> 4) * 8, kKeys));
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          if (!(mi == 0 ? act0 : act1)) continue;
          ptx::mma_bf16_16816(o[mi][2 * np], ph[mi], vb[0], vb[1]);
          ptx::mma_bf16_16816(o[mi][2 * np], pl[mi], vb[0], vb[1]);
          ptx::mma_bf16_16816(o[mi][2 * np + 1], ph[mi], vb[2], vb[3]);
          ptx::mma_bf16_16816(o[mi][2 * np + 1], pl[mi], vb[2], vb[3]);
        }
      }
    }
    ptx::mbar_arrive(c.p_empty(b));
    ptx::mbar_arrive(c.k_empty(stage));
  }
  ptx::named_barrier(2, 384);  // (max, sum) of every row are in shared memory
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = row0 + 16 * mi + (lane >> 2) + 8 * half;
      if (r >= c.heads) continue;
      const RowOut ro = row_out(a, c, r, d0 == 0 && (lane & 3) == 0);
#pragma unroll
      for (int nt = 0; nt < 16; ++nt) {
        put2(ro, d0 + nt * 8 + 2 * (lane & 3), o[mi][nt][2 * half], o[mi][nt][2 * half + 1]);
      }
    }
  }
}

// The wgmma variant's rows of an unsplit group of more than 32 heads, finished (bf16, scaled), by
// way of shared memory: the accumulator fragments go into a [64, 512] bf16 tile over Q's bytes
// (free once barrier 2 has passed: every QK step done), 1024-byte rows with the 16-byte chunks
// XOR-ed with row % 8, then the 256 PV threads store whole rows in coalesced 16-byte pieces (the
// launcher refuses an `out` that is not 16-byte aligned).
template <class L>
__device__ __forceinline__ void store_rows(const Args& a, const Cta<L>& c, const float (&o)[2][64],
                                           int g, int row, int lane) {
  const int d0 = 256 * g;
  uint8_t* tile = c.base + kQOff;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row + 8 * half;
    if (r >= c.heads) continue;
    const RowOut ro = row_out(a, c, r, g == 0 && (lane & 3) == 0);
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const int col = d0 + j * 8 + 2 * (lane & 3);
      *reinterpret_cast<uint32_t*>(tile + r * 1024 + (((col >> 3) ^ (r & 7)) << 4) +
                                   (col & 7) * 2) =
          pack_bf16(o[j >> 4][4 * (j & 15) + 2 * half] * ro.factor,
                    o[j >> 4][4 * (j & 15) + 2 * half + 1] * ro.factor);
    }
  }
  ptx::named_barrier(3, 256);  // the PV warpgroups' tile is complete
  uint16_t* dst = a.out + (c.t * a.num_heads + c.h0) * kHeadDim;
  for (int i = static_cast<int>(threadIdx.x) - 256; i < c.heads * 64; i += 256) {
    const int r = i >> 6, ch = i & 63;
    *reinterpret_cast<uint4*>(dst + r * kHeadDim + ch * 8) =
        *reinterpret_cast<const uint4*>(tile + r * 1024 + ((ch ^ (r & 7)) << 4));
  }
}

// wgmma variant: warpgroup g (0, 1) owns dims 256 g + [0, 256) of all 64 rows, as two halves of
// 128; per tile and half four m64n128k16 steps: P's hi columns against V, then its lo columns
// against V again.
template <class L>
__device__ void pv_wgmma(const Args& a, const Cta<L>& c, int g, int w, int lane) {
  const int d0 = 256 * g;
  const int row = 16 * w + (lane >> 2);  // and row + 8
  const bool skip = (a.ablate & kAblatePv) != 0;
  RoleClock clk(a, g == 0 ? 2 : 3);  // slots: waits, rescale, MMAs, arrives, end wait, stores
  if (g != 0) clk.out = nullptr;     // warpgroup 2 only
  float o[2][64];
#pragma unroll
  for (int k = 0; k < 64; ++k) o[0][k] = o[1][k] = 0.0f;
  for (int i = 0; i < c.n; ++i) {
    const int stage = i % L::kKStages;
    const int b = i % L::kPBufs;
    ptx::mbar_wait(c.p_full(b), (i / L::kPBufs) & 1);
    ptx::mbar_wait(c.k_full(stage), (i / L::kKStages) & 1);
    clk.lap(0);
    const float* corr_s = reinterpret_cast<const float*>(c.base + L::kCorrOff) + b * kGroupHeads;
    const float c0 = corr_s[row], c1 = corr_s[row + 8];
    if (__any_sync(0xffffffffu, c0 != 1.0f || c1 != 1.0f)) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          o[h][4 * j] *= c0;
          o[h][4 * j + 1] *= c0;
          o[h][4 * j + 2] *= c1;
          o[h][4 * j + 3] *= c1;
        }
      }
    }
    clk.lap(1);
    if (!skip) {
      const uint32_t pt = c.sbase + L::kPOff + b * kPBytes;
      const uint32_t vt = c.sbase + kKOff + stage * kKBytes + (d0 / 64) * (kKeys * 128);
      ptx::wgmma_fence();
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (j >= 2 && (a.ablate & kAblatePLo)) break;
          const uint64_t da = ptx::sw128_desc(pt + j * 32);
          const uint64_t db =
              ptx::sw128_desc(vt + h * 2 * (kKeys * 128) + (j & 1) * 2048, kKeys * 128, 1024);
          ptx::wgmma_m64n128k16_bt(o[h], da, db, true);
        }
      }
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();
    }
    clk.lap(2);
    ptx::mbar_arrive(c.p_empty(b));
    ptx::mbar_arrive(c.k_empty(stage));
    clk.lap(3);
  }
  ptx::named_barrier(2, 384);  // (max, sum) of every row are in shared memory
  clk.lap(4);
  if (a.splits == 1 && c.heads > 32) {
    store_rows(a, c, o, g, row, lane);
  } else {
    // Partials and small groups: straight from the fragments (the shared-memory pass measured
    // slower there; bench/README.md#variant-log, run 26).
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = row + 8 * half;
      if (r >= c.heads) continue;
      const RowOut ro = row_out(a, c, r, g == 0 && (lane & 3) == 0);
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        put2(ro, d0 + j * 8 + 2 * (lane & 3), o[j >> 4][4 * (j & 15) + 2 * half],
             o[j >> 4][4 * (j & 15) + 2 * half + 1]);
      }
    }
  }
  clk.lap(5);
  clk.store(c.n);
}

__device__ __forceinline__ int32_t clamp_len(const int32_t* lens, int64_t t, int32_t width) {
  return min(max(lens[t], 0), width);
}

template <bool kWgmma, bool kWgmmaPv, bool kBf16>
__global__ void __launch_bounds__(kThreads, 1)
    ds_mla_attention_kernel(const __grid_constant__ Args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Layout<kBf16>;
  extern __shared__ uint8_t smem_raw[];
  Cta<L> c;
  {
    const uint32_t raw_addr = ptx::smem_addr(smem_raw);
    const uint32_t pad = (1024u - (raw_addr & 1023u)) & 1023u;
    c.base = smem_raw + pad;
    c.sbase = raw_addr + pad;
  }
  const int tid = threadIdx.x;
  c.split = static_cast<int>(blockIdx.x % a.splits);
  const int64_t tg = blockIdx.x / a.splits;
  c.h0 = static_cast<int>(tg % a.groups) * kGroupHeads;
  c.t = tg / a.groups;
  c.heads = min(kGroupHeads, a.num_heads - c.h0);
  // Device lens are data: clamped to the row widths.
  c.len0 = clamp_len(a.seg0.lens, c.t, a.seg0.width);
  const int32_t len1 = a.num_segments > 1 ? clamp_len(a.seg1.lens, c.t, a.seg1.width) : 0;
  c.total = int64_t{c.len0} + len1;
  const int32_t all_tiles = static_cast<int32_t>((c.total + kKeys - 1) / kKeys);
  const int32_t per_split = (all_tiles + a.splits - 1) / a.splits;
  c.tile0 = c.split * per_split;
  c.n = max(0, min(all_tiles, c.tile0 + per_split) - c.tile0);
  // Q rows of the group, swizzled; heads past the group are zero rows. Eight 16-byte loads per
  // thread, all in flight before the first store.
  constexpr int kQLoads = kGroupHeads * (kHeadDim / 8) / kThreads;
  uint4 qv[kQLoads];
#pragma unroll
  for (int r = 0; r < kQLoads; ++r) {
    const int i = tid + r * kThreads;
    const int h = i / (kHeadDim / 8);
    const int col = (i % (kHeadDim / 8)) * 8;
    qv[r] =
        h < c.heads
            ? *reinterpret_cast<const uint4*>(a.q + (c.t * a.num_heads + c.h0 + h) * kHeadDim + col)
            : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int r = 0; r < kQLoads; ++r) {
    const int i = tid + r * kThreads;
    *reinterpret_cast<uint4*>(
        c.base + kQOff + sw128(i / (kHeadDim / 8), (i % (kHeadDim / 8)) * 8, kGroupHeads)) = qv[r];
  }
  ptx::fence_proxy_async();
  if (tid == 0) {
    for (int s = 0; s < L::kKStages; ++s) {
      ptx::mbar_init(c.k_full(s), 128);
      ptx::mbar_init(c.k_empty(s), 384);
    }
    for (int b = 0; b < L::kPBufs; ++b) {
      ptx::mbar_init(c.p_full(b), 128);
      ptx::mbar_init(c.p_empty(b), 256);
    }
  }
  __syncthreads();

  const int wg = tid >> 7;
  if (wg == 0) {
    ptx::setmaxnreg_dec<kProducerRegs>();
    if constexpr (kBf16) {
      copy_producer(a, c, tid);
    } else {
      decode_producer(a, c, tid);
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

// Merges the splits of one (token, head) per warp: weights 2^(m_s - M), then the same finish as
// the unsplit kernel.
constexpr int kMergeWarps = 8;
__global__ void __launch_bounds__(32 * kMergeWarps)
    ds_mla_merge_kernel(const __grid_constant__ Args a) {
  const int64_t rows = a.num_tokens * a.num_heads;
  const int64_t row = int64_t{blockIdx.x} * kMergeWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  float m = -INFINITY;
  for (int s = 0; s < a.splits; ++s) m = fmaxf(m, a.partial_ml[s * rows + row].x);
  float4 acc[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) acc[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float l = 0.0f;
  if (m != -INFINITY) {
    for (int s = 0; s < a.splits; ++s) {
      const float2 ml = a.partial_ml[s * rows + row];
      const float w = exp2f(ml.x - m);  // an empty split has max -inf: weight 0
      if (w == 0.0f) continue;
      l += w * ml.y;
      const float4* po = reinterpret_cast<const float4*>(a.partial_o + (s * rows + row) * kHeadDim);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float4 v = po[lane + 32 * k];
        acc[k].x += w * v.x;
        acc[k].y += w * v.y;
        acc[k].z += w * v.z;
        acc[k].w += w * v.w;
      }
    }
  }
  float lse = INFINITY, factor = 0.0f;
  if (m != -INFINITY) {
    lse = (m + log2f(l)) * kLn2;
    factor = 1.0f / l;
    const int head = static_cast<int>(row % a.num_heads);
    if (a.sinks != nullptr) factor /= 1.0f + expf(a.sinks[head] - lse);
  }
  uint16_t* y = a.out + row * kHeadDim;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint2 v = make_uint2(pack_bf16(acc[k].x * factor, acc[k].y * factor),
                               pack_bf16(acc[k].z * factor, acc[k].w * factor));
    *reinterpret_cast<uint2*>(y + (lane + 32 * k) * 4) = v;
  }
  if (lane == 0) a.lse[row] = lse;
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

// Development: the per-role cycle accounts, averaged over the CTAs, per CTA and per tile.
void print_profile(const unsigned long long* device_profile, int64_t ctas) {
  static const char* const kRoles[] = {"producer", "qk", "pv"};
  static const char* const kSlots[3][7] = {
      {"landed wait", "stage wait", "decode", "gather", "", "", ""},
      {"K wait", "QK MMAs", "softmax", "P-buffer wait", "P stores", "", ""},
      {"P/K wait", "rescale", "PV MMAs", "arrives", "end wait", "stores", ""}};
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

}  // namespace

// The kernel exists as sm_90a machine code only; on other devices the general kernel runs.
static bool kernel_loaded_for_device() {
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

bool ds_mla_attention_applies(const SparseAttentionParams& p) {
  const CacheDtype d = p.swa_cache.dtype;
  if (d != CacheDtype::kFp8DsMla && d != CacheDtype::kBf16) return false;
  if (p.extra_indices.rows != 0 && p.extra_cache.dtype != d) return false;
  return kernel_loaded_for_device();
}

// Split-KV pays a partial (O, max, sum) per slice and a merge: a key list shorter than
// kMinTilesToSplit tiles runs whole, and a slice gets at least kMinSliceTiles tiles
// (bench/README.md#variant-log, run 21).
constexpr int64_t kMinTilesToSplit = 8;
constexpr int64_t kMinSliceTiles = 2;

DsMlaPlan plan_ds_mla_attention(const SparseAttentionParams& p, int num_sms,
                                int64_t workspace_bytes) {
  DsMlaPlan plan;
  plan.group_heads = kGroupHeads;
  plan.groups = (p.num_heads + plan.group_heads - 1) / plan.group_heads;
  const int64_t ctas = p.num_tokens * plan.groups;
  const int64_t max_keys =
      int64_t{p.swa_indices.width} + (p.extra_indices.rows != 0 ? p.extra_indices.width : 0);
  const int64_t max_tiles = (max_keys + kKeys - 1) / kKeys;
  if (ctas == 0 || ctas >= num_sms || max_tiles < kMinTilesToSplit) return plan;
  // Fill the SMs once, each slice with at least kMinSliceTiles tiles.
  int64_t splits = std::min<int64_t>(num_sms / ctas, max_tiles / kMinSliceTiles);
  const int64_t row_bytes = p.num_tokens * p.num_heads * kPartialRowBytes;
  if (workspace_bytes >= 0) splits = std::min(splits, workspace_bytes / row_bytes);
  if (splits <= 1) return plan;
  plan.splits = static_cast<int32_t>(splits);
  plan.workspace_bytes = splits * row_bytes;
  return plan;
}

Status launch_ds_mla_attention(const SparseAttentionParams& p, cudaStream_t stream) {
  int device = 0, num_sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return internal_error("sparse_attention: cannot read the device's SM count: ",
                          cudaGetErrorString(err));
  }
  const DsMlaPlan plan =
      plan_ds_mla_attention(p, num_sms, p.workspace == nullptr ? 0 : p.workspace_bytes);
  Args a{};
  a.q = p.q;
  a.out = p.out;
  a.lse = p.lse;
  a.sinks = p.sinks;
  a.bad_count = p.bad_index_count;
  a.scale_log2 = p.softmax_scale * kLog2e;
  a.num_tokens = p.num_tokens;
  a.num_heads = p.num_heads;
  a.groups = plan.groups;
  a.splits = plan.splits;
  a.num_segments = p.extra_indices.rows != 0 ? 2 : 1;
  static const int ablate = [] {
    const char* v = std::getenv("SPARSE_SWA_ATTENTION_ABLATE");
    return v == nullptr ? 0 : std::atoi(v);
  }();
  a.ablate = ablate;
  a.seg0 = segment(p.swa_indices, p.swa_cache);
  a.seg1 = a.num_segments > 1 ? segment(p.extra_indices, p.extra_cache) : a.seg0;
  if (plan.splits > 1) {
    // [splits, T, H, 512] fp32, then [splits, T, H] (max, sum); both 16-byte aligned.
    a.partial_o = static_cast<float*>(p.workspace);
    a.partial_ml = reinterpret_cast<float2*>(a.partial_o + int64_t{plan.splits} * p.num_tokens *
                                                               p.num_heads * kHeadDim);
  }
  const int64_t blocks = p.num_tokens * plan.groups * plan.splits;
  if (blocks > 0x7fffffff) {
    return invalid_argument("params.num_tokens: expected at most ",
                            0x7fffffff / (int64_t{plan.groups} * plan.splits), " tokens at ",
                            p.num_heads, " heads, got ", p.num_tokens);
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
  const Status launched = p.swa_cache.dtype == CacheDtype::kBf16
                              ? launch_variant<true>(qk, pv, a, stream)
                              : launch_variant<false>(qk, pv, a, stream);
  SPARSE_SWA_RETURN_IF_ERROR(launched);
  if (record) print_profile(timeline, blocks);
  if (plan.splits > 1) {
    const int64_t rows = p.num_tokens * p.num_heads;
    ds_mla_merge_kernel<<<static_cast<unsigned>((rows + kMergeWarps - 1) / kMergeWarps),
                          32 * kMergeWarps, 0, stream>>>(a);
  }
  err = cudaGetLastError();
  if (err != cudaSuccess) {
    return internal_error("sparse_attention: kernel launch failed: ", cudaGetErrorString(err));
  }
  return Status::Ok();
}

}  // namespace sparse_swa::detail
