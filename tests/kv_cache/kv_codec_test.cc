// SPDX-License-Identifier: Apache-2.0
// The KV cache spec and the CPU reference codec: page layouts, the scalar conversions against
// hand-computed bytes, per-tile round-trip bounds, exact scale bytes, padding, caller strides,
// 64-bit page offsets and the error messages.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "common/fp8_e4m3.h"
#include "sparse_swa/kv_cache.h"
#include "support/status_matchers.h"

namespace sparse_swa {
namespace {

using testing::IsInvalidArgument;

// A host cache in 64-byte aligned memory, every byte preset to `fill`.
class HostCache {
 public:
  HostCache(CacheDtype dtype, int32_t block_size, int64_t num_blocks, int64_t page_stride,
            uint8_t fill = 0xab)
      : bytes_(num_blocks * page_stride),
        mem_(static_cast<uint8_t*>(std::aligned_alloc(64, (bytes_ + 63) / 64 * 64 + 64)),
             &std::free) {
    std::memset(mem_.get(), fill, bytes_);
    view_ = {mem_.get(), num_blocks, block_size, page_stride, dtype, MemorySpace::kHost};
  }
  const KvCacheView& view() const { return view_; }
  uint8_t* bytes() const { return mem_.get(); }
  int64_t size() const { return bytes_; }

