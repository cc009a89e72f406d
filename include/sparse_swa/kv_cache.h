// SPDX-License-Identifier: Apache-2.0
// The DeepSeek-V4 SWA / compressed KV cache: page layouts, a checked view of a paged cache and
// the codec that writes rows into it and reads them back (CPU reference and CUDA, bit-exact).
//
// fp8_ds_mla page of B tokens (token o, 64-bit byte offsets from the page start):
//   [o*576, o*576 + 448)        448 NoPE values, fp8 e4m3, 7 tiles of 64 with one scale each
//   [o*576 + 448, o*576 + 576)  64 RoPE values, bf16 (little-endian)
//   [B*576 + o*8, +8)           7 UE8M0 scale bytes (value = 2^(s - 127)), then one 0 byte
//   [B*584, page_stride_bytes)  padding; the stride always comes from the caller
// bf16 page: token o's 512 bf16 values at o*1024. fp8_e4m3 page: 512 e4m3 values (unit scale)
// at o*512. A slot id is block * block_size + offset.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

#include "sparse_swa/index_view.h"
#include "sparse_swa/status.h"

namespace sparse_swa {

inline constexpr int32_t kHeadDim = 512;          // values per cached token (NoPE + RoPE)
inline constexpr int32_t kNopeDim = 448;          // quantised part of an fp8_ds_mla token
inline constexpr int32_t kRopeDim = 64;           // bf16 part of an fp8_ds_mla token
inline constexpr int32_t kQuantTile = 64;         // NoPE values sharing one scale byte
inline constexpr int32_t kNumQuantTiles = 7;      // kNopeDim / kQuantTile
inline constexpr int64_t kDsMlaTokenBytes = 576;  // 448 e4m3 bytes + 64 bf16 values
inline constexpr int64_t kDsMlaScaleBytes = 8;    // 7 scales + 1 zero byte
inline constexpr int64_t kDsMlaContentBytes = 584;
inline constexpr int64_t kCacheViewAlignment = 16;  // data pointer and page stride, in bytes

enum class CacheDtype {
  kFp8DsMla,  // uint8 pages of the layout above (FlashMLA, FlashInfer SM120)
  kBf16,      // 512 bf16 values per token (FlashInfer TRTLLM-gen)
  kFp8E4m3,   // 512 e4m3 values per token, unit per-tensor scale (FlashInfer TRTLLM-gen)
};
// Which kernel family reads the pages; it decides the page alignment.
enum class CacheConsumer {
  kFlashMla,    // fp8_ds_mla only, pages padded to a multiple of 576 bytes
  kFlashInfer,  // any dtype, pages padded to a multiple of 512 bytes
};

const char* cache_dtype_name(CacheDtype dtype);    // "fp8_ds_mla", "bf16", "fp8_e4m3"
const char* cache_consumer_name(CacheConsumer c);  // "flashmla", "flashinfer"
StatusOr<CacheDtype> parse_cache_dtype(std::string_view name);

// Content bytes of one token: 584, 1024 or 512.
constexpr int64_t cache_token_bytes(CacheDtype dtype) {
  return dtype == CacheDtype::kFp8DsMla ? kDsMlaContentBytes
                                        : (dtype == CacheDtype::kBf16 ? 2 * kHeadDim : kHeadDim);
}

struct PageLayout {
  int32_t block_size = 0;      // tokens (compressed entries) per page
  int32_t compress_ratio = 1;  // 1: the SWA cache; 2, 4 or 128: a compressed cache
  CacheDtype dtype = CacheDtype::kFp8DsMla;
  CacheConsumer consumer = CacheConsumer::kFlashMla;
  int32_t head_size = kHeadDim;
  int64_t token_bytes = 0;    // content bytes per token
  int64_t content_bytes = 0;  // block_size * token_bytes
  int64_t alignment = 0;      // 576 or 512
  int64_t page_bytes = 0;     // content_bytes rounded up to the alignment
};

// The cache spec of DeepseekV4SWACache: block_size a positive multiple of 32 (256 preferred).
// Errors: a bad block size; a FlashMLA-style consumer with a dtype other than fp8_ds_mla.
// Example: (64, fp8_ds_mla, FlashMLA) -> 584 bytes/token, 37376 content, 37440 page bytes.
StatusOr<PageLayout> page_layout(int block_size, CacheDtype dtype, CacheConsumer consumer);

// The cache spec of a compressed cache (the C2A, C4A and C128A layers'): pages of
// attn_block_size / compress_ratio entries (the main-model block divided by the ratio), each entry
// in the SWA cache's token layout, pages padded to the same alignment. With 256-token main-model
// blocks: 64-entry pages for C4A, 2-entry pages for C128A.
// Errors: compress_ratio outside {2, 4, 128}; attn_block_size not a positive multiple of 32 and
// of the ratio; the dtype and consumer errors of page_layout().
// Example: (256, 128, fp8_ds_mla, FlashMLA) -> block_size 2, 1168 content, 1728 page bytes.
StatusOr<PageLayout> compressed_page_layout(int attn_block_size, int compress_ratio,
                                            CacheDtype dtype, CacheConsumer consumer);

// Byte offsets of one slot's data (and, for fp8_ds_mla, its scale bytes) from the cache base.
// 64-bit throughout: a page past 2^31 bytes is an ordinary case.
struct KvSlotOffsets {
  int64_t data = 0;
  int64_t scales = -1;  // -1 unless fp8_ds_mla
};
constexpr KvSlotOffsets kv_slot_offsets(int64_t slot, int32_t block_size, int64_t page_stride_bytes,
                                        CacheDtype dtype) {
  const int64_t block = slot / block_size;
  const int64_t offset = slot % block_size;
  const int64_t page = block * page_stride_bytes;
  if (dtype == CacheDtype::kFp8DsMla) {
    return {page + offset * kDsMlaTokenBytes,
            page + block_size * kDsMlaTokenBytes + offset * kDsMlaScaleBytes};
  }
  return {page + offset * cache_token_bytes(dtype), -1};
}

// A paged KV cache: data is [num_blocks, page_stride_bytes] bytes, each page holding block_size
// tokens in the dtype's layout. Slots are 0 .. num_blocks * block_size - 1.
template <typename Void>
struct BasicKvCacheView {
  static_assert(std::is_same_v<std::remove_const_t<Void>, void>);
  Void* data = nullptr;           // [num_blocks, page_stride_bytes] bytes, 16-byte aligned
  int64_t num_blocks = 0;         // >= 0
  int32_t block_size = 0;         // tokens per page, >= 1 (the compressed cache may use 2)
  int64_t page_stride_bytes = 0;  // >= block_size * token bytes, a multiple of 16
  CacheDtype dtype = CacheDtype::kFp8DsMla;
  MemorySpace space = MemorySpace::kHost;

