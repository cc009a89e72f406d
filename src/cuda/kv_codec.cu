// SPDX-License-Identifier: Apache-2.0
// CUDA codec: one warp per row, the same scalar conversions as the CPU reference
// (common/fp8_e4m3.h), so both write the same bytes. Out-of-range slots are skipped and counted.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend.h"
#include "common/fp8_e4m3.h"
#include "cuda/cuda_utils.h"

namespace sparse_swa::detail {
namespace {

constexpr int kWarpsPerBlock = 8;

struct DeviceCache {
  uint8_t* data;
  int64_t num_slots;
  int32_t block_size;
  int64_t page_stride;
  CacheDtype dtype;
};

DeviceCache device_cache(const ConstKvCacheView& c) {
  return {static_cast<uint8_t*>(const_cast<void*>(c.data)), c.num_slots(), c.block_size,
          c.page_stride_bytes, c.dtype};
}

__device__ __forceinline__ float load_value(const float* row, int i) { return row[i]; }
__device__ __forceinline__ float load_value(const uint16_t* row, int i) {
  return fp8::bf16_to_float(row[i]);
}

__device__ __forceinline__ float warp_amax(float v) {
  return warp_allreduce(v, [](float a, float b) { return fp8::amax_step(a, b); });
}

// rows: [n, stride] (fp32 or bf16 bits), slots: [n]; warp w of the grid encodes row w.
template <typename In>
__global__ void encode_kernel(const In* rows, int64_t n, int64_t stride, const int64_t* slots,
                              DeviceCache cache, int32_t* bad_count) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n) return;
  const int64_t slot = slots[row];
  if (slot == -1) return;
  if (slot < -1 || slot >= cache.num_slots) {
    if (lane == 0 && bad_count != nullptr) atomicAdd(bad_count, 1);
    return;
  }
  const In* x = rows + row * stride;
  const KvSlotOffsets at = kv_slot_offsets(slot, cache.block_size, cache.page_stride, cache.dtype);
  uint8_t* data = cache.data + at.data;
  if (cache.dtype == CacheDtype::kFp8DsMla) {
    uint8_t* scales = cache.data + at.scales;
    for (int g = 0; g < kNumQuantTiles; ++g) {
      const float v0 = load_value(x, g * kQuantTile + lane);
      const float v1 = load_value(x, g * kQuantTile + lane + 32);
      // abs of a NaN input never wins amax_step, so NaN tiles keep the finite amax (as on CPU).
      const float amax = warp_amax(fp8::amax_step(fp8::amax_step(fp8::kAmaxFloor, v0), v1));
      const int e = fp8::scale_exponent(amax);
      data[g * kQuantTile + lane] = fp8::quantize(v0, e);
      data[g * kQuantTile + lane + 32] = fp8::quantize(v1, e);
      if (lane == 0) scales[g] = fp8::scale_byte(e);
    }
    if (lane == 0) scales[kNumQuantTiles] = 0;
    uint16_t* rope = reinterpret_cast<uint16_t*>(data + kNopeDim);  // 2-byte aligned
    rope[lane] = fp8::float_to_bf16(load_value(x, kNopeDim + lane));
    rope[lane + 32] = fp8::float_to_bf16(load_value(x, kNopeDim + lane + 32));
  } else if (cache.dtype == CacheDtype::kBf16) {
    uint16_t* out = reinterpret_cast<uint16_t*>(data);
    for (int i = lane; i < kHeadDim; i += 32) out[i] = fp8::float_to_bf16(load_value(x, i));
  } else {
    for (int i = lane; i < kHeadDim; i += 32) data[i] = fp8::float_to_e4m3(load_value(x, i));
  }
}