 private:
  int64_t bytes_;
  std::unique_ptr<uint8_t, decltype(&std::free)> mem_;
  KvCacheView view_;
};

MatrixView<const float> rows_view(const std::vector<float>& v, int64_t rows) {
  return {v.data(), rows, kHeadDim, kHeadDim, MemorySpace::kHost};
}
MatrixView<float> out_view(std::vector<float>* v, int64_t rows) {
  return {v->data(), rows, kHeadDim, kHeadDim, MemorySpace::kHost};
}

// Random rows whose 64-value tiles span many magnitudes (tile g of row r scaled by 2^(r+3g-12)).
std::vector<float> random_rows(int64_t rows, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(rows * kHeadDim);
  for (int64_t r = 0; r < rows; ++r) {
    for (int d = 0; d < kHeadDim; ++d) {
      const int tile = d / kQuantTile;
      v[r * kHeadDim + d] = std::ldexp(normal(rng), static_cast<int>(r % 7) + 3 * tile - 12);
    }
  }
  return v;
}

// ---- page layouts ----

TEST(PageLayout, Fp8DsMlaFlashMlaPagesArePaddedTo576) {
  const struct {
    int block_size;
    int64_t content, page;
  } cases[] = {{32, 18688, 19008}, {64, 37376, 37440}, {128, 74752, 74880}, {256, 149504, 149760}};
  for (const auto& c : cases) {
    auto layout = page_layout(c.block_size, CacheDtype::kFp8DsMla, CacheConsumer::kFlashMla);
    ASSERT_TRUE(layout.ok()) << layout.status().to_string();
    EXPECT_EQ(layout->token_bytes, 584);
    EXPECT_EQ(layout->head_size, 512);
    EXPECT_EQ(layout->alignment, 576);
    EXPECT_EQ(layout->content_bytes, c.content) << "B=" << c.block_size;
    EXPECT_EQ(layout->page_bytes, c.page) << "B=" << c.block_size;
  }
}

TEST(PageLayout, FlashInferPagesArePaddedTo512) {
  auto ds32 = page_layout(32, CacheDtype::kFp8DsMla, CacheConsumer::kFlashInfer);
  ASSERT_TRUE(ds32.ok());
  EXPECT_EQ(ds32->page_bytes, 18944);  // 18688 -> next multiple of 512
  auto ds64 = page_layout(64, CacheDtype::kFp8DsMla, CacheConsumer::kFlashInfer);
  ASSERT_TRUE(ds64.ok());
  EXPECT_EQ(ds64->page_bytes, 37376);  // already 73 * 512
  auto bf16 = page_layout(64, CacheDtype::kBf16, CacheConsumer::kFlashInfer);
  ASSERT_TRUE(bf16.ok());
  EXPECT_EQ(bf16->token_bytes, 1024);
  EXPECT_EQ(bf16->page_bytes, 65536);
  auto e4m3 = page_layout(96, CacheDtype::kFp8E4m3, CacheConsumer::kFlashInfer);
  ASSERT_TRUE(e4m3.ok());
  EXPECT_EQ(e4m3->token_bytes, 512);
  EXPECT_EQ(e4m3->page_bytes, 96 * 512);
}

TEST(PageLayout, RejectsBadBlockSizesAndCombinations) {
  for (int b : {0, -32, 16, 48, 100}) {
    EXPECT_TRUE(IsInvalidArgument(
        page_layout(b, CacheDtype::kFp8DsMla, CacheConsumer::kFlashMla).status(),
        {"block_size: expected a positive multiple of 32, got " + std::to_string(b)}));
  }
  EXPECT_TRUE(
      IsInvalidArgument(page_layout(64, CacheDtype::kBf16, CacheConsumer::kFlashMla).status(),
                        {"dtype: the flashmla consumer reads only fp8_ds_mla pages, got bf16"}));
  EXPECT_TRUE(IsInvalidArgument(
      page_layout(64, CacheDtype::kFp8E4m3, CacheConsumer::kFlashMla).status(), {"got fp8_e4m3"}));
  EXPECT_TRUE(IsInvalidArgument(
      page_layout(64, static_cast<CacheDtype>(7), CacheConsumer::kFlashInfer).status(),
      {"dtype: expected fp8_ds_mla, bf16 or fp8_e4m3, got enum value 7"}));
}

// The compressed caches: attn_block_size / ratio entries a page, the SWA cache's token layout.
TEST(PageLayout, CompressedCachePagesAreTheMainBlockOverTheRatio) {
  const struct {
    int ratio;
    int32_t block_size;
    int64_t content, page;
  } cases[] = {{2, 128, 74752, 74880}, {4, 64, 37376, 37440}, {128, 2, 1168, 1728}};
  for (const auto& c : cases) {
    auto layout =
        compressed_page_layout(256, c.ratio, CacheDtype::kFp8DsMla, CacheConsumer::kFlashMla);
    ASSERT_TRUE(layout.ok()) << layout.status().to_string();
    EXPECT_EQ(layout->compress_ratio, c.ratio);
    EXPECT_EQ(layout->block_size, c.block_size) << "ratio " << c.ratio;
    EXPECT_EQ(layout->token_bytes, 584);
    EXPECT_EQ(layout->content_bytes, c.content) << "ratio " << c.ratio;
    EXPECT_EQ(layout->page_bytes, c.page) << "ratio " << c.ratio;
  }
  auto bf16 = compressed_page_layout(256, 128, CacheDtype::kBf16, CacheConsumer::kFlashInfer);
  ASSERT_TRUE(bf16.ok());
  EXPECT_EQ(bf16->block_size, 2);
  EXPECT_EQ(bf16->page_bytes, 2048);  // 2 x 1024 bytes, already a multiple of 512
  EXPECT_EQ(page_layout(64, CacheDtype::kFp8DsMla, CacheConsumer::kFlashMla)->compress_ratio, 1);

  // A C128A cache of these pages (3 pages of 2 entries) is a valid cache view, and the codec
  // reads back from it what it reads back from 64-token SWA pages.
  const PageLayout c128a =
      *compressed_page_layout(256, 128, CacheDtype::kFp8DsMla, CacheConsumer::kFlashMla);
  const PageLayout swa = *page_layout(64, CacheDtype::kFp8DsMla, CacheConsumer::kFlashMla);
  std::vector<uint8_t> small(3 * c128a.page_bytes), large(swa.page_bytes);
  const KvCacheView small_cache{small.data(),     3,           c128a.block_size,
                                c128a.page_bytes, c128a.dtype, MemorySpace::kHost};
  const KvCacheView large_cache{large.data(),   1,         swa.block_size,
                                swa.page_bytes, swa.dtype, MemorySpace::kHost};
  ASSERT_TRUE(check_kv_cache_view(small_cache, "extra_cache").ok());
  const std::vector<float> rows = random_rows(6, 11);
  const std::vector<int64_t> slots = {5, 0, 3, 1, 4, 2};
  std::vector<float> from_small(6 * kHeadDim), from_large(6 * kHeadDim);
  for (const auto& [cache, out] :
       {std::pair{small_cache, from_small.data()}, std::pair{large_cache, from_large.data()}}) {
    ASSERT_TRUE(encode_kv_rows({rows.data(), 6, kHeadDim, kHeadDim}, slots, cache).ok());
    ASSERT_TRUE(decode_kv_rows(cache, slots, {out, 6, kHeadDim, kHeadDim}).ok());
  }
  EXPECT_EQ(from_small, from_large);
  EXPECT_NE(from_small, std::vector<float>(6 * kHeadDim, 0.0f));
}

TEST(PageLayout, CompressedCacheRejectsBadRatiosAndMainBlocks) {
  for (int ratio : {0, 1, 3, 8, 64}) {
    EXPECT_TRUE(IsInvalidArgument(
        compressed_page_layout(256, ratio, CacheDtype::kFp8DsMla, CacheConsumer::kFlashMla)
            .status(),
        {"compress_ratio: expected 2, 4 or 128 (a compressed cache; ratio 1 is the SWA cache, "
         "page_layout), got " +
         std::to_string(ratio)}));
  }
  for (const auto& [attn, ratio] : {std::pair{64, 128}, {0, 4}, {-256, 4}, {48, 4}, {100, 2}}) {
    EXPECT_TRUE(IsInvalidArgument(
        compressed_page_layout(attn, ratio, CacheDtype::kFp8DsMla, CacheConsumer::kFlashMla)
            .status(),
        {"attn_block_size: expected a positive multiple of 32 and of compress_ratio " +
         std::to_string(ratio) + ", got " + std::to_string(attn)}));
  }
  EXPECT_TRUE(IsInvalidArgument(
      compressed_page_layout(256, 4, CacheDtype::kBf16, CacheConsumer::kFlashMla).status(),
      {"dtype: the flashmla consumer reads only fp8_ds_mla pages, got bf16"}));
}

TEST(PageLayout, ParsesDtypeNames) {
  for (CacheDtype d : {CacheDtype::kFp8DsMla, CacheDtype::kBf16, CacheDtype::kFp8E4m3}) {
    auto parsed = parse_cache_dtype(cache_dtype_name(d));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(parsed.value(), d);
  }
  EXPECT_TRUE(IsInvalidArgument(parse_cache_dtype("fp16").status(), {"got 'fp16'"}));
}

// ---- scalar conversions ----

TEST(Fp8Conversions, E4m3HandValues) {
  using fp8::float_to_e4m3;
  EXPECT_EQ(float_to_e4m3(1.0f), 0x38);  // 0 0111 000
  EXPECT_EQ(float_to_e4m3(-1.0f), 0xb8);
  EXPECT_EQ(float_to_e4m3(0.5f), 0x30);
  EXPECT_EQ(float_to_e4m3(448.0f), 0x7e);  // largest finite
  EXPECT_EQ(float_to_e4m3(240.0f), 0x77);  // 1.875 * 2^7
  EXPECT_EQ(float_to_e4m3(256.0f), 0x78);
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -6)), 0x08);  // smallest normal
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -9)), 0x01);  // smallest subnormal
  EXPECT_EQ(float_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
  // Ties go to even: 2^-10 is half a subnormal step, 3 * 2^-10 is 1.5 steps.
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(float_to_e4m3(std::ldexp(3.0f, -10)), 0x02);
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);      // between 1 (m=0) and 1.125 (m=1)
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3a);      // between 1.125 (m=1) and 1.25 (m=2)
  EXPECT_EQ(float_to_e4m3(1.07f), 0x39);        // above the tie
  EXPECT_EQ(float_to_e4m3(432.0f), 0x7e);       // tie 416/448 -> 448 (even mantissa 6)
  EXPECT_EQ(float_to_e4m3(0.01171875f), 0x06);  // 6 * 2^-9 exactly (subnormal)
  // Saturation, NaN.
  EXPECT_EQ(float_to_e4m3(464.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3(1e30f), 0x7e);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(float_to_e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::quiet_NaN()) & 0x7f, 0x7f);
}

