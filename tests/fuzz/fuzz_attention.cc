// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the sparse attention front end (attention.h), CPU backend. Each input
// picks token and head counts, q, one or two cache views (dtype, block size, page stride,
// alignment, block count), index views (rows, width, stride, lens, values including < -1 and
// >= num_slots), sinks, scale, null pointers and memory spaces, all within a small memory bound.
// The documented rules (attention.h, index_view.h, kv_cache.h) are re-derived here: a call that
// breaks one must return INVALID_ARGUMENT (UNAVAILABLE when every view claims device memory on a
// CPU-only build) with out and lse untouched; any other call must succeed, write exactly
// out [T, H, 512] and lse [T, H], and agree with an independent softmax over keys read back with
// decode_kv_rows (within bf16 rounding) whenever the keys and q are finite and moderate.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "sparse_swa/attention.h"

namespace {

using namespace sparse_swa;

constexpr int64_t kMaxCacheBytes = int64_t{1} << 18;  // per cache
constexpr int64_t kMaxTokenHeads = 32;                // T * H of a call that runs
constexpr int64_t kMaxIndexElements = 4096;           // per index view
constexpr uint16_t kPoisonBf16 = 0x7fa5;              // a NaN the reference never writes
constexpr uint32_t kPoisonLse = 0x7fbadbadu;

[[noreturn]] void report(const char* stage, const std::string& detail) {
  std::fprintf(stderr, "fuzz_attention: %s: %s\n", stage, detail.c_str());
  std::abort();
}

using fuzz::AlignedBytes;
using fuzz::bits_of;
using fuzz::float_of;
using fuzz::rare;
using fuzz::Rng;
float bf16_float(uint16_t b) { return float_of(uint32_t{b} << 16); }

// A cache view over owned pages; `breaks_rules` when the view violates kv_cache.h's shape rules.
struct Cache {
  std::unique_ptr<AlignedBytes> pages;
  ConstKvCacheView view;
  bool breaks_rules = false;
  bool too_big = false;  // a rule-abiding view larger than the pages: the input is skipped
  int64_t num_slots = 0;
};

std::unique_ptr<Cache> make_cache(FuzzedDataProvider& in, bool fill_by_encoding) {
  auto c = std::make_unique<Cache>();
  const int dtype_code = in.ConsumeIntegralInRange<int>(0, 3);  // 3 is not a dtype
  const bool known = dtype_code <= 2;
  const CacheDtype dtype = static_cast<CacheDtype>(dtype_code);
  const int64_t tb = known ? fuzz::layout_token_bytes(dtype) : 512;
  int32_t block_size = in.ConsumeBool() ? in.ConsumeIntegralInRange<int32_t>(1, 8)
                                        : in.ConsumeIntegralInRange<int32_t>(-2, 64);
  int64_t num_blocks = in.ConsumeIntegralInRange<int64_t>(-1, 6);
  int64_t stride = (std::max<int64_t>(block_size, 0) * tb + 15) / 16 * 16;
  stride += rare(in, 0.2f) ? 8 * in.ConsumeIntegralInRange<int64_t>(-3, 4)  // short or unaligned
                           : 16 * in.ConsumeIntegralInRange<int64_t>(0, 3);
  if (rare(in, 0.05f)) {  // overflow probes (no real memory behind them)
    num_blocks = in.ConsumeIntegral<int64_t>();
    if (in.ConsumeBool()) stride = in.ConsumeIntegral<int64_t>();
  }
  const int misalign = rare(in, 0.05f) ? 8 : 0;
  const __int128 content = static_cast<__int128>(block_size) * tb;
  c->breaks_rules = !known || num_blocks < 0 || block_size < 1 || stride < content ||
                    stride % 16 != 0 || misalign != 0 ||
                    static_cast<__int128>(num_blocks) * stride > INT64_MAX ||
                    static_cast<__int128>(num_blocks) * block_size > INT64_MAX;
  const __int128 bytes = c->breaks_rules ? 0 : static_cast<__int128>(num_blocks) * stride;
  c->too_big = bytes > kMaxCacheBytes;
  const size_t real = c->too_big ? 0 : static_cast<size_t>(bytes);
  c->pages = std::make_unique<AlignedBytes>(real, 64, 0);  // views may be offset
  const bool null_data = num_blocks > 0 && rare(in, 0.03f);
  c->breaks_rules |= null_data;
  c->view.data = null_data ? nullptr : c->pages->data + misalign;
  c->view.num_blocks = num_blocks;
  c->view.block_size = block_size;
  c->view.page_stride_bytes = stride;
  c->view.dtype = dtype;
  c->num_slots = c->breaks_rules ? 0 : num_blocks * block_size;
  if (c->breaks_rules || c->too_big || real == 0) return c;
  if (fill_by_encoding) {
    // Moderate finite keys through the codec: the reference check below applies.
    const int64_t n = c->num_slots;
    std::vector<float> rows(n * kHeadDim);
    Rng rng{in.ConsumeIntegral<uint64_t>()};
    for (float& v : rows) v = static_cast<float>(rng.uniform(-512, 512)) / 128;
    std::vector<int64_t> slots(n);
    for (int64_t s = 0; s < n; ++s) slots[s] = s;
    KvCacheView w{c->pages->data, num_blocks, block_size, stride, dtype, MemorySpace::kHost};
    const Status s =
        encode_kv_rows({rows.data(), n, kHeadDim, kHeadDim, MemorySpace::kHost}, slots, w);
    if (!s.ok()) report("encode", s.to_string());
  } else {
    Rng rng{in.ConsumeIntegral<uint64_t>()};
    for (size_t i = 0; i < real; i += 4) {
      const uint32_t r = rng.next();
      std::memcpy(c->pages->data + i, &r, std::min<size_t>(4, real - i));
    }
  }
  return c;
}

// An index view of `rows` rows (the claimed count may differ from the allocation only when a
// rule is broken); `bad_values` counts entries inside lens that are neither -1 nor a slot.
struct Indices {
  std::vector<int32_t> data, lens;
  ConstIndexView view;
  bool breaks_rules = false;
  bool too_big = false;
  bool bad_values = false;
};

std::unique_ptr<Indices> make_indices(FuzzedDataProvider& in, int64_t num_tokens,
                                      int64_t num_slots) {
  auto x = std::make_unique<Indices>();
  int64_t rows = num_tokens;
  if (rare(in, 0.05f)) rows += in.ConsumeIntegralInRange<int>(-2, 2);
  int32_t width = in.ConsumeIntegralInRange<int32_t>(0, 24);
  if (rare(in, 0.03f)) width = in.ConsumeIntegral<int32_t>();
  int64_t stride = int64_t{width} + in.ConsumeIntegralInRange<int64_t>(0, 3);
  if (rare(in, 0.03f)) stride = int64_t{width} - in.ConsumeIntegralInRange<int>(1, 3);
  x->breaks_rules = rows != num_tokens || rows < 0 || width < 0 || stride < width;
  const int64_t alloc_rows = std::clamp<int64_t>(rows, 0, 64);
  const __int128 elems = static_cast<__int128>(alloc_rows) * std::max<int64_t>(stride, 0);
  // A host view's lens are read whatever else is wrong: they always exist for the claimed rows.
  x->too_big = rows > 64 || elems > kMaxIndexElements;
  if (x->too_big) return x;
  x->data.resize(static_cast<size_t>(elems) + 1);
  x->lens.resize(alloc_rows + 1);
  for (int64_t t = 0; t < alloc_rows; ++t) {
    int32_t len = width > 0 ? in.ConsumeIntegralInRange<int32_t>(0, width) : 0;
    if (rare(in, 0.03f)) {  // lens just outside [0, width]
      const int64_t near =
          int64_t{in.ConsumeIntegralInRange<int32_t>(-3, 3)} + (in.ConsumeBool() ? width : 0);
      len = static_cast<int32_t>(std::clamp<int64_t>(near, INT32_MIN, INT32_MAX));
    }
    x->lens[t] = len;
    if (len < 0 || len > width) x->breaks_rules = true;
    for (int64_t j = 0; j < std::max<int64_t>(stride, 0); ++j) {
      int32_t v;
      const int kind = in.ConsumeIntegralInRange<int>(0, 15);
      if (kind == 0) {
        v = -1;
      } else if (kind == 1) {
        v = in.ConsumeIntegral<int32_t>();
      } else if (kind == 2) {  // next to the slot count, in int64 (it may be INT32_MAX)
        const int64_t near =
            std::min<int64_t>(num_slots, INT32_MAX) + in.ConsumeIntegralInRange<int32_t>(-1, 1);
        v = static_cast<int32_t>(std::min<int64_t>(near, INT32_MAX));
      } else {
        v = num_slots > 0 ? static_cast<int32_t>(in.ConsumeIntegralInRange<int64_t>(
                                0, std::min<int64_t>(num_slots - 1, INT32_MAX)))
                          : -1;
      }
      x->data[t * stride + j] = v;
      if (j < len && len <= width && (v < -1 || v >= num_slots)) x->bad_values = true;
    }
  }
  const bool null_ptr = rows > 0 && rare(in, 0.03f);
  x->breaks_rules |= null_ptr;
  x->view = {null_ptr ? nullptr : x->data.data(),
             x->lens.data(),
             rows,
             width,
             stride,
             0,
             MemorySpace::kHost};
  return x;
}

// The expected outputs of token t, head h, from keys decoded with the codec (double).
struct Expected {
  bool checkable = true;
  std::vector<double> out;
  double lse = 0;
  double magnitude = 0;  // sum of |w_i| |K_i[d]| max over d, for the summation-order bound
};

Expected expected_head(const SparseAttentionParams& p, int64_t t, int32_t h) {
  Expected e;
  e.out.assign(kHeadDim, 0.0);
  std::vector<std::vector<float>> keys;
  const ConstIndexView* views[2] = {&p.swa_indices, &p.extra_indices};
  const ConstKvCacheView* caches[2] = {&p.swa_cache, &p.extra_cache};
  for (int s = 0; s < (p.extra_indices.rows != 0 ? 2 : 1); ++s) {
    for (int32_t j = 0; j < views[s]->lens[t]; ++j) {
      const int64_t slot = views[s]->row(t)[j];
      if (slot < 0) continue;
      std::vector<float> k(kHeadDim);
      const int64_t one = slot;
      const Status st = decode_kv_rows(*caches[s], std::span<const int64_t>(&one, 1),
                                       {k.data(), 1, kHeadDim, kHeadDim, MemorySpace::kHost});
      if (!st.ok()) report("decode_kv_rows", st.to_string());
      for (float v : k) e.checkable &= std::isfinite(v) && std::fabs(v) <= 1e12f;
      keys.push_back(std::move(k));
    }
  }
  const uint16_t* q = p.q + (t * p.num_heads + h) * kHeadDim;
  for (int d = 0; d < kHeadDim; ++d) {
    const float v = bf16_float(q[d]);
    e.checkable &= std::isfinite(v) && std::fabs(v) <= 1e12f;
  }
  if (!e.checkable) return e;
  if (keys.empty()) {
    e.lse = std::numeric_limits<double>::infinity();
    return e;
  }
  std::vector<double> score(keys.size());
  double max_score = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < keys.size(); ++i) {
    double dot = 0;
    for (int d = 0; d < kHeadDim; ++d) dot += double{bf16_float(q[d])} * keys[i][d];
    score[i] = double{p.softmax_scale} * dot;
    max_score = std::max(max_score, score[i]);
  }
  double sum = 0;
  std::vector<double> w(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) sum += w[i] = std::exp(score[i] - max_score);
  e.lse = max_score + std::log(sum);
  double factor = 1.0 / sum;
  if (p.sinks != nullptr) factor /= 1.0 + std::exp(double{p.sinks[h]} - e.lse);
  for (int d = 0; d < kHeadDim; ++d) {
    double acc = 0, mag = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      acc += w[i] * keys[i][d];
      mag += w[i] * std::fabs(double{keys[i][d]});
    }
    e.out[d] = acc * factor;
    e.magnitude = std::max(e.magnitude, mag * factor);
  }
  // Scores far apart make exp() of the differences sensitive to the last bit of the dot.
  e.checkable = std::isfinite(e.lse) || keys.empty();
  return e;
}

