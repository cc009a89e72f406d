// SPDX-License-Identifier: Apache-2.0
// The CPU reference of the sparse attention: hand-checkable cases, dense attention computed
// directly in the test, the mixed single-matrix form, -1 holes, garbage past the length, sinks
// and the error messages.
#include "sparse_swa/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "common/fp8_e4m3.h"
#include "support/status_matchers.h"

namespace sparse_swa {
namespace {

using testing::IsInvalidArgument;

constexpr double kInf = std::numeric_limits<double>::infinity();

// A host cache in 64-byte aligned memory.
class HostCache {
 public:
  HostCache(CacheDtype dtype, int32_t block_size, int64_t num_blocks)
      : stride_(round_up16(block_size * cache_token_bytes(dtype))),
        mem_(static_cast<uint8_t*>(std::aligned_alloc(64, (num_blocks * stride_ + 63) / 64 * 64)),
             &std::free) {
    std::memset(mem_.get(), 0x3c, num_blocks * stride_);
    view_ = {mem_.get(), num_blocks, block_size, stride_, dtype, MemorySpace::kHost};
  }
  const KvCacheView& view() const { return view_; }
  // Encodes `rows` [n, 512] into slots [n].
  void put(const std::vector<float>& rows, const std::vector<int64_t>& slots) {
    const Status s = encode_kv_rows(
        {rows.data(), static_cast<int64_t>(slots.size()), kHeadDim, kHeadDim, MemorySpace::kHost},
        slots, view_);
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
  std::vector<float> get(int64_t slot) const {
    std::vector<float> row(kHeadDim);
    const std::vector<int64_t> slots = {slot};
    EXPECT_TRUE(decode_kv_rows(view_, slots, {row.data(), 1, kHeadDim, kHeadDim}).ok());
    return row;
  }

 private:
  static int64_t round_up16(int64_t x) { return (x + 15) / 16 * 16; }
  int64_t stride_;
  std::unique_ptr<uint8_t, decltype(&std::free)> mem_;
  KvCacheView view_;
};

// Index rows [rows, width] (stride >= width), -1 filled, lens 0.
struct IndexRows {
  IndexRows(int64_t rows, int32_t width, int32_t stride = -1)
      : rows(rows),
        width(width),
        stride(stride < 0 ? width : stride),
        data(std::max<int64_t>(1, rows * this->stride), -1),
        lens(std::max<int64_t>(1, rows), 0) {}
  void set(int64_t t, const std::vector<int32_t>& entries, int32_t len) {
    for (size_t j = 0; j < entries.size(); ++j) data[t * stride + j] = entries[j];
    lens[t] = len;
  }
  ConstIndexView view() const {
    return {data.data(), lens.data(), rows, width, stride, width, MemorySpace::kHost};
  }
  int64_t rows;
  int32_t width, stride;
  std::vector<int32_t> data, lens;
};

std::vector<float> random_rows(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n * kHeadDim);
  for (float& x : v) x = normal(rng);
  return v;
}

std::vector<uint16_t> random_q(int64_t tokens, int32_t heads, uint32_t seed, float scale = 1.0f) {
  const std::vector<float> f = random_rows(tokens * heads, seed, scale);
  std::vector<uint16_t> q(f.size());
  for (size_t i = 0; i < f.size(); ++i) q[i] = fp8::float_to_bf16(f[i]);
  return q;
}

std::vector<int64_t> iota_slots(int64_t n, int64_t first = 0) {
  std::vector<int64_t> s(n);
  for (int64_t i = 0; i < n; ++i) s[i] = first + i;
  return s;
}

struct Result {
  Status status;
  std::vector<uint16_t> out;
  std::vector<float> lse;
  std::vector<double> ref_out, ref_lse;
  float out_at(int64_t t, int32_t h, int d, int32_t heads) const {
    return fp8::bf16_to_float(out[(t * heads + h) * kHeadDim + d]);
  }
};

// Runs the CPU backend (outputs poisoned with NaN first) and the double reference.
Result run(SparseAttentionParams p) {
  Result r;
  const int64_t n = p.num_tokens * p.num_heads;
  r.out.assign(std::max<int64_t>(1, n * kHeadDim), 0x7fc1);
  r.lse.assign(std::max<int64_t>(1, n), std::nanf(""));
  r.ref_out.assign(std::max<int64_t>(1, n * kHeadDim), std::nan(""));
  r.ref_lse.assign(std::max<int64_t>(1, n), std::nan(""));
  p.out = r.out.data();
  p.lse = r.lse.data();
  r.status = sparse_attention(p);
  if (r.status.ok()) {
    const Status s = sparse_attention_reference(p, r.ref_out.data(), r.ref_lse.data());
    EXPECT_TRUE(s.ok()) << s.to_string();
  }
  return r;
}

SparseAttentionParams params(int64_t tokens, int32_t heads, const std::vector<uint16_t>& q,
                             const HostCache& cache, const IndexRows& rows) {
  SparseAttentionParams p;
  p.num_tokens = tokens;
  p.num_heads = heads;
  p.q = q.data();
  p.swa_cache = cache.view();
  p.swa_indices = rows.view();
  return p;
}

// Dense attention in double over explicit keys [n, 512] for one query head.
void dense(const uint16_t* q, const std::vector<std::vector<float>>& keys, double scale,
           std::vector<double>* out, double* lse) {
  std::vector<double> s(keys.size());
  double m = -kInf;
  for (size_t i = 0; i < keys.size(); ++i) {
    double dot = 0;
    for (int d = 0; d < kHeadDim; ++d) dot += double{fp8::bf16_to_float(q[d])} * keys[i][d];
    s[i] = scale * dot;
    m = std::max(m, s[i]);
  }
  double sum = 0;
  for (double v : s) sum += std::exp(v - m);
  *lse = m + std::log(sum);
  out->assign(kHeadDim, 0.0);
  for (size_t i = 0; i < keys.size(); ++i) {
    const double w = std::exp(s[i] - *lse);
    for (int d = 0; d < kHeadDim; ++d) (*out)[d] += w * keys[i][d];
  }
}

TEST(AttentionKernelNames, EachNameParsesBackToItsKernel) {
  for (AttentionKernel k :
       {AttentionKernel::kAuto, AttentionKernel::kSm90Tile32, AttentionKernel::kSm90Pairs}) {
    const auto parsed = parse_attention_kernel(attention_kernel_name(k));
    ASSERT_TRUE(parsed.ok()) << attention_kernel_name(k);
    EXPECT_EQ(parsed.value(), k);
  }
  EXPECT_STREQ(attention_kernel_name(AttentionKernel::kSm90Pairs), "sm90_pairs");
  EXPECT_STREQ(attention_kernel_name(AttentionKernel::kSm90Tile32), "sm90_tile32");
  EXPECT_FALSE(parse_attention_kernel("SM90_pairs").ok());  // names are exact
  EXPECT_FALSE(parse_attention_kernel("prefill").ok());     // the old spellings are gone
}

TEST(AttentionCpu, OneKeyGivesThatKey) {
  HostCache cache(CacheDtype::kFp8DsMla, 64, 2);
  cache.put(random_rows(1, 1, 3.0f), {77});
  const std::vector<float> key = cache.get(77);
  const auto q = random_q(1, 3, 2);
  IndexRows rows(1, 8);
  rows.set(0, {77}, 1);
  const Result r = run(params(1, 3, q, cache, rows));
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  for (int h = 0; h < 3; ++h) {
    double dot = 0;
    for (int d = 0; d < kHeadDim; ++d) {
      ASSERT_EQ(r.out_at(0, h, d, 3), fp8::bf16_to_float(fp8::float_to_bf16(key[d])));
      dot += double{fp8::bf16_to_float(q[h * kHeadDim + d])} * key[d];
    }
    EXPECT_NEAR(r.ref_lse[h], double{kDefaultSoftmaxScale} * dot, 1e-12);
    EXPECT_FLOAT_EQ(r.lse[h], static_cast<float>(double{kDefaultSoftmaxScale} * dot));
  }
}

TEST(AttentionCpu, HandComputedTwoKeysWithASink) {
  // q = 0: both scores are 0, so the weights are 1/2 each and lse = ln 2. Keys all-1 and all-3
  // average to 2. A sink of 0 scales by 1 / (1 + exp(0 - ln 2)) = 2/3: 4/3 -> bf16 1.3359375.
  HostCache cache(CacheDtype::kBf16, 32, 1);
  std::vector<float> keys(2 * kHeadDim);
  for (int d = 0; d < kHeadDim; ++d) {
    keys[d] = 1.0f;
    keys[kHeadDim + d] = 3.0f;
  }
  cache.put(keys, {4, 9});
  IndexRows rows(1, 2);
  rows.set(0, {4, 9}, 2);
  const std::vector<uint16_t> q(2 * kHeadDim, 0);  // two heads of zeros
  std::vector<float> sinks = {-std::numeric_limits<float>::infinity(), 0.0f};
  SparseAttentionParams p = params(1, 2, q, cache, rows);
  p.sinks = sinks.data();
  const Result r = run(p);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_FLOAT_EQ(r.lse[0], std::log(2.0f));
  EXPECT_FLOAT_EQ(r.lse[1], std::log(2.0f));
  for (int d = 0; d < kHeadDim; ++d) {
    ASSERT_EQ(r.out_at(0, 0, d, 2), 2.0f);
    ASSERT_EQ(r.out_at(0, 1, d, 2), 1.3359375f);
    ASSERT_NEAR(r.ref_out[kHeadDim + d], 4.0 / 3.0, 1e-15);
  }
}

TEST(AttentionCpu, ConstantValueRowsGiveTheConstantExactlyWhateverLiesPastTheLength) {
  // Every key of the valid prefix is the same row c (values exact in bf16); the entries past
  // lens point at real, different keys. Reading the padded width instead of lens changes it.
  HostCache cache(CacheDtype::kBf16, 32, 4);
  std::vector<float> c(kHeadDim);
  for (int d = 0; d < kHeadDim; ++d)
    c[d] = fp8::bf16_to_float(fp8::float_to_bf16(0.37f * (d % 11) - 1.5f));
  std::vector<float> same;
  for (int i = 0; i < 40; ++i) same.insert(same.end(), c.begin(), c.end());
  cache.put(same, iota_slots(40));
  cache.put(random_rows(60, 3, 5.0f), iota_slots(60, 40));
  const int32_t T = 4, H = 5, width = 64;
  IndexRows rows(T, width);
  for (int t = 0; t < T; ++t) {
    std::vector<int32_t> e(width);
    for (int j = 0; j < width; ++j) e[j] = j < 37 ? (j * 3 + t) % 40 : 40 + (j * 7 + t) % 60;
    rows.set(t, e, 37);
  }
  const auto q = random_q(T, H, 4, 4.0f);
  const Result r = run(params(T, H, q, cache, rows));
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < H; ++h) {
      for (int d = 0; d < kHeadDim; ++d) ASSERT_EQ(r.out_at(t, h, d, H), c[d]) << t << "/" << h;
    }
  }
}