TEST(Fp8Conversions, E4m3EveryCodeRoundTrips) {
  for (int b = 0; b < 256; ++b) {
    const float v = fp8::e4m3_to_float(static_cast<uint8_t>(b));
    if ((b & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << b;
      continue;
    }
    EXPECT_EQ(fp8::float_to_e4m3(v), b) << "code " << b << " value " << v;
  }
  EXPECT_EQ(fp8::e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(fp8::e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8::e4m3_to_float(0xb8), -1.0f);
}

TEST(Fp8Conversions, E4m3RoundsToNearestOnRandomInputs) {
  // Compare with the nearest representable value found by brute force over all codes.
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-500.0f, 500.0f);
  for (int i = 0; i < 20000; ++i) {
    const float x = u(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 24) - 16);
    const uint8_t got = fp8::float_to_e4m3(x);
    const double err = std::abs(static_cast<double>(fp8::e4m3_to_float(got)) - x);
    for (int b = 0; b < 256; ++b) {
      if ((b & 0x7f) == 0x7f) continue;
      const double other = std::abs(static_cast<double>(fp8::e4m3_to_float(b)) - x);
      if (std::abs(x) <= 448.0f) ASSERT_LE(err, other) << "x=" << x << " got code " << int(got);
    }
  }
}

TEST(Fp8Conversions, Bf16RoundsToNearestEven) {
  EXPECT_EQ(fp8::float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(fp8::float_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(fp8::float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);          // tie -> even
  EXPECT_EQ(fp8::float_to_bf16(1.0f + std::ldexp(3.0f, -8)), 0x3f82);          // tie -> even
  EXPECT_EQ(fp8::float_to_bf16(1.0f + std::ldexp(1.0f, -8) + 1e-6f), 0x3f81);  // above tie
  EXPECT_EQ(fp8::float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE(std::isnan(fp8::bf16_to_float(fp8::float_to_bf16(std::nanf("")))));
  EXPECT_EQ(fp8::bf16_to_float(0x3fc0), 1.5f);
}

TEST(Fp8Conversions, ScaleExponentIsCeilLog2OfAmaxOver448) {
  EXPECT_EQ(fp8::scale_exponent(448.0f), 0);
  EXPECT_EQ(fp8::scale_exponent(896.0f), 1);
  EXPECT_EQ(fp8::scale_exponent(std::nextafter(448.0f, 1e9f)), 1);
  EXPECT_EQ(fp8::scale_exponent(1.0f), -8);
  EXPECT_EQ(fp8::scale_exponent(fp8::kAmaxFloor), -22);
  EXPECT_EQ(fp8::scale_exponent(std::numeric_limits<float>::infinity()), 128);
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(1.0f, 2.0f);
  for (int i = 0; i < 5000; ++i) {
    const float amax = u(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 120) - 13);
    const double quotient = static_cast<double>(amax / 448.0f);  // the IEEE float quotient
    EXPECT_EQ(fp8::scale_exponent(amax), static_cast<int>(std::ceil(std::log2(quotient)))) << amax;
  }
}

// ---- the codec ----

TEST(KvCodec, ExactBytesOfAHandBuiltRow) {
  // Tile g: amax and the expected e = ceil(log2(amax / 448)).
  std::vector<float> row(kHeadDim, 0.0f);
  for (int i = 0; i < 64; ++i) row[i] = (i % 2 == 0) ? 1.0f : -1.0f;  // e = -8, q(+-1) = +-256
  row[64] = 448.0f;                                                   // e = 0
  // tile 2 stays all zero: amax floor 1e-4 -> e = -22, q = 0
  row[192] = 896.0f;  // e = 1, q = 448
  row[256] = 0.5f;    // e = -9, q = 256
  row[320] = 3.0f;    // e = -7, q = 384
  row[384] = 1e6f;    // e = 12, q = 1e6 / 4096 = 244.14 -> 240
  for (int i = 0; i < kRopeDim; ++i) row[kNopeDim + i] = 1.0f + i;
  HostCache cache(CacheDtype::kFp8DsMla, 32, 2, 19008);
  const std::vector<int64_t> slots = {37};  // block 1, offset 5
  SPARSE_SWA_ASSERT_OK(encode_kv_rows(rows_view(row, 1), slots, cache.view()));

  const uint8_t* token = cache.bytes() + 19008 + 5 * 576;
  const uint8_t* scales = cache.bytes() + 19008 + 32 * 576 + 5 * 8;
  const uint8_t expected_scales[8] = {119, 127, 105, 128, 118, 120, 139, 0};
  for (int g = 0; g < 8; ++g) EXPECT_EQ(scales[g], expected_scales[g]) << "scale byte " << g;
  EXPECT_EQ(token[0], 0x78);   // +256
  EXPECT_EQ(token[1], 0xf8);   // -256
  EXPECT_EQ(token[64], 0x7e);  // 448
  EXPECT_EQ(token[65], 0x00);
  EXPECT_EQ(token[128], 0x00);
  EXPECT_EQ(token[192], 0x7e);
  EXPECT_EQ(token[256], 0x78);
  EXPECT_EQ(token[320], 0x7c);  // 384 = 1.5 * 2^8
  EXPECT_EQ(token[384], 0x77);  // 240
  for (int i = 0; i < kRopeDim; ++i) {
    uint16_t bits;
    std::memcpy(&bits, token + kNopeDim + 2 * i, 2);
    EXPECT_EQ(bits, fp8::float_to_bf16(1.0f + i)) << "rope " << i;
  }
  std::vector<float> back(kHeadDim);
  SPARSE_SWA_ASSERT_OK(decode_kv_rows(cache.view(), slots, out_view(&back, 1)));
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -1.0f);
  EXPECT_EQ(back[64], 448.0f);
  EXPECT_EQ(back[192], 896.0f);
  EXPECT_EQ(back[320], 3.0f);
  EXPECT_EQ(back[384], 240.0f * 4096.0f);
  EXPECT_EQ(back[kNopeDim + 3], 4.0f);
}

TEST(KvCodec, RoundTripErrorBoundsPerTile) {
  const int64_t n = 40;
  const std::vector<float> rows = random_rows(n, 1);
  HostCache cache(CacheDtype::kFp8DsMla, 64, 1, 37440);
  std::vector<int64_t> slots(n);
  for (int64_t i = 0; i < n; ++i) slots[i] = (i * 7) % 64;  // distinct offsets
  SPARSE_SWA_ASSERT_OK(encode_kv_rows(rows_view(rows, n), slots, cache.view()));
  std::vector<float> back(n * kHeadDim);
  SPARSE_SWA_ASSERT_OK(decode_kv_rows(cache.view(), slots, out_view(&back, n)));
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* scales = cache.bytes() + 64 * 576 + slots[r] * 8;
    for (int g = 0; g < kNumQuantTiles; ++g) {
      double amax = 1e-4;
      for (int i = 0; i < kQuantTile; ++i) {
        amax = std::max(amax, std::abs(static_cast<double>(rows[r * kHeadDim + g * 64 + i])));
      }
      const int e = static_cast<int>(
          std::ceil(std::log2(static_cast<double>(static_cast<float>(amax) / 448.0f))));
      ASSERT_EQ(scales[g], e + 127) << "row " << r << " tile " << g;
      for (int i = 0; i < kQuantTile; ++i) {
        const int d = g * 64 + i;
        const double x = rows[r * kHeadDim + d], y = back[r * kHeadDim + d];
        // Half an e4m3 ulp: 2^-4 relative for normals, 2^-10 * 2^e absolute for subnormals.
        const double bound = std::max(std::abs(x) * 0.0625, std::ldexp(1.0, e - 10));
        ASSERT_LE(std::abs(x - y), bound) << "row " << r << " dim " << d;
        ASSERT_LE(std::abs(y), 448.0 * std::ldexp(1.0, e));
      }
    }
    EXPECT_EQ(scales[7], 0);
    for (int d = kNopeDim; d < kHeadDim; ++d) {
      const float x = rows[r * kHeadDim + d];
      EXPECT_EQ(back[r * kHeadDim + d], fp8::bf16_to_float(fp8::float_to_bf16(x)));
      EXPECT_LE(std::abs(x - back[r * kHeadDim + d]), std::abs(x) * std::ldexp(1.0, -8));
    }
  }
}