void compare(const SparseAttentionParams& p) {
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    for (int32_t h = 0; h < p.num_heads; ++h) {
      const Expected e = expected_head(p, t, h);
      if (!e.checkable) continue;
      const float lse = p.lse[t * p.num_heads + h];
      if (std::isinf(e.lse)) {
        if (!(std::isinf(lse) && lse > 0))
          report("lse", str_cat("token ", t, " head ", h, ": no keys, got ", lse));
      } else if (std::fabs(e.lse) > std::numeric_limits<float>::max()) {
        // A huge scale puts lse past the float range: it rounds to the infinity of its sign.
        if (!(std::isinf(lse) && (lse > 0) == (e.lse > 0))) {
          report("lse", str_cat("token ", t, " head ", h, ": got ", lse, ", expected ", e.lse,
                                " (rounded to float: an infinity)"));
        }
      } else if (!(std::fabs(lse - e.lse) <= 1e-5 * std::max(1.0, std::fabs(e.lse)))) {
        report("lse", str_cat("token ", t, " head ", h, ": got ", lse, ", expected ", e.lse));
      }
      for (int d = 0; d < kHeadDim; ++d) {
        const double got = bf16_float(p.out[(t * p.num_heads + h) * kHeadDim + d]);
        const double want = e.out[d];
        const double tol = std::fabs(want) / 256 + 1e-9 * e.magnitude + 1e-30;
        if (!(std::fabs(got - want) <= tol)) {
          report("out", str_cat("token ", t, " head ", h, " value ", d, ": got ", got,
                                ", expected ", want));
        }
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const bool encoded = in.ConsumeBool();  // keys written by the codec, else raw page bytes
  SparseAttentionParams p;
  p.num_tokens = in.ConsumeIntegralInRange<int64_t>(0, 4);
  p.num_heads = in.ConsumeBool() ? in.ConsumeIntegralInRange<int32_t>(1, 4)
                                 : in.ConsumeIntegralInRange<int32_t>(1, 128);
  bool breaks_rules = false;
  if (rare(in, 0.05f)) {  // counts outside the documented ranges
    p.num_tokens = in.ConsumeBool() ? in.ConsumeIntegral<int64_t>()
                                    : in.ConsumeIntegralInRange<int64_t>(-2, 2);
  }
  if (rare(in, 0.05f)) p.num_heads = in.ConsumeIntegral<int32_t>();
  breaks_rules |= p.num_tokens < 0 || p.num_heads < 1 || p.num_heads > kMaxAttentionHeads;
  const bool counts_ok = !breaks_rules && p.num_tokens <= 64;
  if (counts_ok && p.num_tokens * p.num_heads > kMaxTokenHeads) p.num_heads = 1;

  auto swa = make_cache(in, encoded);
  const bool with_extra = in.ConsumeBool();
  auto extra = with_extra ? make_cache(in, encoded) : nullptr;
  const int64_t t_rows = counts_ok ? p.num_tokens : 0;
  auto swa_idx = make_indices(in, t_rows, swa->num_slots);
  auto extra_idx = with_extra ? make_indices(in, t_rows, extra->num_slots) : nullptr;
  if (swa_idx->too_big || (with_extra && extra_idx->too_big)) return 0;
  p.swa_cache = swa->view;
  p.swa_indices = swa_idx->view;
  if (with_extra) {
    p.extra_cache = extra->view;
    p.extra_indices = extra_idx->view;
  }
  if (!counts_ok) {
    // Index views as for zero tokens: rows != num_tokens unless the count is 0 after all.
    breaks_rules |= p.num_tokens != 0;
  } else {
    breaks_rules |= swa_idx->breaks_rules || swa->breaks_rules;
    // extra_indices.rows == 0 means no second segment: its cache is not looked at.
    if (with_extra && extra_idx->view.rows != 0) {
      breaks_rules |= extra_idx->breaks_rules || extra->breaks_rules;
    }
  }
  const bool extra_used = with_extra && p.extra_indices.rows != 0;
  if (!breaks_rules && (swa->too_big || (extra_used && extra->too_big))) return 0;

  // q, sinks, scale and the outputs.
  const int64_t th = counts_ok ? p.num_tokens * p.num_heads : 0;
  std::vector<uint16_t> q(th * kHeadDim + 1);
  const bool raw_q = rare(in, 0.2f);  // any bf16 bits, NaN and inf included
  Rng q_rng{in.ConsumeIntegral<uint64_t>()};
  for (uint16_t& v : q) {
    const float f = static_cast<float>(q_rng.uniform(-256, 256)) / 64;
    // Exact in bf16: at most 9 significant bits.
    v = raw_q ? static_cast<uint16_t>(q_rng.next()) : static_cast<uint16_t>(bits_of(f) >> 16);
  }
  std::vector<float> sinks(std::max<int32_t>(counts_ok ? p.num_heads : 0, 0) + 1);
  for (float& s : sinks) s = static_cast<float>(in.ConsumeIntegralInRange<int>(-40, 40)) / 8;
  if (in.ConsumeBool()) p.sinks = sinks.data();
  if (in.ConsumeBool()) {
    p.softmax_scale = rare(in, 0.1f)
                          ? float_of(in.ConsumeIntegral<uint32_t>())
                          : static_cast<float>(in.ConsumeIntegralInRange<int>(-64, 64)) / 256;
  }
  breaks_rules |= !std::isfinite(p.softmax_scale);
  std::vector<uint16_t> out(th * kHeadDim + 16, kPoisonBf16);
  std::vector<float> lse(th + 16, float_of(kPoisonLse));
  p.q = q.data();
  p.out = out.data();
  p.lse = lse.data();
  if (p.num_tokens > 0 && rare(in, 0.05f)) {
    switch (in.ConsumeIntegralInRange<int>(0, 2)) {
      case 0:
        p.q = nullptr;
        break;
      case 1:
        p.out = nullptr;
        break;
      default:
        p.lse = nullptr;
        break;
    }
    breaks_rules = true;
  }
  // Memory spaces: one view on the device (a mismatch), or every view there.
  const int space_mode = rare(in, 0.05f) ? in.ConsumeIntegralInRange<int>(1, 4) : 0;
  bool all_device = false;
  if (space_mode == 1) p.swa_cache.space = MemorySpace::kDevice;
  if (space_mode == 2) p.swa_indices.space = MemorySpace::kDevice;
  if (space_mode == 3 && extra_used) p.extra_cache.space = MemorySpace::kDevice;
  if (space_mode == 4) {
    all_device = true;
    p.swa_cache.space = p.swa_indices.space = MemorySpace::kDevice;
    p.extra_cache.space = p.extra_indices.space = MemorySpace::kDevice;
  }
  breaks_rules |= (space_mode >= 1 && space_mode <= 2) || (space_mode == 3 && extra_used);
  const bool bad_values =
      !breaks_rules && (swa_idx->bad_values || (extra_used && extra_idx->bad_values));

  const Status s = sparse_attention(p);
  const auto untouched = [&] {
    return std::all_of(out.begin(), out.end(), [](uint16_t v) { return v == kPoisonBf16; }) &&
           std::all_of(lse.begin(), lse.end(), [](float v) { return bits_of(v) == kPoisonLse; });
  };
  if (!s.ok()) {
    const bool unavailable_ok = all_device && s.code() == StatusCode::kUnavailable;
    if (s.code() != StatusCode::kInvalidArgument && !unavailable_ok) {
      report("status", "expected INVALID_ARGUMENT, got " + s.to_string());
    }
    if (s.message().empty()) report("status", "an error without a message");
    if (!untouched()) report("status", "wrote out / lse before failing");
    if (!breaks_rules && !bad_values && !all_device) {
      report("status", "rejected a call that keeps every rule: " + s.to_string());
    }
    return 0;
  }
  if (all_device) report("status", "device views ran on a CPU-only build");
  if (breaks_rules) report("status", "accepted a call that breaks a documented rule");
  if (bad_values) report("status", "accepted an index that is neither -1 nor a slot");
  for (size_t i = th * kHeadDim; i < out.size(); ++i) {
    if (out[i] != kPoisonBf16) report("out", "written past [T, H, 512]");
  }
  for (size_t i = th; i < lse.size(); ++i) {
    if (bits_of(lse[i]) != kPoisonLse) report("lse", "written past [T, H]");
  }
  compare(p);
  return 0;
}
