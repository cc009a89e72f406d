// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the KV codec front end (kv_cache.h), host backend: encode_kv_rows,
// encode_kv_rows_bf16 and decode_kv_rows with fuzzed cache views (dtype, block size, page
// stride, alignment, block count, null data), row views (rows, cols, stride, null data), slots
// (count, values, duplicates, null data) and memory spaces, within a small memory bound.
// The documented rules are re-derived here: a call that breaks one must return INVALID_ARGUMENT
// (UNAVAILABLE when every array claims device memory on a CPU-only build) and write nothing; any
// other call must succeed and
//   * encode: change only the bytes of the slots it was given (token bytes, plus the scale bytes
//     of fp8_ds_mla), each slot holding exactly what encoding its row alone gives;
//     encode_kv_rows_bf16 writes the same bytes as encode_kv_rows of the rows widened to float;
//   * decode: write only columns [0, 512) of each out row, equal bit for bit (NaN as NaN) to a
//     one-slot decode into a contiguous row, zeros for slot -1.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "sparse_swa/kv_cache.h"

namespace {

using namespace sparse_swa;

constexpr int64_t kMaxCacheBytes = int64_t{1} << 18;
constexpr uint8_t kPoisonByte = 0xA5;
constexpr uint32_t kPoisonBits = 0x7fbadbadu;

[[noreturn]] void report(const char* stage, const std::string& detail) {
  std::fprintf(stderr, "fuzz_kv_codec: %s: %s\n", stage, detail.c_str());
  std::abort();
}

using fuzz::AlignedBytes;
using fuzz::bits_of;
using fuzz::float_of;
using fuzz::rare;
using fuzz::Rng;

struct Cache {
  std::unique_ptr<AlignedBytes> pages;
  KvCacheView view;
  bool breaks_rules = false;
  bool too_big = false;
  int64_t num_slots = 0;
};

Cache make_cache(FuzzedDataProvider& in) {
  Cache c;
  const int dtype_code = in.ConsumeIntegralInRange<int>(0, 3);  // 3 is not a dtype
  const bool known = dtype_code <= 2;
  const CacheDtype dtype = static_cast<CacheDtype>(dtype_code);
  const int64_t tb = known ? fuzz::layout_token_bytes(dtype) : 512;
  const int32_t block_size = in.ConsumeBool() ? in.ConsumeIntegralInRange<int32_t>(1, 6)
                                              : in.ConsumeIntegralInRange<int32_t>(-2, 64);
  int64_t num_blocks = in.ConsumeIntegralInRange<int64_t>(-1, 5);
  int64_t stride = (std::max<int64_t>(block_size, 0) * tb + 15) / 16 * 16;
  stride += rare(in, 0.2f) ? 8 * in.ConsumeIntegralInRange<int64_t>(-3, 6)  // short or unaligned
                           : 16 * in.ConsumeIntegralInRange<int64_t>(0, 3);
  if (rare(in, 0.05f)) {
    num_blocks = in.ConsumeIntegral<int64_t>();
    if (in.ConsumeBool()) stride = in.ConsumeIntegral<int64_t>();
  }
  const int misalign = rare(in, 0.05f) ? 4 * in.ConsumeIntegralInRange<int>(1, 3) : 0;
  const __int128 content = static_cast<__int128>(block_size) * tb;
  c.breaks_rules = !known || num_blocks < 0 || block_size < 1 || stride < content ||
                   stride % 16 != 0 || misalign != 0 ||
                   static_cast<__int128>(num_blocks) * stride > INT64_MAX ||
                   static_cast<__int128>(num_blocks) * block_size > INT64_MAX;
  const __int128 bytes = c.breaks_rules ? 0 : static_cast<__int128>(num_blocks) * stride;
  c.too_big = bytes > kMaxCacheBytes;
  const size_t real = c.too_big ? 0 : static_cast<size_t>(bytes);
  c.pages = std::make_unique<AlignedBytes>(real, 64, kPoisonByte);
  Rng rng{in.ConsumeIntegral<uint64_t>()};  // old page contents: encode must keep the others
  for (size_t i = 0; i < real; i += 4) {
    const uint32_t r = rng.next();
    std::memcpy(c.pages->data + i, &r, std::min<size_t>(4, real - i));
  }
  const bool null_data = num_blocks > 0 && rare(in, 0.03f);
  c.breaks_rules |= null_data;
  c.view = {null_data ? nullptr : c.pages->data + misalign,
            num_blocks,
            block_size,
            stride,
            dtype,
            MemorySpace::kHost};
  c.num_slots = c.breaks_rules ? 0 : num_blocks * block_size;
  return c;
}

// Slots [n]: mostly real slots and -1, sometimes anything.
std::vector<int64_t> make_slots(FuzzedDataProvider& in, size_t n, int64_t num_slots,
                                bool* bad_value) {
  std::vector<int64_t> slots(n);
  for (int64_t& s : slots) {
    const int kind = in.ConsumeIntegralInRange<int>(0, 9);
    if (kind == 0) {
      s = -1;
    } else if (kind == 1) {
      s = in.ConsumeIntegral<int64_t>();
    } else if (kind == 2) {
      s = num_slots + in.ConsumeIntegralInRange<int64_t>(-1, 1);
    } else {
      s = num_slots > 0 ? in.ConsumeIntegralInRange<int64_t>(0, num_slots - 1) : -1;
    }
    *bad_value |= s < -1 || s >= num_slots;
  }
  return slots;
}

// The byte ranges of slot s: its token bytes, and its 8 scale bytes for fp8_ds_mla.
std::vector<std::pair<int64_t, int64_t>> slot_ranges(const KvCacheView& c, int64_t s) {
  const int64_t page = s / c.block_size * c.page_stride_bytes, o = s % c.block_size;
  if (c.dtype == CacheDtype::kFp8DsMla) {
    return {{page + o * 576, page + o * 576 + 576},
            {page + int64_t{c.block_size} * 576 + o * 8,
             page + int64_t{c.block_size} * 576 + o * 8 + 8}};
  }
  const int64_t tb = fuzz::layout_token_bytes(c.dtype);
  return {{page + o * tb, page + o * tb + tb}};
}

struct RowView {
  int64_t rows = 0, cols = 0, stride = 0;
  bool null_data = false;
  bool breaks_rules = false;
  bool too_big = false;
};

RowView make_row_view(FuzzedDataProvider& in, size_t num_slots) {
  RowView r;
  r.rows = static_cast<int64_t>(num_slots);
  if (rare(in, 0.05f)) r.rows += in.ConsumeIntegralInRange<int>(-2, 2);
  r.cols = in.ConsumeProbability<float>() < 0.9f ? kHeadDim
                                                 : in.ConsumeIntegralInRange<int64_t>(509, 515);
  r.stride = r.cols + (in.ConsumeBool() ? 0 : in.ConsumeIntegralInRange<int64_t>(-2, 5));
  if (rare(in, 0.02f)) r.stride = in.ConsumeIntegral<int64_t>();
  r.null_data = r.rows > 0 && rare(in, 0.03f);
  r.breaks_rules = r.rows != static_cast<int64_t>(num_slots) || r.rows < 0 || r.cols != kHeadDim ||
                   r.stride < r.cols || r.null_data;
  r.too_big = static_cast<__int128>(std::max<int64_t>(r.rows, 0)) * r.stride > (1 << 16);
  return r;
}

void expect_rejected(const Status& s, bool all_device, const char* stage) {
  if (s.code() == StatusCode::kInvalidArgument && !s.message().empty()) return;
  if (all_device && s.code() == StatusCode::kUnavailable) return;
  report(stage, "expected INVALID_ARGUMENT, got " + s.to_string());
}

// One encode (float or bf16 rows) with fuzzed arguments.
void fuzz_encode(FuzzedDataProvider& in, bool bf16) {
  Cache c = make_cache(in);
  const size_t n = in.ConsumeIntegralInRange<size_t>(0, 8);
  bool bad_slot = false;
  std::vector<int64_t> slots = make_slots(in, n, c.num_slots, &bad_slot);
  const bool null_slots = n > 0 && rare(in, 0.03f);
  RowView rv = make_row_view(in, n);
  if (rv.too_big) return;
  const bool breaks_rules = c.breaks_rules || rv.breaks_rules || null_slots;
  if (!breaks_rules && c.too_big) return;
  const int64_t elems = std::max<int64_t>(rv.rows, 0) * std::max<int64_t>(rv.stride, 0) + 1;
  // Values: small, wide-range or raw bits (NaN and inf included).
  std::vector<float> xf(elems);
  std::vector<uint16_t> xb(elems);
  const int mode = in.ConsumeIntegralInRange<int>(0, 2);
  Rng rng{in.ConsumeIntegral<uint64_t>()};
  for (int64_t i = 0; i < elems; ++i) {
    const float v = mode == 2 ? float_of(rng.next())
                              : std::ldexp(static_cast<float>(rng.uniform(-255, 255)),
                                           mode == 0 ? -6 : rng.uniform(-150, 120));
    xb[i] = static_cast<uint16_t>(rng.next() >> 16);
    if (mode != 2) xb[i] = static_cast<uint16_t>(bits_of(v) >> 16);  // truncated: a bf16 value
    xf[i] = bf16 ? float_of(uint32_t{xb[i]} << 16) : v;
  }
  // Spaces: the rows or the cache on the device (a mismatch), or both there.
  const int space_mode = rare(in, 0.05f) ? in.ConsumeIntegralInRange<int>(1, 3) : 0;
  const MemorySpace rows_space = space_mode & 1 ? MemorySpace::kDevice : MemorySpace::kHost;
  KvCacheView view = c.view;
  if (space_mode & 2) view.space = MemorySpace::kDevice;
  const bool all_device = space_mode == 3;
  const bool rejected = breaks_rules || space_mode == 1 || space_mode == 2;

  const std::vector<uint8_t> before = c.pages->copy();
  const std::span<const int64_t> slot_span(null_slots ? nullptr : slots.data(), n);
  const Status s =
      bf16 ? encode_kv_rows_bf16(
                 {rv.null_data ? nullptr : xb.data(), rv.rows, rv.cols, rv.stride, rows_space},
                 slot_span, view)
           : encode_kv_rows(
                 {rv.null_data ? nullptr : xf.data(), rv.rows, rv.cols, rv.stride, rows_space},
                 slot_span, view);
  const char* stage = bf16 ? "encode_kv_rows_bf16" : "encode_kv_rows";
  if (!s.ok()) {
    expect_rejected(s, all_device, stage);
    if (c.pages->copy() != before) report(stage, "wrote the cache before failing");
    if (!rejected && !bad_slot && !all_device) {
      report(stage, "rejected a call that keeps every rule: " + s.to_string());
    }
    return;
  }
  if (all_device) report(stage, "device arrays ran on a CPU-only build");
  if (rejected) report(stage, "accepted a call that breaks a documented rule");
  if (bad_slot) report(stage, "accepted a slot outside [-1, num_slots)");

  // Each slot against a one-row float encode of its last row into a copy of the old cache.
  std::map<int64_t, int64_t> last_row;
  for (size_t i = 0; i < n; ++i) {
    if (slots[i] >= 0) last_row[slots[i]] = static_cast<int64_t>(i);
  }
  AlignedBytes expected(c.pages->size, 64, kPoisonByte);
  std::memcpy(expected.data, before.data(), before.size());
  KvCacheView expected_view = c.view;
  expected_view.data = expected.data;
  for (const auto& [slot, row] : last_row) {
    const int64_t one = slot;
    const Status e =
        encode_kv_rows({xf.data() + row * rv.stride, 1, kHeadDim, kHeadDim, MemorySpace::kHost},
                       std::span<const int64_t>(&one, 1), expected_view);
    if (!e.ok()) report("one-row encode", e.to_string());
  }
  if (std::memcmp(expected.data, c.pages->data, c.pages->bytes) != 0) {
    for (size_t i = 0; i < c.pages->bytes; ++i) {
      if (expected.data[i] != c.pages->data[i]) {
        report(stage,
               str_cat("cache byte ", i, ": got ", int{c.pages->data[i]}, ", expected ",
                       int{expected.data[i]}, " (", n, " rows, ", last_row.size(), " slots)"));
      }
    }
  }
  // Independently of the codec: only the given slots' byte ranges may differ from before.
  std::vector<bool> owned(c.pages->bytes, false);
  for (const auto& [slot, row] : last_row) {
    for (auto [lo, hi] : slot_ranges(c.view, slot)) {
      for (int64_t b = lo; b < hi; ++b) owned[b] = true;
    }
  }
  for (size_t i = 0; i < owned.size(); ++i) {
    if (!owned[i] && c.pages->data[i] != before[i]) {
      report(stage, str_cat("byte ", i, " outside every written slot changed"));
    }
  }
}

void fuzz_decode(FuzzedDataProvider& in) {
  Cache c = make_cache(in);
  const size_t n = in.ConsumeIntegralInRange<size_t>(0, 8);
  bool bad_slot = false;
  std::vector<int64_t> slots = make_slots(in, n, c.num_slots, &bad_slot);
  const bool null_slots = n > 0 && rare(in, 0.03f);
  RowView rv = make_row_view(in, n);
  if (rv.too_big) return;
  const bool breaks_rules = c.breaks_rules || rv.breaks_rules || null_slots;
  if (!breaks_rules && c.too_big) return;
  const int space_mode = rare(in, 0.05f) ? in.ConsumeIntegralInRange<int>(1, 3) : 0;
  ConstKvCacheView view = c.view;
  if (space_mode & 2) view.space = MemorySpace::kDevice;
  const MemorySpace out_space = space_mode & 1 ? MemorySpace::kDevice : MemorySpace::kHost;
  const bool all_device = space_mode == 3;
  const bool rejected = breaks_rules || space_mode == 1 || space_mode == 2;
  const int64_t elems = std::max<int64_t>(rv.rows, 0) * std::max<int64_t>(rv.stride, 0) + 1;
  std::vector<float> out(elems, float_of(kPoisonBits));
  const Status s =
      decode_kv_rows(view, std::span<const int64_t>(null_slots ? nullptr : slots.data(), n),
                     {rv.null_data ? nullptr : out.data(), rv.rows, rv.cols, rv.stride, out_space});
  if (!s.ok()) {
    expect_rejected(s, all_device, "decode_kv_rows");
    for (float v : out) {
      if (bits_of(v) != kPoisonBits) report("decode_kv_rows", "wrote out before failing");
    }
    if (!rejected && !bad_slot && !all_device) {
      report("decode_kv_rows", "rejected a call that keeps every rule: " + s.to_string());
    }
    return;
  }
  if (all_device) report("decode_kv_rows", "device arrays ran on a CPU-only build");
  if (rejected) report("decode_kv_rows", "accepted a call that breaks a documented rule");
  if (bad_slot) report("decode_kv_rows", "accepted a slot outside [-1, num_slots)");
  std::vector<float> one_row(kHeadDim);
  for (size_t i = 0; i < n; ++i) {
    const int64_t one = slots[i];
    const Status e = decode_kv_rows(c.view, std::span<const int64_t>(&one, 1),
                                    {one_row.data(), 1, kHeadDim, kHeadDim, MemorySpace::kHost});
    if (!e.ok()) report("one-row decode", e.to_string());
    for (int64_t d = 0; d < rv.stride; ++d) {
      const float got = out[i * rv.stride + d];
      if (d >= kHeadDim) {
        if (bits_of(got) != kPoisonBits) report("decode_kv_rows", "written past column 512");
        continue;
      }
      const float want = slots[i] == -1 ? 0.0f : one_row[d];
      const bool same = std::isnan(want) ? std::isnan(got) : bits_of(got) == bits_of(want);
      if (!same) {
        report("decode_kv_rows", str_cat("row ", i, " (slot ", slots[i], ") value ", d, ": got ",
                                         got, ", one-row decode ", want));
      }
    }
  }
  if (bits_of(out.back()) != kPoisonBits) report("decode_kv_rows", "written past the rows");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  switch (in.ConsumeIntegralInRange<int>(0, 2)) {
    case 0:
      fuzz_encode(in, /*bf16=*/false);
      break;
    case 1:
      fuzz_encode(in, /*bf16=*/true);
      break;
    default:
      fuzz_decode(in);
      break;
  }
  return 0;
}