TEST(KvCodec, Bf16AndE4m3CachesStoreEveryValue) {
  const int64_t n = 5;
  std::vector<float> rows = random_rows(n, 2);
  rows[7] = 1e4f;  // saturates in e4m3
  HostCache bf16(CacheDtype::kBf16, 4, 3, 4096);
  HostCache e4m3(CacheDtype::kFp8E4m3, 4, 3, 2048);
  const std::vector<int64_t> slots = {0, 5, 11, 6, 3};
  SPARSE_SWA_ASSERT_OK(encode_kv_rows(rows_view(rows, n), slots, bf16.view()));
  SPARSE_SWA_ASSERT_OK(encode_kv_rows(rows_view(rows, n), slots, e4m3.view()));
  std::vector<float> a(n * kHeadDim), b(n * kHeadDim);
  SPARSE_SWA_ASSERT_OK(decode_kv_rows(bf16.view(), slots, out_view(&a, n)));
  SPARSE_SWA_ASSERT_OK(decode_kv_rows(e4m3.view(), slots, out_view(&b, n)));
  for (int64_t i = 0; i < n * kHeadDim; ++i) {
    ASSERT_EQ(a[i], fp8::bf16_to_float(fp8::float_to_bf16(rows[i]))) << i;
    ASSERT_EQ(b[i], fp8::e4m3_to_float(fp8::float_to_e4m3(rows[i]))) << i;
  }
  EXPECT_EQ(b[7], 448.0f);
  // bf16 slot 11 = block 2 offset 3: its bytes start at 2 * 4096 + 3 * 1024.
  uint16_t bits;
  std::memcpy(&bits, bf16.bytes() + 2 * 4096 + 3 * 1024 + 2 * 9, 2);
  EXPECT_EQ(bits, fp8::float_to_bf16(rows[2 * kHeadDim + 9]));
}