TEST(AttentionCpu, EmptyRowsGiveZeroAndInfiniteLse) {
  HostCache cache(CacheDtype::kFp8DsMla, 64, 1);
  cache.put(random_rows(4, 5), iota_slots(4));
  IndexRows rows(3, 4);
  rows.set(0, {0, 1, 2, 3}, 0);      // lens 0
  rows.set(1, {-1, -1, -1, -1}, 4);  // only holes
  rows.set(2, {2}, 1);               // a normal row next to them
  const auto q = random_q(3, 2, 6);
  std::vector<float> sinks = {0.5f, std::numeric_limits<float>::infinity()};
  SparseAttentionParams p = params(3, 2, q, cache, rows);
  p.sinks = sinks.data();
  const Result r = run(p);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  for (int t = 0; t < 2; ++t) {
    for (int h = 0; h < 2; ++h) {
      EXPECT_EQ(r.lse[t * 2 + h], std::numeric_limits<float>::infinity());
      EXPECT_EQ(r.ref_lse[t * 2 + h], kInf);
      for (int d = 0; d < kHeadDim; ++d) ASSERT_EQ(r.out_at(t, h, d, 2), 0.0f);
    }
  }
  EXPECT_TRUE(std::isfinite(r.lse[4]));
}

TEST(AttentionCpu, SinksScaleTheOutputAndKeepTheLse) {
  HostCache cache(CacheDtype::kFp8DsMla, 64, 1);
  cache.put(random_rows(20, 7), iota_slots(20));
  IndexRows rows(2, 20);
  rows.set(0, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}, 20);
  rows.set(1, {5, 3, 19}, 3);
  const int32_t H = 4;
  const auto q = random_q(2, H, 8);
  const Result plain = run(params(2, H, q, cache, rows));
  ASSERT_TRUE(plain.status.ok());
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> sinks = {-inf, inf, 0.0f, 2.5f};
  SparseAttentionParams p = params(2, H, q, cache, rows);
  p.sinks = sinks.data();
  const Result sunk = run(p);
  ASSERT_TRUE(sunk.status.ok());
  for (int t = 0; t < 2; ++t) {
    for (int h = 0; h < H; ++h) {
      const int64_t th = t * H + h;
      EXPECT_EQ(sunk.lse[th], plain.lse[th]);
      const double factor = 1.0 / (1.0 + std::exp(double{sinks[h]} - plain.ref_lse[th]));
      for (int d = 0; d < kHeadDim; ++d) {
        const int64_t i = th * kHeadDim + d;
        ASSERT_NEAR(sunk.ref_out[i], plain.ref_out[i] * factor, 1e-12) << "head " << h;
        if (h == 0) ASSERT_EQ(sunk.out[i], plain.out[i]);      // sink -inf: no change
        if (h == 1) ASSERT_EQ(sunk.out_at(t, h, d, H), 0.0f);  // sink +inf: everything sinks
      }
    }
  }
}

