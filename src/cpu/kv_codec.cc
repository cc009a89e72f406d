// SPDX-License-Identifier: Apache-2.0
// The CPU reference codec (the layouts are include/sparse_swa/kv_cache.h's).
#include <cstring>

#include "backend.h"
#include "common/fp8_e4m3.h"

namespace sparse_swa::detail {

namespace {

// Host only: every slot is -1 or a real slot.
Status check_host_slots(std::span<const int64_t> slots, int64_t num_slots) {
  for (size_t i = 0; i < slots.size(); ++i) {
    const int64_t s = slots[i];
    if (s < -1 || s >= num_slots) {
      return invalid_argument("slots[", i, "]: expected -1 or 0..", num_slots - 1,
                              " (num_blocks * block_size = ", num_slots, "), got ", s);
    }
  }
  return Status::Ok();
}

void store_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, sizeof(v)); }
uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Encodes one row of 512 floats into the slot (CPU reference).
void encode_row(const float* x, int64_t slot, const KvCacheView& cache) {
  uint8_t* base = static_cast<uint8_t*>(cache.data);
  const KvSlotOffsets at =
      kv_slot_offsets(slot, cache.block_size, cache.page_stride_bytes, cache.dtype);
  uint8_t* data = base + at.data;
  switch (cache.dtype) {
    case CacheDtype::kFp8DsMla: {
      uint8_t* scales = base + at.scales;
      for (int g = 0; g < kNumQuantTiles; ++g) {
        float amax = fp8::kAmaxFloor;
        for (int i = 0; i < kQuantTile; ++i) amax = fp8::amax_step(amax, x[g * kQuantTile + i]);
        const int e = fp8::scale_exponent(amax);
        scales[g] = fp8::scale_byte(e);
        for (int i = 0; i < kQuantTile; ++i) {
          data[g * kQuantTile + i] = fp8::quantize(x[g * kQuantTile + i], e);
        }
      }
      scales[kNumQuantTiles] = 0;
      for (int i = 0; i < kRopeDim; ++i) {
        store_u16(data + kNopeDim + 2 * i, fp8::float_to_bf16(x[kNopeDim + i]));
      }
      break;
    }
    case CacheDtype::kBf16:
      for (int i = 0; i < kHeadDim; ++i) store_u16(data + 2 * i, fp8::float_to_bf16(x[i]));
      break;
    case CacheDtype::kFp8E4m3:
      for (int i = 0; i < kHeadDim; ++i) data[i] = fp8::float_to_e4m3(x[i]);
      break;
  }
}

void decode_row(const ConstKvCacheView& cache, int64_t slot, float* out) {
  const uint8_t* base = static_cast<const uint8_t*>(cache.data);
  const KvSlotOffsets at =
      kv_slot_offsets(slot, cache.block_size, cache.page_stride_bytes, cache.dtype);
  const uint8_t* data = base + at.data;
  switch (cache.dtype) {
    case CacheDtype::kFp8DsMla: {
      const uint8_t* scales = base + at.scales;
      for (int i = 0; i < kNopeDim; ++i) out[i] = fp8::dequantize(data[i], scales[i / kQuantTile]);
      for (int i = 0; i < kRopeDim; ++i) {
        out[kNopeDim + i] = fp8::bf16_to_float(load_u16(data + kNopeDim + 2 * i));
      }
      break;
    }
    case CacheDtype::kBf16:
      for (int i = 0; i < kHeadDim; ++i) out[i] = fp8::bf16_to_float(load_u16(data + 2 * i));
      break;
    case CacheDtype::kFp8E4m3:
      for (int i = 0; i < kHeadDim; ++i) out[i] = fp8::e4m3_to_float(data[i]);
      break;
  }
}

}  // namespace

Status cpu_encode_kv_rows(MatrixView<const float> rows, std::span<const int64_t> slots,
                          const KvCacheView& cache) {
  SPARSE_SWA_RETURN_IF_ERROR(check_host_slots(slots, cache.num_slots()));
  for (int64_t i = 0; i < rows.rows; ++i) {
    if (slots[i] >= 0) encode_row(rows.row(i), slots[i], cache);
  }
  return Status::Ok();
}

Status cpu_encode_kv_rows_bf16(MatrixView<const uint16_t> rows, std::span<const int64_t> slots,
                               const KvCacheView& cache) {
  SPARSE_SWA_RETURN_IF_ERROR(check_host_slots(slots, cache.num_slots()));
  float x[kHeadDim];
  for (int64_t i = 0; i < rows.rows; ++i) {
    if (slots[i] < 0) continue;
    for (int d = 0; d < kHeadDim; ++d) x[d] = fp8::bf16_to_float(rows.row(i)[d]);
    encode_row(x, slots[i], cache);
  }
  return Status::Ok();
}

Status cpu_decode_kv_rows(const ConstKvCacheView& cache, std::span<const int64_t> slots,
                          MatrixView<float> out) {
  SPARSE_SWA_RETURN_IF_ERROR(check_host_slots(slots, cache.num_slots()));
  for (int64_t i = 0; i < out.rows; ++i) {
    if (slots[i] >= 0) {
      decode_row(cache, slots[i], out.row(i));
    } else {
      std::memset(out.row(i), 0, sizeof(float) * kHeadDim);
    }
  }
  return Status::Ok();
}

}  // namespace sparse_swa::detail
