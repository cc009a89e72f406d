// SPDX-License-Identifier: Apache-2.0
// The tensor-core attention kernel (src/cuda/attention_ds_mla.cu): its tile sizes, shared-memory
// layout per cache kind, kernel arguments and per-CTA state, shared by its roles' headers.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <mutex>

#include "cuda/mma_ptx.cuh"
#include "sparse_swa/attention.h"
#include "sparse_swa/kv_cache.h"

namespace sparse_swa::detail::ds_mla {

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
  static constexpr bool kQueryGroups = false;  // a key list per token (Cta::row)
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
  static constexpr int kNumBars = 2 * kKStages + 2 * kPBufs + 1;                   // + Q's
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

// The page that holds slot idx (idx < s.num_slots) and the slot's place in it.
__device__ __forceinline__ const uint8_t* slot_page(const Segment& s, uint32_t idx,
                                                    uint32_t& offset) {
  const uint32_t block =
      static_cast<uint32_t>((static_cast<uint64_t>(idx) * s.block_magic) >> s.block_shift);
  offset = idx - block * s.block_size;
  return s.cache + static_cast<int64_t>(block) * s.page_stride;
}

// The bf16 row of slot idx (idx < s.num_slots) of a bf16 cache: [kHeadDim] bf16.
__device__ __forceinline__ const uint8_t* bf16_slot_row(const Segment& s, uint32_t idx) {
  uint32_t offset;
  const uint8_t* page = slot_page(s, idx, offset);
  return page + static_cast<int64_t>(offset) * kBf16TokenBytes;
}

// A finished row from its running max m (log2 units) and sum l: its lse (natural log) and the
// factor its unnormalised O takes (1 / l, shared with the sink's weight `sink`, a logit; nullptr:
// none). No valid key (m = -inf): lse +inf and factor 0, so the row is zeros.
struct RowFinish {
  float lse = INFINITY;
  float factor = 0.0f;
};
__device__ __forceinline__ RowFinish finish_row(float m, float l, const float* sink) {
  RowFinish f;
  if (m != -INFINITY) {
    f.lse = (m + log2f(l)) * kLn2;
    f.factor = 1.0f / l;
    if (sink != nullptr) f.factor /= 1.0f + expf(*sink - f.lse);
  }
  return f;
}

// The query groups' key lists (docs/design.md#query-groups): one union per group, its rows of
// `cap` entries (query_group x (SWA width + extra width)); built by query_group_union_kernel.
struct QueryGroupUnions {
  int32_t* slots;    // [groups, cap] slot ids, SWA entries first
  uint32_t* tokens;  // [groups, cap] bit j: the group's token j uses the entry
  int32_t* lens;     // [groups, 2] (SWA entries, all entries)
  int64_t cap;
  __host__ __device__ int32_t* slots_of(int64_t group) const { return slots + group * cap; }
  __host__ __device__ uint32_t* tokens_of(int64_t group) const { return tokens + group * cap; }
};

struct Args {
  const uint16_t* q;   // [T, H, 512] bf16
  uint16_t* out;       // [T, H, 512] bf16
  float* lse;          // [T, H] natural log
  const float* sinks;  // [H] or nullptr
  int32_t* bad_count;  // [1] or nullptr
  // [splits, T - whole_tokens, H, 512] fp32, unnormalised; splits > 1, not cluster-merged
  float* partial_o;
  float2* partial_ml;  // [splits, T - whole_tokens, H] (running max in log2 units, sum of exp2)
  float scale_log2;    // softmax_scale * log2(e)
  int64_t num_tokens;
  int32_t num_heads;
  int32_t groups;
  int32_t splits;
  // Split prefill launches: tokens [0, whole_tokens) take one CTA per (token, head group) with
  // the whole key list and finished rows; the slices cover the later tokens only (the last
  // wave's, spread over every SM: docs/design.md#splits). 0 elsewhere.
  int32_t whole_tokens;
  int32_t num_segments;
  int32_t ablate;  // development only (SPARSE_SWA_ATTENTION_ABLATE): parts left out, wrong results
  unsigned long long* timeline;  // development only: [1 + kMaxProfiledCtas * 3 * 8] or nullptr
  Segment seg0, seg1;
  // Query groups (SparseAttentionParams::query_group_size): a CTA's key list is its group's
  // union; rows r of the CTA are the group's (token r / H, head r % H). query_group = 1: a key
  // list per token, `unions` unused.
  int32_t query_group;
  int64_t key_rows;  // T, or ceil(T / query_group) groups
  QueryGroupUnions unions;
  // 1: a (token, head group)'s slices run as one cluster of `splits` CTAs and merge through
  // distributed shared memory (attention_ds_mla_cluster_merge.cuh); partial_o, partial_ml unused.
  int32_t cluster_merge;
  // The most CTAs of a kernel whose CTAs walk items (blockIdx.x, + gridDim.x, ...: the bf16 and
  // few-heads prefill kernels'): the device's SM count, or 0 for one CTA per item.
  int32_t max_ctas;
  // q and out for the tensor-memory accelerator (encode_head_rows): [T][H][512] bf16 tensors in
  // boxes of one token's 64 heads x 64 dims, laid out as sw128 tiles; heads past H are zeros when
  // loaded and left alone when stored.
  CUtensorMap q_map, out_map;
};

// The items a launch covers: one per whole token and head group, `splits` per split one.
__host__ __device__ inline int64_t launch_items(const Args& a) {
  return (a.key_rows * a.splits - int64_t{a.whole_tokens} * (a.splits - 1)) * a.groups;
}
// Whether token t's rows are finished in the kernel (an unsplit call, or a whole token of a
// last-wave split), not partials for the merge.
__host__ __device__ inline bool finished_token(const Args& a, int64_t t) {
  return a.splits == 1 || t < a.whole_tokens;
}
// The first (token x heads + head) row that takes slices; the rows before it are finished whole.
__host__ __device__ inline int64_t first_split_row(const Args& a) {
  return int64_t{a.whole_tokens} * a.num_heads;
}
// Where slice `split` of split row `row` (token x heads + head, >= first_split_row) goes in
// partial_o (x 512) and partial_ml.
__host__ __device__ inline int64_t partial_row(const Args& a, int split, int64_t row) {
  const int64_t first = first_split_row(a);
  return split * (a.num_tokens * a.num_heads - first) + row - first;
}
// `map` describes rows [T][H][512] bf16 at `base` (q or out) in boxes of 64 dims x 64 heads x one
// token with the 128-byte swizzle (a box is one sw128 column block of a head group). The driver's
// encoder is looked up once.
inline Status encode_head_rows(CUtensorMap& map, const uint16_t* base, int64_t tokens, int heads) {
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
  const cuuint32_t box[3] = {64, kGroupHeads, 1};
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

// The prefill kernels, split or not: on fp8_ds_mla caches (attention_ds_mla_prefill_fp8.cu) and
// on bf16 caches (attention_ds_mla_prefill_bf16.cu).
Status launch_prefill_fp8(Args& a, cudaStream_t stream);
Status launch_prefill_bf16(Args& a, cudaStream_t stream);
// The few-heads kernel on bf16 rows (attention_ds_mla_prefill_few_heads.cu), for the plans with
// DsMlaPlan::few_heads: 1..kFewHeads heads, a key list per token, unsplit or the last wave's
// slices.
constexpr int kFewHeads = 16;
Status launch_prefill_few_heads(Args& a, cudaStream_t stream);
// Query groups: the union of each group's key lists into a.unions (attention_query_groups.cu),
// one CTA per group, before the prefill kernel.
constexpr int kMaxGroupEntries = 4096;  // a group's entries (query_group x both widths), at most
Status launch_query_group_union(const Args& a, cudaStream_t stream);

// Decoded keys (docs/design.md#decoded-keys): the workspace's parts for one call. The two caches'
// slots are one slot space: SWA slot s is k = s, extra slot s is k = first1 + s (first1 = 0 when
// both segments view one cache, else the SWA cache's slots).
struct DecodedKeys {
  uint8_t* rows;  // [slots, 512] bf16: row k = slot k decoded
  int64_t slots;
  int64_t first1;
};
// The pass before the bf16 prefill kernel reads `rows` (attention_decoded_keys.cu).
Status launch_decoded_keys(const Args& a, const DecodedKeys& d, int num_sms, cudaStream_t stream);

// Ablation bits: the producer gathers only the first two tiles; PV skips its MMAs; QK skips its
// MMAs; the producer skips decoding.
// 16: per-role cycle accounts (RoleClock, profile builds only), printed after an eager call.
constexpr int kMaxProfiledCtas = 1024;
// 32: PV uses P's bf16 hi part only (measures what the lo part costs in time and accuracy).
// 64 / 128: the decode keeps its conversions but skips its shared-memory stores / reads (codes
// made up from the thread and tile instead), to tell the three costs apart; profile builds only.
// 256: the fp8_ds_mla prefill kernel's math warpgroups only free each buffer after its ready
// wait (the producer's pace without the math beside it); profile builds only.
// 512: the prefill kernels' producers store no key bytes and load none past the first block
// (fp8_ds_mla: every key valid; bf16: the real masks), so the math runs at its own pace on stale
// rows; profile builds only.
// 1024: the fp8_ds_mla prefill kernel's math warpgroups neither exchange row maxima nor wait for
// each other's P (each rescales by its own max; wrong results), so they need not run in step;
// profile builds only.
[[maybe_unused]] constexpr int kAblateGather = 1, kAblatePv = 2, kAblateQk = 4, kAblateDecode = 8,
                               kTimeline = 16, kAblatePLo = 32, kAblateDecodeStores = 64,
                               kAblateDecodeReads = 128, kAblateMath = 256, kAblateProducer = 512,
                               kAblateExchange = 1024;
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
    if (a.timeline != nullptr && (threadIdx.x & 127) == 0 && blockIdx.x < kMaxProfiledCtas) {
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
  int64_t t;  // key row: the query token, or its query group
  int h0;     // first head of the head group
  int heads;  // rows of the CTA, 1..64: heads of the head group, or the query group's rows
  int split;
  int32_t len0;    // valid SWA entries (clamped)
  int64_t total;   // valid entries of both segments
  int32_t tile0;   // first tile of this split
  int32_t n;       // tiles of this split
  uint8_t* base;   // 1024-aligned shared memory
  uint32_t sbase;  // its shared-window address
  // Row r of the CTA as a row of the [T x H] rows of q, out and lse, and its head: t H + h0 + r,
  // or t g H + r for a query group (kernels whose layout has kQueryGroups take only those).
  // load_q, row_out and store_rows spell the per-token row out beside row(): through row() the
  // bf16 prefill kernel's registers spill 8 bytes instead of 4.
  __device__ __forceinline__ int64_t row(const Args& a, int r) const {
    if constexpr (L::kQueryGroups) return t * a.query_group * a.num_heads + r;
    return t * a.num_heads + h0 + r;
  }
  __device__ __forceinline__ int head(const Args& a, int r) const {
    if constexpr (L::kQueryGroups) return r % a.num_heads;
    return h0 + r;
  }
  __device__ uint32_t bar(int i) const { return sbase + L::kBarOff + 8 * i; }
  __device__ uint32_t k_full(int s) const { return bar(s); }
  __device__ uint32_t k_empty(int s) const { return bar(L::kKStages + s); }
  __device__ uint32_t p_full(int b) const { return bar(2 * L::kKStages + b); }
  __device__ uint32_t p_empty(int b) const { return bar(2 * L::kKStages + L::kPBufs + b); }
  __device__ uint32_t q_full() const { return bar(2 * L::kKStages + 2 * L::kPBufs); }
};

// Points c at the dynamic shared memory `raw`, from its first 1024-byte boundary (the swizzled
// tiles need 1024-byte bases; the layouts' kSmem includes the slack).
template <class L>
__device__ __forceinline__ void place_smem(Cta<L>& c, uint8_t* raw) {
  const uint32_t raw_addr = ptx::smem_addr(raw);
  const uint32_t pad = (1024u - (raw_addr & 1023u)) & 1023u;
  c.base = raw + pad;
  c.sbase = raw_addr + pad;
}

// The CTA's Q rows into shared memory at kQOff, swizzled (rows past c.heads as zero rows),
// by kLoaders threads (t = 0..kLoaders - 1), all loads in flight before the first store. The
// caller fences for the async proxy and synchronises its loaders.
template <int kLoaders, class L>
__device__ __forceinline__ void load_q(const Args& a, const Cta<L>& c, int t) {
  constexpr int kChunks = kGroupHeads * (kHeadDim / 8);  // 16-byte chunks
  constexpr int kLoads = (kChunks + kLoaders - 1) / kLoaders;
  uint4 qv[kLoads];
#pragma unroll
  for (int r = 0; r < kLoads; ++r) {
    const int i = t + r * kLoaders;
    const int h = i / (kHeadDim / 8);
    const int col = (i % (kHeadDim / 8)) * 8;
    qv[r] =
        (kChunks % kLoaders == 0 || i < kChunks) && h < c.heads
            ? *reinterpret_cast<const uint4*>(
                  a.q + (L::kQueryGroups ? c.row(a, h) : c.t * a.num_heads + c.h0 + h) * kHeadDim +
                  col)
            : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int r = 0; r < kLoads; ++r) {
    const int i = t + r * kLoaders;
    if (kChunks % kLoaders == 0 || i < kChunks) {
      *reinterpret_cast<uint4*>(c.base + kQOff +
                                sw128(i / (kHeadDim / 8), (i % (kHeadDim / 8)) * 8, kGroupHeads)) =
          qv[r];
    }
  }
}

// The segments' lens as loaded (raw1: the extra segment's, any value with one segment) clamped to
// their row widths, since device lens are data: c.len0, and c.total for both segments.
template <class L>
__device__ __forceinline__ void clamp_lens(const Args& a, Cta<L>& c, int32_t raw0, int32_t raw1) {
  c.len0 = min(max(raw0, 0), a.seg0.width);
  const int32_t len1 = a.num_segments > 1 ? min(max(raw1, 0), a.seg1.width) : 0;
  c.total = int64_t{c.len0} + len1;
}

// The CTA's Q rows (as load_q lays them out) by the tensor map, completing on `q_bar` (one
// thread, once per token and head group; heads past H arrive as zeros).
template <class L>
__device__ __forceinline__ void start_q_load(const Args& a, const Cta<L>& c, uint32_t q_bar) {
  static_assert(!L::kQueryGroups, "the tensor map holds Q per token");
  ptx::mbar_arrive_expect_tx(q_bar, kQBytes);
#pragma unroll
  for (int cb = 0; cb < kHeadDim / 64; ++cb) {
    ptx::tma_load_3d(c.sbase + kQOff + cb * kGroupHeads * 128, &a.q_map, 64 * cb, c.h0,
                     static_cast<int>(c.t), q_bar);
  }
}

}  // namespace sparse_swa::detail::ds_mla