TEST(AttentionCpu, HolesInsideTheLengthAreSkipped) {
  HostCache cache(CacheDtype::kFp8DsMla, 32, 2);
  cache.put(random_rows(64, 9), iota_slots(64));
  IndexRows holes(1, 8), packed(1, 8);
  holes.set(0, {12, -1, 40, -1, -1, 3, 63, -1}, 8);
  packed.set(0, {12, 40, 3, 63}, 4);
  const auto q = random_q(1, 6, 10);
  const Result a = run(params(1, 6, q, cache, holes));
  const Result b = run(params(1, 6, q, cache, packed));
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.lse, b.lse);
}

TEST(AttentionCpu, QueryGroupSizeIsAHintTheReferenceIgnores) {
  HostCache cache(CacheDtype::kFp8DsMla, 32, 2);
  cache.put(random_rows(64, 9), iota_slots(64));
  IndexRows rows(3, 4);
  rows.set(0, {12, 40, 3, 63}, 4);
  rows.set(1, {40, 3, 63, 7}, 4);
  rows.set(2, {5, 5, -1, 9}, 3);
  const auto q = random_q(3, 6, 10);
  SparseAttentionParams grouped = params(3, 6, q, cache, rows);
  grouped.query_group_size = 2;
  const Result a = run(grouped);
  const Result b = run(params(3, 6, q, cache, rows));
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.lse, b.lse);
}