TEST(KvCodec, Bf16InputEncodesLikeItsFloatValues) {
  const int64_t n = 6;
  const std::vector<float> f = random_rows(n, 3);
  std::vector<uint16_t> h(f.size());
  std::vector<float> rounded(f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    h[i] = fp8::float_to_bf16(f[i]);
    rounded[i] = fp8::bf16_to_float(h[i]);
  }
  HostCache a(CacheDtype::kFp8DsMla, 32, 1, 19008), b(CacheDtype::kFp8DsMla, 32, 1, 19008);
  const std::vector<int64_t> slots = {4, 9, 0, 31, 17, 2};
  SPARSE_SWA_ASSERT_OK(
      encode_kv_rows_bf16({h.data(), n, kHeadDim, kHeadDim, MemorySpace::kHost}, slots, a.view()));
  SPARSE_SWA_ASSERT_OK(encode_kv_rows(rows_view(rounded, n), slots, b.view()));
  EXPECT_EQ(std::memcmp(a.bytes(), b.bytes(), a.size()), 0);
}

TEST(KvCodec, PaddingAndScaleByte7AreZeroAndLargeStridesAreHonoured) {
  // Stride 3 pages of content + 64 bytes: nothing may be written past B * 584 of a page.
  const int32_t B = 32;
  const int64_t stride = 3 * B * kDsMlaContentBytes + 64;
  HostCache cache(CacheDtype::kFp8DsMla, B, 4, stride, /*fill=*/0xcd);
  const int64_t n = 4 * B;
  const std::vector<float> rows = random_rows(n, 4);
  std::vector<int64_t> slots(n);
  for (int64_t i = 0; i < n; ++i) slots[i] = i;
  SPARSE_SWA_ASSERT_OK(encode_kv_rows(rows_view(rows, n), slots, cache.view()));
  for (int64_t blk = 0; blk < 4; ++blk) {
    const uint8_t* page = cache.bytes() + blk * stride;
    for (int o = 0; o < B; ++o) EXPECT_EQ(page[B * 576 + o * 8 + 7], 0) << blk << "/" << o;
    for (int64_t byte = B * kDsMlaContentBytes; byte < stride; ++byte) {
      ASSERT_EQ(page[byte], 0xcd) << "padding byte " << byte << " of page " << blk;
    }
  }
  // Decoding through the same stride gives the rows of a tightly strided cache, byte for byte.
  HostCache tight(CacheDtype::kFp8DsMla, B, 4, B * kDsMlaContentBytes);
  SPARSE_SWA_ASSERT_OK(encode_kv_rows(rows_view(rows, n), slots, tight.view()));
  std::vector<float> a(n * kHeadDim), b(n * kHeadDim);
  SPARSE_SWA_ASSERT_OK(decode_kv_rows(cache.view(), slots, out_view(&a, n)));
  SPARSE_SWA_ASSERT_OK(decode_kv_rows(tight.view(), slots, out_view(&b, n)));
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  for (int64_t blk = 0; blk < 4; ++blk) {
    EXPECT_EQ(std::memcmp(cache.bytes() + blk * stride, tight.bytes() + blk * B * 584, B * 584), 0);
  }
}

