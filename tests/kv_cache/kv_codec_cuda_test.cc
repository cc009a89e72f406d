// SPDX-License-Identifier: Apache-2.0
// CUDA codec vs the CPU reference codec: the same cache bytes and the same decoded floats, bit
// for bit, for every dtype and page size (edge values included); out-of-range slots are skipped
// and counted rather than faulting.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/fp8_e4m3.h"
#include "sparse_swa/kv_cache.h"
#include "sparse_swa/metadata_builder.h"
#include "support/device_array.h"
#include "support/status_matchers.h"

namespace sparse_swa {
namespace {

using testing::DeviceArray;

// Rows with every kind of value: normals across 2^-30..2^30, zeros, tiny subnormals, exact
// e4m3 ties, values past 448 * 2^e, NaN and +-inf.
std::vector<float> edge_rows(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n * kHeadDim);
  for (int64_t r = 0; r < n; ++r) {
    for (int d = 0; d < kHeadDim; ++d) {
      float& x = v[r * kHeadDim + d];
      const int tile = d / kQuantTile;
      x = std::ldexp(normal(rng), static_cast<int>((r * 5 + tile * 9) % 61) - 30);
      switch ((r + d) % 97) {
        case 0:
          x = 0.0f;
          break;
        case 1:
          x = std::numeric_limits<float>::denorm_min() * 3;
          break;
        case 2:
          x = 1.0625f;  // an e4m3 tie at e = 0
          break;
        case 3:
          x = r % 3 == 0 ? std::nanf("") : x;
          break;
        case 4:
          x = r % 5 == 0 ? -std::numeric_limits<float>::infinity() : x;
          break;
        default:
          break;
      }
    }
    if (r % 4 == 1) {  // an all-zero tile
      for (int d = 128; d < 192; ++d) v[r * kHeadDim + d] = 0.0f;
    }
  }
  return v;
}

struct CodecCase {
  CacheDtype dtype;
  int32_t block_size;
  int64_t extra_stride;  // bytes added to the tight page size (kept a multiple of 16)
};

class KvCodecCuda : public ::testing::TestWithParam<CodecCase> {};

TEST_P(KvCodecCuda, EncodeAndDecodeMatchTheCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const CodecCase c = GetParam();
  const int64_t stride =
      (c.block_size * cache_token_bytes(c.dtype) + 15) / 16 * 16 + c.extra_stride;
  const int64_t num_blocks = 700 / c.block_size + 2;
  const int64_t num_slots = num_blocks * c.block_size;
  const int64_t n = 600;
  const std::vector<float> rows = edge_rows(n, 17);
  std::vector<uint16_t> rows_bf16(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) rows_bf16[i] = fp8::float_to_bf16(rows[i]);
  // Distinct slots in a scrambled order, plus -1 holes.
  std::vector<int64_t> slots(n);
  for (int64_t i = 0; i < n; ++i) slots[i] = i % 13 == 5 ? -1 : (i * 37) % num_slots;

  for (bool bf16_input : {false, true}) {
    SCOPED_TRACE(bf16_input ? "bf16 input" : "fp32 input");
    std::vector<uint8_t> host_cache(num_blocks * stride, 0xab);
    DeviceArray<uint8_t> dev_cache(host_cache);  // same poison on both sides
    DeviceArray<int64_t> dev_slots(slots);
    DeviceArray<float> dev_rows(rows);
    DeviceArray<uint16_t> dev_rows_bf16(rows_bf16);
    DeviceArray<int32_t> bad(std::vector<int32_t>{0});
    const KvCacheView hv{host_cache.data(), num_blocks,        c.block_size, stride,
                         c.dtype,           MemorySpace::kHost};
    KvCacheView dv = hv;
    dv.data = dev_cache.get();
    dv.space = MemorySpace::kDevice;
    KvCodecOptions options;
    options.device_bad_slot_count = bad.get();
    if (bf16_input) {
      SPARSE_SWA_ASSERT_OK(encode_kv_rows_bf16(
          {rows_bf16.data(), n, kHeadDim, kHeadDim, MemorySpace::kHost}, slots, hv));
      SPARSE_SWA_ASSERT_OK(
          encode_kv_rows_bf16({dev_rows_bf16.get(), n, kHeadDim, kHeadDim, MemorySpace::kDevice},
                              {dev_slots.get(), slots.size()}, dv, options));
    } else {
      SPARSE_SWA_ASSERT_OK(
          encode_kv_rows({rows.data(), n, kHeadDim, kHeadDim, MemorySpace::kHost}, slots, hv));
      SPARSE_SWA_ASSERT_OK(
          encode_kv_rows({dev_rows.get(), n, kHeadDim, kHeadDim, MemorySpace::kDevice},
                         {dev_slots.get(), slots.size()}, dv, options));
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint8_t> got = dev_cache.download();
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], host_cache[i])
          << "cache byte " << i << " (page " << i / stride << ", byte " << i % stride << ")";
    }
    EXPECT_EQ(bad.download()[0], 0);