TEST(AttentionCpu, GarbagePastTheLengthIsNeverRead) {
  // Past lens: slot ids far outside the cache, and keys full of NaN / huge values.
  HostCache cache(CacheDtype::kBf16, 32, 2);
  cache.put(random_rows(10, 11), iota_slots(10));
  std::vector<float> poison(2 * kHeadDim, std::nanf(""));
  for (int d = 0; d < kHeadDim; ++d) poison[kHeadDim + d] = 3e38f;
  cache.put(poison, {50, 51});
  IndexRows garbage(2, 16), clean(2, 16);
  garbage.set(0, {0, 1, 2, 3, std::numeric_limits<int32_t>::max(), 50, 51, 1 << 30, -7}, 4);
  garbage.set(1, {9, 50, 51, 50, 51, 50}, 1);
  clean.set(0, {0, 1, 2, 3}, 4);
  clean.set(1, {9}, 1);
  const auto q = random_q(2, 3, 12);
  const Result a = run(params(2, 3, q, cache, garbage));
  const Result b = run(params(2, 3, q, cache, clean));
  ASSERT_TRUE(a.status.ok()) << a.status.to_string();
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.lse, b.lse);
  for (uint16_t v : a.out) ASSERT_FALSE(std::isnan(fp8::bf16_to_float(v)));
}

