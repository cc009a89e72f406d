// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the KV cache codec (kv_cache.h), host backend.
//  1. decode_kv_rows over a cache view of fuzzed shape whose pages hold fuzzed bytes, with fuzzed
//     slots and output shape: an error, or every row equal (bit for bit, NaN as NaN) to an
//     independent decoder written from the page layout, and nothing written outside the rows.
//  2. encode_kv_rows of fuzzed floats into a valid cache, then decode: every finite value
//     within the e4m3 / bf16 rounding bound of its tile's scale, skipped slots left untouched.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "sparse_swa/kv_cache.h"

namespace {

using namespace sparse_swa;

constexpr int64_t kMaxCacheBytes = int64_t{4} << 20;
constexpr uint32_t kPoisonBits = 0x7fbadbadu;  // a NaN payload no decoder produces

[[noreturn]] void report(const char* stage, const std::string& detail) {
  std::fprintf(stderr, "fuzz_kv_decode: %s: %s\n", stage, detail.c_str());
  std::abort();
}

template <typename... Parts>
std::string cat(const Parts&... parts) {
  return str_cat(parts...);
}

using fuzz::AlignedBytes;
using fuzz::bits_of;
using fuzz::float_of;

// OCP e4m3 ("fn"): sign, 4 exponent bits (bias 7), 3 mantissa bits, S.1111.111 = NaN.
float e4m3_value(uint8_t code) {
  const int exponent = (code >> 3) & 15, mantissa = code & 7;
  float v;
  if (exponent == 15 && mantissa == 7) {
    v = std::nanf("");
  } else if (exponent == 0) {
    v = std::ldexp(static_cast<float>(mantissa), -9);
  } else {
    v = std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);
  }
  return (code & 0x80) ? -v : v;
}

float bf16_value(const uint8_t* p) { return float_of(uint32_t{p[0]} << 16 | uint32_t{p[1]} << 24); }

// Value d of slot `slot`, from the page layout of kv_cache.h.
float reference_value(const ConstKvCacheView& cache, int64_t slot, int d) {
  const uint8_t* page =
      static_cast<const uint8_t*>(cache.data) + (slot / cache.block_size) * cache.page_stride_bytes;
  const int64_t o = slot % cache.block_size;
  switch (cache.dtype) {
    case CacheDtype::kFp8DsMla: {
      const uint8_t* token = page + o * 576;
      if (d >= 448) return bf16_value(token + 448 + 2 * (d - 448));
      const uint8_t scale = page[int64_t{cache.block_size} * 576 + o * 8 + d / 64];
      const float v = e4m3_value(token[d]);
      return std::isnan(v) ? v : std::ldexp(v, scale - 127);
    }
    case CacheDtype::kBf16:
      return bf16_value(page + o * 1024 + 2 * d);
    case CacheDtype::kFp8E4m3:
      return e4m3_value(page[o * 512 + d]);
  }
  return 0.0f;
}

bool same_value(float a, float b) {
  return std::isnan(a) ? std::isnan(b) : bits_of(a) == bits_of(b);
}

CacheDtype pick_dtype(FuzzedDataProvider& in) {
  // 3 is not a dtype: the checks must reject it by value.
  return static_cast<CacheDtype>(in.ConsumeIntegralInRange<int>(0, 3));
}