TEST(KvCodec, SkipsMinusOneSlotsAndDecodesThemAsZeros) {
  HostCache cache(CacheDtype::kFp8DsMla, 32, 1, 19008, 0x11);
  const std::vector<float> rows = random_rows(2, 5);
  const std::vector<int64_t> slots = {-1, 3};
  SPARSE_SWA_ASSERT_OK(encode_kv_rows(rows_view(rows, 2), slots, cache.view()));
  for (int64_t byte = 0; byte < 3 * 576; ++byte) ASSERT_EQ(cache.bytes()[byte], 0x11) << byte;
  std::vector<float> back(2 * kHeadDim, 7.0f);
  SPARSE_SWA_ASSERT_OK(decode_kv_rows(cache.view(), slots, out_view(&back, 2)));
  for (int d = 0; d < kHeadDim; ++d) ASSERT_EQ(back[d], 0.0f);
  EXPECT_NE(back[kHeadDim], 0.0f);
}

TEST(KvCodec, SlotOffsetsAre64BitPastTwoGiB) {
  // Block 60000 of B=64 pages at the FlashMLA stride starts at 2,246,400,000 bytes > 2^31.
  const KvSlotOffsets at = kv_slot_offsets(60000LL * 64 + 5, 64, 37440, CacheDtype::kFp8DsMla);
  EXPECT_EQ(at.data, 60000LL * 37440 + 5 * 576);
  EXPECT_EQ(at.scales, 60000LL * 37440 + 64 * 576 + 5 * 8);
  EXPECT_GT(at.data, int64_t{1} << 31);
  const KvSlotOffsets bf = kv_slot_offsets(3000000LL * 32 + 1, 32, 32768, CacheDtype::kBf16);
  EXPECT_EQ(bf.data, 3000000LL * 32768 + 1024);
  EXPECT_EQ(bf.scales, -1);
}