TEST(AttentionCpu, WindowCoveringEverythingEqualsDenseAttention) {
  // Every token sees all N keys, split over the SWA cache (fp8_ds_mla, B=64) and the extra
  // cache (bf16, B=2), with shuffled slots and a non-default scale.
  const int32_t N_swa = 70, N_extra = 30, T = 3, H = 7;
  HostCache swa(CacheDtype::kFp8DsMla, 64, 2), extra(CacheDtype::kBf16, 2, 20);
  swa.put(random_rows(N_swa, 13, 2.0f), iota_slots(N_swa, 50));
  extra.put(random_rows(N_extra, 14, 2.0f), iota_slots(N_extra, 7));
  IndexRows swa_rows(T, 80), extra_rows(T, 32, 40);
  std::vector<std::vector<float>> keys;
  std::vector<int32_t> s, e;
  for (int i = 0; i < N_swa; ++i) s.push_back(50 + (i * 17) % N_swa);
  for (int i = 0; i < N_extra; ++i) e.push_back(7 + (i * 7) % N_extra);
  for (int32_t v : s) keys.push_back(swa.get(v));
  for (int32_t v : e) keys.push_back(extra.get(v));
  for (int t = 0; t < T; ++t) {
    swa_rows.set(t, s, N_swa);
    extra_rows.set(t, e, N_extra);
  }
  const auto q = random_q(T, H, 15, 3.0f);
  SparseAttentionParams p = params(T, H, q, swa, swa_rows);
  p.extra_cache = extra.view();
  p.extra_indices = extra_rows.view();
  p.softmax_scale = 0.07f;
  const Result r = run(p);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < H; ++h) {
      std::vector<double> out;
      double lse;
      dense(q.data() + (t * H + h) * kHeadDim, keys, double{0.07f}, &out, &lse);
      EXPECT_NEAR(r.ref_lse[t * H + h], lse, 1e-12);
      EXPECT_FLOAT_EQ(r.lse[t * H + h], static_cast<float>(lse));
      for (int d = 0; d < kHeadDim; ++d) {
        ASSERT_NEAR(r.ref_out[(t * H + h) * kHeadDim + d], out[d], 1e-12);
        // The bf16 output is the dense value rounded: within half a bf16 ulp.
        const double got = r.out_at(t, h, d, H);
        ASSERT_LE(std::abs(got - out[d]), std::abs(out[d]) * std::ldexp(1.0, -8) + 1e-30);
      }
    }
  }
}