    // Decode every slot (and -1) on both sides from the same bytes.
    std::vector<int64_t> all(num_slots + 1);
    for (int64_t s = 0; s < num_slots; ++s) all[s] = s;
    all[num_slots] = -1;
    std::vector<float> cpu_out(all.size() * kHeadDim);
    SPARSE_SWA_ASSERT_OK(decode_kv_rows(
        hv, all, {cpu_out.data(), static_cast<int64_t>(all.size()), kHeadDim, kHeadDim}));
    DeviceArray<int64_t> dev_all(all);
    DeviceArray<float> dev_out(all.size() * kHeadDim);
    ASSERT_EQ(cudaMemset(dev_out.get(), 0xff, all.size() * kHeadDim * sizeof(float)),
              cudaSuccess);  // NaN poison
    SPARSE_SWA_ASSERT_OK(decode_kv_rows(
        dv, {dev_all.get(), all.size()},
        {dev_out.get(), static_cast<int64_t>(all.size()), kHeadDim, kHeadDim, MemorySpace::kDevice},
        options));
    const std::vector<float> gpu_out = dev_out.download();
    ASSERT_EQ(std::memcmp(gpu_out.data(), cpu_out.data(), cpu_out.size() * sizeof(float)), 0)
        << "decoded floats differ";
  }
}

INSTANTIATE_TEST_SUITE_P(DtypesAndPages, KvCodecCuda,
                         ::testing::Values(CodecCase{CacheDtype::kFp8DsMla, 64, 64},
                                           CodecCase{CacheDtype::kFp8DsMla, 2, 0},
                                           CodecCase{CacheDtype::kFp8DsMla, 256, 256},
                                           CodecCase{CacheDtype::kFp8DsMla, 32, 320},
                                           CodecCase{CacheDtype::kBf16, 64, 0},
                                           CodecCase{CacheDtype::kBf16, 2, 32},
                                           CodecCase{CacheDtype::kFp8E4m3, 256, 512}),
                         [](const ::testing::TestParamInfo<CodecCase>& info) {
                           const CodecCase& c = info.param;  // e.g. fp8_ds_mla_B64_pad64
                           return std::string(cache_dtype_name(c.dtype)) + "_B" +
                                  std::to_string(c.block_size) + "_pad" +
                                  std::to_string(c.extra_stride);
                         });

TEST(KvCodecCudaErrors, OutOfRangeSlotsAreSkippedAndCounted) {
  SKIP_WITHOUT_GPU();
  const int32_t B = 64;
  const int64_t stride = 37440, num_blocks = 2;
  const std::vector<float> rows = edge_rows(5, 3);
  const std::vector<int64_t> slots = {3, 128, -7, 127, int64_t{1} << 40};
  std::vector<uint8_t> host_cache(num_blocks * stride, 0x77);
  DeviceArray<uint8_t> dev_cache(host_cache);
  DeviceArray<int64_t> dev_slots(slots);
  DeviceArray<float> dev_rows(rows);
  DeviceArray<int32_t> bad(std::vector<int32_t>{0});
  const KvCacheView dv{dev_cache.get(),       num_blocks,          B, stride,
                       CacheDtype::kFp8DsMla, MemorySpace::kDevice};
  KvCodecOptions options;
  options.device_bad_slot_count = bad.get();
  SPARSE_SWA_ASSERT_OK(encode_kv_rows({dev_rows.get(), 5, kHeadDim, kHeadDim, MemorySpace::kDevice},
                                      {dev_slots.get(), slots.size()}, dv, options));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(bad.download()[0], 3);
  // Only rows 0 and 3 were written: the CPU writes the same bytes for those two.
  const KvCacheView hv{host_cache.data(),     num_blocks,        B, stride,
                       CacheDtype::kFp8DsMla, MemorySpace::kHost};
  std::vector<float> kept(2 * kHeadDim);
  std::copy(rows.begin(), rows.begin() + kHeadDim, kept.begin());
  std::copy(rows.begin() + 3 * kHeadDim, rows.begin() + 4 * kHeadDim, kept.begin() + kHeadDim);
  SPARSE_SWA_ASSERT_OK(encode_kv_rows({kept.data(), 2, kHeadDim, kHeadDim}, {{3, 127}}, hv));
  EXPECT_EQ(dev_cache.download(), host_cache);

  // Decoding out-of-range slots gives zeros and counts them too.
  DeviceArray<float> out(5 * kHeadDim);
  SPARSE_SWA_ASSERT_OK(decode_kv_rows(dv, {dev_slots.get(), slots.size()},
                                      {out.get(), 5, kHeadDim, kHeadDim, MemorySpace::kDevice},
                                      options));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(bad.download()[0], 6);
  const std::vector<float> got = out.download();
  for (int d = 0; d < kHeadDim; ++d) {
    ASSERT_EQ(got[1 * kHeadDim + d], 0.0f);
    ASSERT_EQ(got[4 * kHeadDim + d], 0.0f);
  }
}

TEST(KvCodecCudaErrors, HostPointersAreRefusedBeforeLaunch) {
  SKIP_WITHOUT_GPU();
  std::vector<uint8_t> host_cache(37440);
  std::vector<float> rows(kHeadDim, 1.0f);
  std::vector<int64_t> slots = {0};
  DeviceArray<uint8_t> dev_cache(host_cache);
  DeviceArray<int64_t> dev_slots(slots);
  const KvCacheView dv{dev_cache.get(), 1, 64, 37440, CacheDtype::kFp8DsMla, MemorySpace::kDevice};
  EXPECT_TRUE(testing::IsInvalidArgument(
      encode_kv_rows({rows.data(), 1, kHeadDim, kHeadDim, MemorySpace::kDevice},
                     {dev_slots.get(), 1}, dv),
      {"rows.data: expected device or managed memory"}));
  DeviceArray<float> dev_rows(rows);
  EXPECT_TRUE(testing::IsInvalidArgument(
      encode_kv_rows({dev_rows.get(), 1, kHeadDim, kHeadDim, MemorySpace::kDevice}, slots, dv),
      {"slots.data: expected device or managed memory"}));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // nothing faulted
}

}  // namespace
}  // namespace sparse_swa