// out: [n, stride] fp32; slot -1 or out of range -> zeros (out of range also counted).
__global__ void decode_kernel(DeviceCache cache, const int64_t* slots, int64_t n, float* out,
                              int64_t stride, int32_t* bad_count) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n) return;
  float* y = out + row * stride;
  const int64_t slot = slots[row];
  if (slot < 0 || slot >= cache.num_slots) {
    if (slot != -1 && lane == 0 && bad_count != nullptr) atomicAdd(bad_count, 1);
    for (int i = lane; i < kHeadDim; i += 32) y[i] = 0.0f;
    return;
  }
  const KvSlotOffsets at = kv_slot_offsets(slot, cache.block_size, cache.page_stride, cache.dtype);
  const uint8_t* data = cache.data + at.data;
  if (cache.dtype == CacheDtype::kFp8DsMla) {
    const uint8_t* scales = cache.data + at.scales;
    for (int i = lane; i < kNopeDim; i += 32)
      y[i] = fp8::dequantize(data[i], scales[i / kQuantTile]);
    const uint16_t* rope = reinterpret_cast<const uint16_t*>(data + kNopeDim);
    for (int i = lane; i < kRopeDim; i += 32) y[kNopeDim + i] = fp8::bf16_to_float(rope[i]);
  } else if (cache.dtype == CacheDtype::kBf16) {
    const uint16_t* v = reinterpret_cast<const uint16_t*>(data);
    for (int i = lane; i < kHeadDim; i += 32) y[i] = fp8::bf16_to_float(v[i]);
  } else {
    for (int i = lane; i < kHeadDim; i += 32) y[i] = fp8::e4m3_to_float(data[i]);
  }
}

unsigned grid_for_rows(int64_t n) {
  return static_cast<unsigned>((n + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

Status check_rows_fit(int64_t n) {
  if (n > static_cast<int64_t>(0x7fffffff) * kWarpsPerBlock) {
    return invalid_argument("rows: expected at most ", static_cast<int64_t>(0x7fffffff) * 8,
                            " rows per CUDA codec call, got ", n);
  }
  return Status::Ok();
}

Status check_codec_pointers(std::span<const int64_t> slots, const ConstKvCacheView& cache,
                            const KvCodecOptions& options) {
  SPARSE_SWA_RETURN_IF_ERROR(check_device_pointer(slots.data(), "slots.data"));
  if (cache.num_blocks > 0) {
    SPARSE_SWA_RETURN_IF_ERROR(check_device_pointer(cache.data, "cache.data"));
  }
  if (options.device_bad_slot_count != nullptr) {
    SPARSE_SWA_RETURN_IF_ERROR(
        check_device_pointer(options.device_bad_slot_count, "options.device_bad_slot_count"));
  }
  return Status::Ok();
}

template <typename In>
Status encode(MatrixView<const In> rows, std::span<const int64_t> slots, const KvCacheView& cache,
              const KvCodecOptions& options) {
  if (rows.rows == 0) return Status::Ok();
  SPARSE_SWA_RETURN_IF_ERROR(check_rows_fit(rows.rows));
  SPARSE_SWA_RETURN_IF_ERROR(check_cuda_device());
  if (!stream_capturing(options.cuda_stream)) {
    SPARSE_SWA_RETURN_IF_ERROR(check_device_pointer(rows.data, "rows.data"));
    SPARSE_SWA_RETURN_IF_ERROR(check_codec_pointers(slots, cache, options));
  }
  encode_kernel<In><<<grid_for_rows(rows.rows), kWarpsPerBlock * 32, 0,
                      static_cast<cudaStream_t>(options.cuda_stream)>>>(
      rows.data, rows.rows, rows.stride, slots.data(), device_cache(cache),
      options.device_bad_slot_count);
  return check_launch("encode_kv_rows");
}

}  // namespace

Status cuda_encode_kv_rows(MatrixView<const float> rows, std::span<const int64_t> slots,
                           const KvCacheView& cache, const KvCodecOptions& options) {
  return encode(rows, slots, cache, options);
}

Status cuda_encode_kv_rows_bf16(MatrixView<const uint16_t> rows, std::span<const int64_t> slots,
                                const KvCacheView& cache, const KvCodecOptions& options) {
  return encode(rows, slots, cache, options);
}

Status cuda_decode_kv_rows(const ConstKvCacheView& cache, std::span<const int64_t> slots,
                           MatrixView<float> out, const KvCodecOptions& options) {
  if (out.rows == 0) return Status::Ok();
  SPARSE_SWA_RETURN_IF_ERROR(check_rows_fit(out.rows));
  SPARSE_SWA_RETURN_IF_ERROR(check_cuda_device());
  if (!stream_capturing(options.cuda_stream)) {
    SPARSE_SWA_RETURN_IF_ERROR(check_device_pointer(out.data, "out.data"));
    SPARSE_SWA_RETURN_IF_ERROR(check_codec_pointers(slots, cache, options));
  }
  decode_kernel<<<grid_for_rows(out.rows), kWarpsPerBlock * 32, 0,
                  static_cast<cudaStream_t>(options.cuda_stream)>>>(
      device_cache(cache), slots.data(), out.rows, out.data, out.stride,
      options.device_bad_slot_count);
  return check_launch("decode_kv_rows");
}

}  // namespace sparse_swa::detail