TEST(AttentionCpu, MixedSingleMatrixEqualsTwoSegments) {
  // The FlashInfer SM100 form: [T, S + P] in one cache, lens = S + compressed count, -1 holes
  // inside the SWA section. Same keys as an SWA segment plus an extra segment.
  const int32_t S = 8, P = 4, T = 3, H = 2;
  HostCache cache(CacheDtype::kFp8DsMla, 32, 2);
  cache.put(random_rows(64, 16), iota_slots(64));
  IndexRows mixed(T, S + P), swa(T, S), extra(T, P);
  mixed.set(0, {4, 5, 6, 7, 16, 17, 18, -1, 26, -1, -1, -1}, 9);
  mixed.set(1, {4, 5, 6, 7, 16, 17, 18, 19, 27, 26, -1, -1}, 10);
  mixed.set(2, {20, 21, 22, 23, 44, -1, -1, -1, 33, 60, 61, -1}, 11);
  swa.set(0, {4, 5, 6, 7, 16, 17, 18}, 7);
  swa.set(1, {4, 5, 6, 7, 16, 17, 18, 19}, 8);
  swa.set(2, {20, 21, 22, 23, 44}, 5);
  extra.set(0, {26}, 1);
  extra.set(1, {27, 26}, 2);
  extra.set(2, {33, 60, 61}, 3);
  const auto q = random_q(T, H, 17);
  const Result one = run(params(T, H, q, cache, mixed));
  SparseAttentionParams p = params(T, H, q, cache, swa);
  p.extra_cache = cache.view();
  p.extra_indices = extra.view();
  const Result two = run(p);
  ASSERT_TRUE(one.status.ok() && two.status.ok());
  EXPECT_EQ(one.out, two.out);
  EXPECT_EQ(one.lse, two.lse);
}

TEST(AttentionCpu, ExtraSegmentWithZeroWidthChangesNothing) {
  HostCache cache(CacheDtype::kFp8DsMla, 32, 1);
  cache.put(random_rows(8, 18), iota_slots(8));
  IndexRows rows(2, 4), empty(2, 0);
  rows.set(0, {1, 2, 3}, 3);
  rows.set(1, {7}, 1);
  const auto q = random_q(2, 3, 19);
  SparseAttentionParams p = params(2, 3, q, cache, rows);
  const Result a = run(p);
  p.extra_cache = cache.view();
  p.extra_indices = empty.view();
  const Result b = run(p);
  ASSERT_TRUE(a.status.ok() && b.status.ok()) << b.status.to_string();
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.lse, b.lse);
}

TEST(AttentionCpu, ZeroTokensIsANoOp) {
  HostCache cache(CacheDtype::kFp8DsMla, 32, 1);
  IndexRows rows(0, 4);
  SparseAttentionParams p;
  p.num_heads = 4;
  p.swa_cache = cache.view();
  p.swa_indices = rows.view();
  SPARSE_SWA_EXPECT_OK(sparse_attention(p));
}

// ---- errors ----

class AttentionErrors : public ::testing::Test {
 protected:
  AttentionErrors() : cache_(CacheDtype::kFp8DsMla, 32, 4), rows_(2, 8), extra_(2, 4) {
    cache_.put(random_rows(4, 20), iota_slots(4));
    rows_.set(0, {0, 1, 2}, 3);
    rows_.set(1, {3}, 1);
    q_ = random_q(2, 4, 21);
    out_.assign(2 * 4 * kHeadDim, 0);
    lse_.assign(2 * 4, 0.0f);
  }
  SparseAttentionParams p() {
    SparseAttentionParams p = params(2, 4, q_, cache_, rows_);
    p.out = out_.data();
    p.lse = lse_.data();
    return p;
  }
  HostCache cache_;
  IndexRows rows_, extra_;
  std::vector<uint16_t> q_, out_;
  std::vector<float> lse_;
};

TEST_F(AttentionErrors, HeadCountAndScale) {
  for (int h : {0, -1, 129}) {
    SparseAttentionParams bad = p();
    bad.num_heads = h;
    EXPECT_TRUE(IsInvalidArgument(sparse_attention(bad),
                                  {"params.num_heads: expected 1..128, got " + std::to_string(h)}));
  }
  SparseAttentionParams bad = p();
  bad.softmax_scale = std::nanf("");
  EXPECT_TRUE(
      IsInvalidArgument(sparse_attention(bad), {"params.softmax_scale: expected a finite value"}));
  bad = p();
  bad.num_tokens = -3;
  EXPECT_TRUE(
      IsInvalidArgument(sparse_attention(bad), {"params.num_tokens: expected >= 0, got -3"}));
  for (int g : {0, -2, 9}) {
    bad = p();
    bad.query_group_size = g;
    EXPECT_TRUE(
        IsInvalidArgument(sparse_attention(bad),
                          {"params.query_group_size: expected 1..8, got " + std::to_string(g)}));
  }
}