void fuzz_decode(FuzzedDataProvider& in) {
  const CacheDtype dtype = pick_dtype(in);
  const bool known = static_cast<int>(dtype) <= 2;
  const int64_t token_bytes = !known ? 1 : cache_token_bytes(dtype);
  const int32_t block_size = in.ConsumeIntegralInRange<int32_t>(-1, 40);
  int64_t num_blocks = in.ConsumeIntegralInRange<int64_t>(-1, 5);
  int64_t stride = std::max<int64_t>(block_size, 0) * token_bytes;
  stride += in.ConsumeIntegralInRange<int64_t>(-2, 4) * 8;  // sometimes short or unaligned
  if (in.ConsumeBool() && in.ConsumeBool()) {
    // Overflow probes: a huge stride or block count (such a view describes no real memory).
    stride = in.ConsumeBool() ? in.ConsumeIntegral<int64_t>() : stride;
    num_blocks = in.ConsumeIntegral<int64_t>();
  }
  const bool misaligned = in.ConsumeBool() && in.ConsumeBool();

  // The documented shape rules (kv_cache.h), checked independently: a view that breaks one must
  // be rejected before anything is read; any other view must describe real memory.
  const __int128 content = static_cast<__int128>(block_size) * token_bytes;
  const bool must_reject =
      !known || num_blocks < 0 || block_size < 1 || stride < content || stride % 16 != 0 ||
      misaligned ||
      static_cast<__int128>(num_blocks) * stride > std::numeric_limits<int64_t>::max();
  const __int128 real_bytes = must_reject ? 0 : static_cast<__int128>(num_blocks) * stride;
  if (real_bytes > kMaxCacheBytes) return;
  const int64_t bytes = static_cast<int64_t>(real_bytes);
  AlignedBytes pages(static_cast<size_t>(bytes) + 16, 0, 0);
  const std::vector<uint8_t> content_bytes = in.ConsumeBytes<uint8_t>(
      in.ConsumeIntegralInRange<size_t>(0, static_cast<size_t>(std::min<int64_t>(bytes, 4096))));
  // Spread the fuzzed bytes over the pages so that every region (codes, RoPE, scales) gets some.
  for (size_t i = 0; i < content_bytes.size(); ++i) {
    pages.data[(i * 131) % static_cast<size_t>(bytes)] = content_bytes[i];
  }
  ConstKvCacheView cache;
  cache.data = misaligned ? pages.data + 4 : pages.data;
  cache.num_blocks = num_blocks;
  cache.block_size = block_size;
  cache.page_stride_bytes = stride;
  cache.dtype = dtype;

  const int64_t num_slots = must_reject ? 0 : num_blocks * block_size;
  const size_t n = in.ConsumeIntegralInRange<size_t>(0, 12);
  std::vector<int64_t> slots(n);
  bool bad_slot = false;
  for (int64_t& s : slots) {
    s = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(-2, num_slots)
                         : in.ConsumeIntegral<int64_t>();
    bad_slot |= s < -1 || s >= num_slots;
  }
  const int64_t rows =
      static_cast<int64_t>(n) + (in.ConsumeBool() ? 0 : in.ConsumeIntegralInRange<int>(-1, 1));
  const int64_t cols = in.ConsumeBool() ? kHeadDim : in.ConsumeIntegralInRange<int64_t>(510, 514);
  const int64_t out_stride = cols + in.ConsumeIntegralInRange<int64_t>(-1, 3);
  const bool bad_out = rows != static_cast<int64_t>(n) || cols != kHeadDim || out_stride < cols;
  const int64_t out_elems = std::max<int64_t>(rows, 0) * std::max<int64_t>(out_stride, 0) + 1;
  std::vector<float> out(out_elems, float_of(kPoisonBits));
  MatrixView<float> view{out.data(), rows, cols, out_stride, MemorySpace::kHost};

  const Status status = decode_kv_rows(cache, slots, view);
  if (!status.ok()) {
    if (status.code() != StatusCode::kInvalidArgument) report("decode", status.to_string());
    for (float v : out) {
      if (bits_of(v) != kPoisonBits) report("decode", "wrote output before failing");
    }
    return;
  }
  if (must_reject) report("decode", "accepted a cache view that breaks the shape rules");
  if (bad_slot) report("decode", "accepted a slot outside [-1, num_slots)");
  if (bad_out) report("decode", "accepted an output view of the wrong shape");
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t d = 0; d < out_stride; ++d) {
      const float got = out[i * out_stride + d];
      if (d >= kHeadDim) {
        if (bits_of(got) != kPoisonBits) report("decode", cat("row ", i, " written past 512"));
        continue;
      }
      const float want =
          slots[i] == -1 ? 0.0f : reference_value(cache, slots[i], static_cast<int>(d));
      if (!same_value(got, want) || (slots[i] == -1 && bits_of(got) != 0)) {
        report("decode", cat("row ", i, " (slot ", slots[i], ", ", cache_dtype_name(dtype),
                             ") value ", d, ": got ", got, ", expected ", want));
      }
    }
  }
}

// |x - y| bound for one value stored with tile exponent e (fp8_ds_mla NoPE) or bf16.
bool within_e4m3(float x, float y, int e) {
  const double tol = std::max(std::fabs(double{x}) / 16.0, std::ldexp(1.0, e - 10)) * 1.0001;
  return std::fabs(double{x} - y) <= tol;
}
bool within_bf16(float x, float y) {
  // Relative 2^-8 for normals; half the smallest bf16 subnormal (2^-134) below that.
  const double tol = std::max(std::fabs(double{x}) / 256.0 * 1.0001, std::ldexp(1.0, -134));
  return std::fabs(double{x} - y) <= tol;
}