TEST(KvCodec, EncodesAndDecodesAPagePastTwoGiB) {
  // A 2.3 GB address range reserved without backing: only the touched pages get memory.
  const int32_t B = 64;
  const int64_t stride = 37440, num_blocks = 61440;
  const size_t bytes = static_cast<size_t>(num_blocks * stride);
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED) GTEST_SKIP() << "cannot reserve " << bytes << " bytes of address space";
  const KvCacheView big{mem, num_blocks, B, stride, CacheDtype::kFp8DsMla, MemorySpace::kHost};
  const std::vector<float> rows = random_rows(2, 6);
  const std::vector<int64_t> slots = {int64_t{60000} * B + 17, int64_t{61439} * B + 63};
  ASSERT_GT(slots[0] * 584, int64_t{1} << 31);
  SPARSE_SWA_EXPECT_OK(encode_kv_rows(rows_view(rows, 2), slots, big));
  std::vector<float> back(2 * kHeadDim);
  SPARSE_SWA_EXPECT_OK(decode_kv_rows(big, slots, out_view(&back, 2)));
  // The same rows through a one-page cache: the bytes land at the 64-bit offsets.
  HostCache small(CacheDtype::kFp8DsMla, B, 1, stride);
  const std::vector<int64_t> small_slots = {17, 63};
  SPARSE_SWA_EXPECT_OK(encode_kv_rows(rows_view(rows, 2), small_slots, small.view()));
  const uint8_t* base = static_cast<uint8_t*>(mem);
  EXPECT_EQ(std::memcmp(base + 60000LL * stride + 17 * 576, small.bytes() + 17 * 576, 576), 0);
  EXPECT_EQ(std::memcmp(base + 60000LL * stride + 64 * 576 + 17 * 8,
                        small.bytes() + 64 * 576 + 17 * 8, 8),
            0);
  EXPECT_EQ(std::memcmp(base + 61439LL * stride + 63 * 576, small.bytes() + 63 * 576, 576), 0);
  std::vector<float> small_back(2 * kHeadDim);
  SPARSE_SWA_EXPECT_OK(decode_kv_rows(small.view(), small_slots, out_view(&small_back, 2)));
  EXPECT_EQ(std::memcmp(back.data(), small_back.data(), back.size() * sizeof(float)), 0);
  munmap(mem, bytes);
}

// ---- errors ----

TEST(KvCodecErrors, OutOfRangeSlotNamesTheRowAndWritesNothing) {
  HostCache cache(CacheDtype::kFp8DsMla, 32, 4, 19008, 0x5a);
  const std::vector<float> rows = random_rows(3, 7);
  for (int64_t bad : {int64_t{128}, int64_t{-2}, int64_t{1} << 40}) {
    const std::vector<int64_t> slots = {0, bad, 5};
    EXPECT_TRUE(IsInvalidArgument(encode_kv_rows(rows_view(rows, 3), slots, cache.view()),
                                  {"slots[1]: expected -1 or 0..127",
                                   "(num_blocks * block_size = 128), got " + std::to_string(bad)}));
    std::vector<float> back(3 * kHeadDim);
    EXPECT_TRUE(
        IsInvalidArgument(decode_kv_rows(cache.view(), slots, out_view(&back, 3)), {"slots[1]"}));
  }
  for (int64_t i = 0; i < cache.size(); ++i) ASSERT_EQ(cache.bytes()[i], 0x5a) << i;
}