TEST_F(AttentionErrors, NullBuffers) {
  SparseAttentionParams bad = p();
  bad.q = nullptr;
  EXPECT_TRUE(IsInvalidArgument(sparse_attention(bad), {"params.q: null with 2 tokens"}));
  bad = p();
  bad.lse = nullptr;
  EXPECT_TRUE(IsInvalidArgument(sparse_attention(bad), {"params.lse: null"}));
  bad = p();
  bad.out = nullptr;
  EXPECT_TRUE(IsInvalidArgument(sparse_attention(bad), {"params.out: null"}));
  EXPECT_TRUE(IsInvalidArgument(sparse_attention_reference(p(), nullptr, nullptr),
                                {"null reference outputs"}));
}

TEST_F(AttentionErrors, IndexViewShapes) {
  SparseAttentionParams bad = p();
  bad.num_tokens = 3;
  EXPECT_TRUE(IsInvalidArgument(sparse_attention(bad),
                                {"params.swa_indices.rows: expected num_tokens 3, got 2"}));
  rows_.lens[1] = 9;
  EXPECT_TRUE(IsInvalidArgument(
      sparse_attention(p()), {"params.swa_indices.lens[1]: expected 0..8 (the row width), got 9"}));
  rows_.lens[1] = 1;
  bad = p();
  bad.swa_indices.row_stride = 4;
  EXPECT_TRUE(IsInvalidArgument(sparse_attention(bad),
                                {"params.swa_indices.row_stride: expected >= width 8, got 4"}));
  bad = p();
  IndexRows short_extra(1, 4);
  bad.extra_cache = cache_.view();
  bad.extra_indices = short_extra.view();
  EXPECT_TRUE(IsInvalidArgument(sparse_attention(bad),
                                {"params.extra_indices.rows: expected num_tokens 2, got 1"}));
  bad = p();
  bad.extra_indices = extra_.view();  // extra cache left empty (block_size 0)
  EXPECT_TRUE(IsInvalidArgument(sparse_attention(bad),
                                {"params.extra_cache.block_size: expected >= 1, got 0"}));
}

TEST_F(AttentionErrors, OutOfRangeIndexInsideTheLengthNamesTheEntry) {
  rows_.set(1, {3, 5, 128}, 3);  // the cache has 4 blocks * 32 = 128 slots
  std::fill(out_.begin(), out_.end(), 0x1234);
  EXPECT_TRUE(IsInvalidArgument(
      sparse_attention(p()),
      {"params.swa_indices[1][2]: slot 128 is outside the cache (num_blocks * block_size = 128)"}));
  for (uint16_t v : out_) ASSERT_EQ(v, 0x1234);  // nothing written
  SparseAttentionParams with_extra = p();
  rows_.set(1, {3}, 1);
  extra_.set(0, {1, 2, 3, 999}, 4);
  with_extra.extra_cache = cache_.view();
  with_extra.extra_indices = extra_.view();
  EXPECT_TRUE(IsInvalidArgument(sparse_attention(with_extra),
                                {"params.extra_indices[0][3]: slot 999 is outside the cache"}));
}