  int64_t num_slots() const { return num_blocks * block_size; }
  // Adding const is always safe (a template, so the const view declares no self-conversion).
  template <typename V,
            typename = std::enable_if_t<std::is_same_v<V, const void> && !std::is_const_v<Void>>>
  operator BasicKvCacheView<V>() const {  // NOLINT: implicit by design
    return {data, num_blocks, block_size, page_stride_bytes, dtype, space};
  }
};
using KvCacheView = BasicKvCacheView<void>;
using ConstKvCacheView = BasicKvCacheView<const void>;

// Shape checks; `name` prefixes the messages ("swa_cache.page_stride_bytes: expected ...").
Status check_kv_cache_view(const ConstKvCacheView& cache, std::string_view name);

// Codec options for the CUDA backend (ignored on CPU).
struct KvCodecOptions {
  void* cuda_stream = nullptr;  // cudaStream_t; nullptr = the default stream
  // Optional device int32 [1]: the CUDA codec adds the number of out-of-range slots it skipped.
  int32_t* device_bad_slot_count = nullptr;
};

// Writes rows [num_rows, >= 512] (only columns 0..511 are read) into slots [num_rows]:
// row i goes to slots[i]; slot -1 is skipped. Per 64-value NoPE tile of
// fp8_ds_mla: amax = max(|x|, 1e-4), e = ceil(log2(amax / 448)), scale byte e + 127 (clamped to
// 0..255), q = saturate_e4m3(x / 2^e) rounded to nearest even; RoPE values as bf16; scale byte 7
// is 0. bf16 and fp8_e4m3 caches store the 512 values directly (fp8: saturating, unit scale).
// Non-finite inputs: NaN stays NaN, +-inf saturate (fp8) or stay inf (bf16).
// Backend: the cache's memory space (host = CPU reference, device = CUDA, asynchronous on the
// stream); rows and slots must live in the same space. Slots below -1 or >= num_slots: the CPU
// backend returns an error naming the row and writes nothing; the CUDA backend skips those rows
// and counts them in options.device_bad_slot_count.
Status encode_kv_rows(MatrixView<const float> rows, std::span<const int64_t> slots,
                      const KvCacheView& cache, const KvCodecOptions& options = {});
// The same for bf16 rows (uint16_t bit patterns).
Status encode_kv_rows_bf16(MatrixView<const uint16_t> rows, std::span<const int64_t> slots,
                           const KvCacheView& cache, const KvCodecOptions& options = {});
// Reads slots [n] back into out [n, >= 512] fp32 (exact: every stored value is a float).
// Slot -1 gives a row of zeros; out-of-range slots as for encoding (CUDA: zeros + counted).
Status decode_kv_rows(const ConstKvCacheView& cache, std::span<const int64_t> slots,
                      MatrixView<float> out, const KvCodecOptions& options = {});

}  // namespace sparse_swa
