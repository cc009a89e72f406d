// SPDX-License-Identifier: Apache-2.0
// The KV cache's front end: page layouts, cache-view checks, and the codec's shape and
// memory-space checks before the backend the cache's space picks (the CPU reference in
// src/cpu/kv_codec.cc, the CUDA codec in src/cuda/kv_codec.cu).
#include "sparse_swa/kv_cache.h"

#include <limits>
#include <string>

#include "backend.h"

namespace sparse_swa {

const char* cache_dtype_name(CacheDtype dtype) {
  switch (dtype) {
    case CacheDtype::kFp8DsMla:
      return "fp8_ds_mla";
    case CacheDtype::kBf16:
      return "bf16";
    case CacheDtype::kFp8E4m3:
      return "fp8_e4m3";
  }
  return "unknown";
}

const char* cache_consumer_name(CacheConsumer c) {
  return c == CacheConsumer::kFlashMla ? "flashmla" : "flashinfer";
}

StatusOr<CacheDtype> parse_cache_dtype(std::string_view name) {
  for (CacheDtype d : {CacheDtype::kFp8DsMla, CacheDtype::kBf16, CacheDtype::kFp8E4m3}) {
    if (name == cache_dtype_name(d)) return d;
  }
  return invalid_argument("cache dtype: expected fp8_ds_mla, bf16 or fp8_e4m3, got '", name, "'");
}

namespace {

bool known_dtype(CacheDtype d) {
  return d == CacheDtype::kFp8DsMla || d == CacheDtype::kBf16 || d == CacheDtype::kFp8E4m3;
}

// The layout of pages of `block_size` entries; block_size and ratio are checked by the caller.
StatusOr<PageLayout> layout_of(int block_size, int compress_ratio, CacheDtype dtype,
                               CacheConsumer consumer) {
  if (!known_dtype(dtype)) {
    return invalid_argument("dtype: expected fp8_ds_mla, bf16 or fp8_e4m3, got enum value ",
                            static_cast<int>(dtype));
  }
  if (consumer != CacheConsumer::kFlashMla && consumer != CacheConsumer::kFlashInfer) {
    return invalid_argument("consumer: expected flashmla or flashinfer, got enum value ",
                            static_cast<int>(consumer));
  }
  if (consumer == CacheConsumer::kFlashMla && dtype != CacheDtype::kFp8DsMla) {
    return invalid_argument("dtype: the flashmla consumer reads only fp8_ds_mla pages, got ",
                            cache_dtype_name(dtype),
                            " (bf16 and fp8_e4m3 rows are for the flashinfer consumer)");
  }
  PageLayout layout;
  layout.block_size = block_size;
  layout.compress_ratio = compress_ratio;
  layout.dtype = dtype;
  layout.consumer = consumer;
  layout.token_bytes = cache_token_bytes(dtype);
  layout.content_bytes = static_cast<int64_t>(block_size) * layout.token_bytes;
  layout.alignment = consumer == CacheConsumer::kFlashMla ? kDsMlaTokenBytes : 512;
  layout.page_bytes =
      (layout.content_bytes + layout.alignment - 1) / layout.alignment * layout.alignment;
  return layout;
}

}  // namespace

StatusOr<PageLayout> page_layout(int block_size, CacheDtype dtype, CacheConsumer consumer) {
  if (block_size <= 0 || block_size % 32 != 0) {
    return invalid_argument("block_size: expected a positive multiple of 32, got ", block_size);
  }
  return layout_of(block_size, 1, dtype, consumer);
}

StatusOr<PageLayout> compressed_page_layout(int attn_block_size, int compress_ratio,
                                            CacheDtype dtype, CacheConsumer consumer) {
  if (compress_ratio != 2 && compress_ratio != 4 && compress_ratio != 128) {
    return invalid_argument(
        "compress_ratio: expected 2, 4 or 128 (a compressed cache; ratio 1 is the SWA cache, "
        "page_layout), got ",
        compress_ratio);
  }
  if (attn_block_size <= 0 || attn_block_size % 32 != 0 || attn_block_size % compress_ratio != 0) {
    return invalid_argument(
        "attn_block_size: expected a positive multiple of 32 and of compress_ratio ",
        compress_ratio, ", got ", attn_block_size);
  }
  return layout_of(attn_block_size / compress_ratio, compress_ratio, dtype, consumer);
}

Status check_kv_cache_view(const ConstKvCacheView& cache, std::string_view name) {
  if (!known_dtype(cache.dtype)) {
    return invalid_argument(name, ".dtype: expected fp8_ds_mla, bf16 or fp8_e4m3, got enum value ",
                            static_cast<int>(cache.dtype));
  }
  if (cache.num_blocks < 0) {
    return invalid_argument(name, ".num_blocks: expected >= 0, got ", cache.num_blocks);
  }
  if (cache.block_size < 1) {
    return invalid_argument(name, ".block_size: expected >= 1, got ", cache.block_size);
  }
  const int64_t content = static_cast<int64_t>(cache.block_size) * cache_token_bytes(cache.dtype);
  if (cache.page_stride_bytes < content) {
    return invalid_argument(name, ".page_stride_bytes: expected >= ", content, " (block_size ",
                            cache.block_size, " * ", cache_token_bytes(cache.dtype), " bytes of ",
                            cache_dtype_name(cache.dtype), "), got ", cache.page_stride_bytes);
  }
  if (cache.page_stride_bytes % kCacheViewAlignment != 0) {
    return invalid_argument(name, ".page_stride_bytes: expected a multiple of ",
                            kCacheViewAlignment, ", got ", cache.page_stride_bytes);
  }
  if (cache.num_blocks > 0 && cache.data == nullptr) {
    return invalid_argument(name, ".data: null with ", cache.num_blocks, " blocks");
  }
  if (reinterpret_cast<uintptr_t>(cache.data) % kCacheViewAlignment != 0) {
    return invalid_argument(name, ".data: expected ", kCacheViewAlignment,
                            "-byte alignment, got address ", cache.data);
  }
  if (cache.num_blocks > std::numeric_limits<int64_t>::max() / cache.page_stride_bytes) {
    return invalid_argument(name, ": num_blocks ", cache.num_blocks, " * page_stride_bytes ",
                            cache.page_stride_bytes, " overflows int64");
  }
  if (cache.num_blocks > std::numeric_limits<int64_t>::max() / cache.block_size) {
    return invalid_argument(name, ": num_blocks ", cache.num_blocks, " * block_size ",
                            cache.block_size, " overflows int64");
  }
  return Status::Ok();
}

namespace {

// Checks shared by both backends: the rows view, the slots and the memory spaces.
template <typename T>
Status check_codec_args(MatrixView<T> rows, std::string_view rows_name, size_t num_slots,
                        const void* slots_data, const ConstKvCacheView& cache) {
  SPARSE_SWA_RETURN_IF_ERROR(check_kv_cache_view(cache, "cache"));
  if (rows.space != cache.space) {
    return invalid_argument(rows_name, ".space: expected the cache's memory space (",
                            cache.space == MemorySpace::kHost ? "host" : "device", "), got ",
                            rows.space == MemorySpace::kHost ? "host" : "device");
  }
  if (rows.rows < 0) return invalid_argument(rows_name, ".rows: expected >= 0, got ", rows.rows);
  if (rows.cols != kHeadDim) {
    return invalid_argument(rows_name, ".cols: expected ", kHeadDim, ", got ", rows.cols);
  }
  if (rows.stride < rows.cols) {
    return invalid_argument(rows_name, ".stride: expected >= cols ", rows.cols, ", got ",
                            rows.stride);
  }
  if (rows.rows > 0 && rows.data == nullptr) {
    return invalid_argument(rows_name, ".data: null with ", rows.rows, " rows");
  }
  if (static_cast<int64_t>(num_slots) != rows.rows) {
    return invalid_argument("slots.size: expected ", rows.rows, " (one per row), got ", num_slots);
  }
  if (num_slots > 0 && slots_data == nullptr) {
    return invalid_argument("slots.data: null with ", num_slots, " slots");
  }
  return Status::Ok();
}

}  // namespace

Status encode_kv_rows(MatrixView<const float> rows, std::span<const int64_t> slots,
                      const KvCacheView& cache, const KvCodecOptions& options) {
  SPARSE_SWA_RETURN_IF_ERROR(check_codec_args(rows, "rows", slots.size(), slots.data(), cache));
  if (cache.space == MemorySpace::kDevice) {
    return detail::cuda_encode_kv_rows(rows, slots, cache, options);
  }
  return detail::cpu_encode_kv_rows(rows, slots, cache);
}

Status encode_kv_rows_bf16(MatrixView<const uint16_t> rows, std::span<const int64_t> slots,
                           const KvCacheView& cache, const KvCodecOptions& options) {
  SPARSE_SWA_RETURN_IF_ERROR(check_codec_args(rows, "rows", slots.size(), slots.data(), cache));
  if (cache.space == MemorySpace::kDevice) {
    return detail::cuda_encode_kv_rows_bf16(rows, slots, cache, options);
  }
  return detail::cpu_encode_kv_rows_bf16(rows, slots, cache);
}

Status decode_kv_rows(const ConstKvCacheView& cache, std::span<const int64_t> slots,
                      MatrixView<float> out, const KvCodecOptions& options) {
  SPARSE_SWA_RETURN_IF_ERROR(check_codec_args(out, "out", slots.size(), slots.data(), cache));
  if (cache.space == MemorySpace::kDevice) {
    return detail::cuda_decode_kv_rows(cache, slots, out, options);
  }
  return detail::cpu_decode_kv_rows(cache, slots, out);
}

}  // namespace sparse_swa