TEST_F(AttentionErrors, IndexBelowMinusOneInsideTheLengthNamesTheEntry) {
  // -1 is a hole; any other negative value is an error like a slot past the cache.
  rows_.set(0, {0, -5, 2}, 3);
  std::fill(out_.begin(), out_.end(), 0x1234);
  EXPECT_TRUE(IsInvalidArgument(
      sparse_attention(p()),
      {"params.swa_indices[0][1]: slot -5 is below -1 (expected -1 for a hole or a slot in [0, "
       "128))"}));
  for (uint16_t v : out_) ASSERT_EQ(v, 0x1234);  // nothing written
  rows_.set(0, {0, 1, 2}, 3);
  extra_.set(1, {1, std::numeric_limits<int32_t>::min()}, 2);
  SparseAttentionParams with_extra = p();
  with_extra.extra_cache = cache_.view();
  with_extra.extra_indices = extra_.view();
  EXPECT_TRUE(IsInvalidArgument(sparse_attention(with_extra),
                                {"params.extra_indices[1][1]: slot -2147483648 is below -1"}));
  std::vector<double> out(2 * 4 * kHeadDim), lse(2 * 4);
  EXPECT_TRUE(IsInvalidArgument(sparse_attention_reference(with_extra, out.data(), lse.data()),
                                {"params.extra_indices[1][1]"}));
  extra_.set(1, {1, -5}, 1);  // past the length: never read
  with_extra.extra_indices = extra_.view();
  SPARSE_SWA_EXPECT_OK(sparse_attention(with_extra));
}

TEST_F(AttentionErrors, CacheViewProblems) {
  SparseAttentionParams bad = p();
  bad.swa_cache.page_stride_bytes = 1024;
  EXPECT_TRUE(IsInvalidArgument(sparse_attention(bad),
                                {"params.swa_cache.page_stride_bytes: expected >= 18688"}));
  bad = p();
  bad.swa_cache.dtype = static_cast<CacheDtype>(9);
  EXPECT_TRUE(IsInvalidArgument(sparse_attention(bad),
                                {"params.swa_cache.dtype: expected fp8_ds_mla, bf16 or fp8_e4m3"}));
}

TEST_F(AttentionErrors, EveryViewMustLiveInTheSpaceOfTheSwaIndices) {
  // swa_indices.space picks the backend; every other view must be in the same space.
  SparseAttentionParams bad = p();
  bad.swa_cache.space = MemorySpace::kDevice;
  EXPECT_TRUE(IsInvalidArgument(sparse_attention(bad),
                                {"params.swa_cache.space: expected host, got device"}));
  bad = p();
  bad.swa_indices.space = MemorySpace::kDevice;
  EXPECT_TRUE(IsInvalidArgument(sparse_attention(bad),
                                {"params.swa_cache.space: expected device, got host"}));
  SparseAttentionParams with_extra = p();
  with_extra.extra_indices = with_extra.swa_indices;
  with_extra.extra_cache = with_extra.swa_cache;
  with_extra.extra_indices.space = MemorySpace::kDevice;
  EXPECT_TRUE(IsInvalidArgument(sparse_attention(with_extra),
                                {"params.extra_indices.space: expected host, got device"}));
  bad = p();
  bad.swa_indices.space = MemorySpace::kDevice;
  bad.swa_cache.space = MemorySpace::kDevice;
  const Status c = sparse_attention(bad);
#if SPARSE_SWA_HAS_CUDA
  // A host pointer: refused by the pointer check (or the whole backend when there is no GPU).
  EXPECT_TRUE(c.code() == StatusCode::kUnavailable || IsInvalidArgument(c, {"params.q"}))
      << c.to_string();
#else
  EXPECT_EQ(c.code(), StatusCode::kUnavailable) << c.to_string();
  const Status h = sparse_attention_cuda_from_host(p());
  EXPECT_EQ(h.code(), StatusCode::kUnavailable) << h.to_string();
#endif
}

// Without a usable device there is no workspace to size or allocate (the CUDA test checks the
// bound against every shape).
TEST(AttentionWorkspace, NoneWithoutADevice) {
  if (cuda_backend_available()) GTEST_SKIP() << "a CUDA device is usable";
  EXPECT_EQ(sparse_attention_max_workspace_bytes(), 0);
  auto w = AttentionWorkspace::create();
  EXPECT_EQ(w.status().code(), StatusCode::kUnavailable) << w.status().to_string();
}

}  // namespace
}  // namespace sparse_swa