void fuzz_round_trip(FuzzedDataProvider& in) {
  const CacheDtype dtype = static_cast<CacheDtype>(in.ConsumeIntegralInRange<int>(0, 2));
  const int32_t block_size = in.ConsumeIntegralInRange<int32_t>(1, 4);
  const int64_t num_blocks = in.ConsumeIntegralInRange<int64_t>(1, 3);
  const int64_t stride = (int64_t{block_size} * cache_token_bytes(dtype) + 15) / 16 * 16 +
                         16 * in.ConsumeIntegralInRange<int>(0, 2);
  AlignedBytes pages(static_cast<size_t>(num_blocks * stride), 0, 0xA5);
  KvCacheView cache{pages.data, num_blocks, block_size, stride, dtype, MemorySpace::kHost};

  const int64_t num_slots = num_blocks * block_size;
  const int64_t rows = in.ConsumeIntegralInRange<int64_t>(0, 4);
  std::vector<float> x(rows * kHeadDim);
  const int mode = in.ConsumeIntegralInRange<int>(0, 2);  // small, wide-range or raw bits
  for (float& v : x) {
    if (mode == 0) {
      v = static_cast<float>(in.ConsumeIntegralInRange<int>(-2000, 2000)) / 64.0f;
    } else if (mode == 1) {
      v = std::ldexp(static_cast<float>(in.ConsumeIntegralInRange<int>(-255, 255)),
                     in.ConsumeIntegralInRange<int>(-140, 120));
    } else {
      v = float_of(in.ConsumeIntegral<uint32_t>());
    }
  }
  std::vector<int64_t> slots(rows);
  for (int64_t& s : slots) s = in.ConsumeIntegralInRange<int64_t>(-1, num_slots - 1);
  const Status enc = encode_kv_rows(
      MatrixView<const float>{x.data(), rows, kHeadDim, kHeadDim, MemorySpace::kHost}, slots,
      cache);
  if (!enc.ok()) report("encode", enc.to_string());

  std::map<int64_t, int64_t> last_row;  // slot -> the row that wrote it last
  for (int64_t i = 0; i < rows; ++i) {
    if (slots[i] >= 0) last_row[slots[i]] = i;
  }
  std::vector<int64_t> all(num_slots);
  for (int64_t s = 0; s < num_slots; ++s) all[s] = s;
  std::vector<float> y(num_slots * kHeadDim);
  const Status dec = decode_kv_rows(
      cache, all, MatrixView<float>{y.data(), num_slots, kHeadDim, kHeadDim, MemorySpace::kHost});
  if (!dec.ok()) report("round trip decode", dec.to_string());
  for (int64_t s = 0; s < num_slots; ++s) {
    const uint8_t* page = pages.data + (s / block_size) * stride;
    const int64_t o = s % block_size;
    const auto it = last_row.find(s);
    if (it == last_row.end()) {  // never written: still the fill pattern
      const int64_t tb = cache_token_bytes(dtype) == 584 ? 576 : cache_token_bytes(dtype);
      for (int64_t k = 0; k < tb; ++k) {
        if (page[o * tb + k] != 0xA5) report("encode", cat("slot ", s, " written but skipped"));
      }
      continue;
    }
    const float* src = &x[it->second * kHeadDim];
    const float* got = &y[s * kHeadDim];
    for (int d = 0; d < kHeadDim; ++d) {
      const float v = src[d];
      if (std::isnan(v)) {
        if (!std::isnan(got[d])) report("round trip", cat("slot ", s, "[", d, "]: NaN lost"));
        continue;
      }
      bool ok = true;
      if (dtype == CacheDtype::kFp8DsMla && d < kNopeDim) {
        const float* tile = src + d / kQuantTile * kQuantTile;
        bool finite_tile = true;
        for (int k = 0; k < kQuantTile; ++k) finite_tile &= std::isfinite(tile[k]);
        if (!finite_tile) continue;  // an inf scale flushes the tile's neighbours (documented)
        const uint8_t scale = page[int64_t{block_size} * 576 + o * 8 + d / kQuantTile];
        ok = within_e4m3(v, got[d], scale - 127);
      } else if (dtype == CacheDtype::kFp8E4m3) {
        if (!std::isfinite(v) || std::fabs(v) >= 448.0f) {
          ok = std::fabs(got[d]) == 448.0f && std::signbit(got[d]) == std::signbit(v);
        } else {
          ok = within_e4m3(v, got[d], 0);
        }
      } else {
        if (!std::isfinite(v) || std::fabs(v) > 3.38e38f) continue;  // may round to inf
        ok = within_bf16(v, got[d]);
      }
      if (!ok) {
        report("round trip", cat(cache_dtype_name(dtype), " slot ", s, "[", d, "]: stored ", v,
                                 ", read back ", got[d]));
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  if (in.ConsumeBool()) {
    fuzz_decode(in);
  } else {
    fuzz_round_trip(in);
  }
  return 0;
}