TEST(KvCodecErrors, ShapeProblemsAreNamed) {
  HostCache cache(CacheDtype::kFp8DsMla, 32, 1, 19008);
  std::vector<float> rows = random_rows(2, 8);
  const std::vector<int64_t> slots = {0, 1};
  MatrixView<const float> narrow{rows.data(), 2, 448, 512, MemorySpace::kHost};
  EXPECT_TRUE(IsInvalidArgument(encode_kv_rows(narrow, slots, cache.view()),
                                {"rows.cols: expected 512, got 448"}));
  EXPECT_TRUE(IsInvalidArgument(
      encode_kv_rows(rows_view(rows, 2), std::span<const int64_t>(slots.data(), 1), cache.view()),
      {"slots.size: expected 2 (one per row), got 1"}));
  MatrixView<const float> tight{rows.data(), 2, 512, 256, MemorySpace::kHost};
  EXPECT_TRUE(IsInvalidArgument(encode_kv_rows(tight, slots, cache.view()),
                                {"rows.stride: expected >= cols 512, got 256"}));

  KvCacheView v = cache.view();
  v.page_stride_bytes = 32 * 584 - 16;
  EXPECT_TRUE(IsInvalidArgument(encode_kv_rows(rows_view(rows, 2), slots, v),
                                {"cache.page_stride_bytes: expected >= 18688 (block_size 32 * 584 "
                                 "bytes of fp8_ds_mla), got 18672"}));
  v = cache.view();
  v.page_stride_bytes = 19000;
  EXPECT_TRUE(
      IsInvalidArgument(check_kv_cache_view(v, "swa_cache"),
                        {"swa_cache.page_stride_bytes: expected a multiple of 16, got 19000"}));
  v = cache.view();
  v.data = cache.bytes() + 4;
  EXPECT_TRUE(IsInvalidArgument(check_kv_cache_view(v, "swa_cache"),
                                {"swa_cache.data: expected 16-byte alignment"}));
  v = cache.view();
  v.block_size = 0;
  EXPECT_TRUE(
      IsInvalidArgument(check_kv_cache_view(v, "c"), {"c.block_size: expected >= 1, got 0"}));
  v = cache.view();
  v.num_blocks = -1;
  EXPECT_TRUE(
      IsInvalidArgument(check_kv_cache_view(v, "c"), {"c.num_blocks: expected >= 0, got -1"}));
  v = cache.view();
  v.data = nullptr;
  EXPECT_TRUE(IsInvalidArgument(check_kv_cache_view(v, "c"), {"c.data: null with 1 blocks"}));
  v = cache.view();
  v.num_blocks = std::numeric_limits<int64_t>::max() / 1000;
  EXPECT_TRUE(IsInvalidArgument(check_kv_cache_view(v, "c"), {"overflows int64"}));

  MatrixView<const float> device_rows{rows.data(), 2, 512, 512, MemorySpace::kDevice};
  EXPECT_TRUE(
      IsInvalidArgument(encode_kv_rows(device_rows, slots, cache.view()),
                        {"rows.space: expected the cache's memory space (host), got device"}));
}

TEST(KvCodecErrors, DeviceCacheNeedsTheCudaBackend) {
  HostCache cache(CacheDtype::kFp8DsMla, 32, 1, 19008);
  KvCacheView v = cache.view();
  v.space = MemorySpace::kDevice;  // a host pointer that claims to be device memory
  std::vector<float> rows = random_rows(1, 9);
  MatrixView<const float> r{rows.data(), 1, 512, 512, MemorySpace::kDevice};
  const std::vector<int64_t> slots = {0};
  const Status s = encode_kv_rows(r, slots, v);
#if SPARSE_SWA_HAS_CUDA
  // The CUDA codec checks every pointer before launching rather than faulting.
  EXPECT_TRUE(s.code() == StatusCode::kUnavailable || IsInvalidArgument(s, {"rows.data"}))
      << s.to_string();
#else
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  EXPECT_NE(s.message().find("SPARSE_SWA_CUDA=ON"), std::string::npos) << s.message();
#endif
}

}  // namespace
}  // namespace sparse_swa
