// SPDX-License-Identifier: Apache-2.0
// CUDA sparse attention vs the CPU reference on random data (never zeros) over a sample of
// heads x widths x extra widths x page sizes x batches x cache dtypes, outputs poisoned first.
// Tolerance: tests/support/attention_compare.h (elementwise against the double and fp32
// references; NaN never passes). Also: masking of out-of-range entries, device lens outside
// 0..width, graph capture and replay, constant rows exactly, the host-staged entry point.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/fp8_e4m3.h"
#include "cuda/attention_ds_mla.cuh"
#include "sparse_swa/attention.h"
#include "support/attention_compare.h"
#include "support/device_array.h"
#include "support/status_matchers.h"

namespace sparse_swa {
namespace {

constexpr float kInfF = std::numeric_limits<float>::infinity();
constexpr int32_t kPoisonSlots = 16;  // slots [0, 16) hold NaN / huge keys, never inside lens

using testing::AttentionComparison;
using testing::compare_attention;
using testing::DeviceArray;

// One paged cache on the host: num_slots random keys (row scales vary), slots [0, 16) poisoned.
struct HostCache {
  HostCache(CacheDtype dtype, int32_t block_size, int64_t min_slots, uint32_t seed)
      : dtype(dtype), block_size(block_size) {
    num_blocks = (std::max<int64_t>(min_slots, 2 * kPoisonSlots) + block_size - 1) / block_size;
    // Tight page plus 48 bytes: the stride must come from the view, never from B * 584.
    stride = (block_size * cache_token_bytes(dtype) + 15) / 16 * 16 + 48;
    bytes.assign(num_blocks * stride, 0x5c);
    const int64_t n = num_blocks * block_size;
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> rows(n * kHeadDim);
    for (int64_t s = 0; s < n; ++s) {
      const float scale = s < kPoisonSlots ? 0.0f : 0.25f + 0.75f * (s % 5);
      for (int d = 0; d < kHeadDim; ++d) {
        float v = normal(rng) * scale;
        if (s < kPoisonSlots) v = (s + d) % 2 ? std::nanf("") : 3e38f;
        rows[s * kHeadDim + d] = v;
      }
    }
    std::vector<int64_t> slots(n);
    for (int64_t s = 0; s < n; ++s) slots[s] = s;
    const Status st = encode_kv_rows({rows.data(), n, kHeadDim, kHeadDim}, slots, view());
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
  KvCacheView view() {
    return {bytes.data(), num_blocks, block_size, stride, dtype, MemorySpace::kHost};
  }
  int64_t num_slots() const { return num_blocks * block_size; }

  CacheDtype dtype;
  int32_t block_size;
  int64_t num_blocks = 0, stride = 0;
  std::vector<uint8_t> bytes;
};

struct IndexRows {
  IndexRows(int64_t rows, int32_t width, int32_t stride)
      : rows(rows),
        width(width),
        stride(stride),
        data(std::max<int64_t>(1, rows * stride), -1),
        lens(std::max<int64_t>(1, rows), 0) {}
  ConstIndexView view() const {
    return {data.data(), lens.data(), rows, width, stride, width, MemorySpace::kHost};
  }
  int64_t rows;
  int32_t width, stride;
  std::vector<int32_t> data, lens;
};

// Random rows: lens 0 / full / uniform, 5% -1 holes inside the length, garbage past it
// (poison slots, ids past the cache, INT32_MAX, other negatives).
void fill_rows(IndexRows* r, int64_t num_slots, std::mt19937* rng) {
  std::uniform_int_distribution<int64_t> slot(kPoisonSlots, num_slots - 1);
  for (int64_t t = 0; t < r->rows; ++t) {
    const uint32_t pick = (*rng)() % 10;
    int32_t len =
        pick == 0 ? 0 : (pick < 4 ? r->width : static_cast<int32_t>((*rng)() % (r->width + 1)));
    r->lens[t] = len;
    int32_t* row = r->data.data() + t * r->stride;
    for (int32_t j = 0; j < r->stride; ++j) {
      if (j < len) {
        row[j] = (*rng)() % 20 == 0 ? -1 : static_cast<int32_t>(slot(*rng));
      } else {
        const int32_t garbage[] = {static_cast<int32_t>((*rng)() % kPoisonSlots),
                                   static_cast<int32_t>(num_slots + j),
                                   std::numeric_limits<int32_t>::max(), -5, -1};
        row[j] = garbage[(*rng)() % 5];
      }
    }
  }
}

// Query groups of g rows (MTP / DSpark), over fill_rows' lens and garbage: a group's first row
// draws distinct slots (5% -1 holes); each later row takes most of its entries from the row
// before, one place on (a window that moves, a top-k that overlaps), where that row has a valid
// entry there, else fresh slots of the group's draw. No row repeats a slot, but in every third
// group, where some entries repeat their neighbour (a key listed twice by one token).
void share_within_groups(IndexRows* r, int64_t num_slots, int32_t g, std::mt19937* rng) {
  std::vector<int32_t> perm(num_slots - kPoisonSlots);
  std::iota(perm.begin(), perm.end(), kPoisonSlots);
  size_t next = perm.size();
  for (int64_t t = 0; t < r->rows; ++t) {
    if (t % g == 0) {  // a new group: a new draw
      std::shuffle(perm.begin(), perm.end(), *rng);
      next = 0;
    }
    const bool repeats = (t / g) % 3 == 0;
    const int32_t* prev = r->data.data() + (t - 1) * r->stride;
    int32_t* row = r->data.data() + t * r->stride;
    for (int32_t j = 0; j < r->lens[t]; ++j) {
      const uint32_t pick = (*rng)() % 20;
      if (pick == 0) {
        row[j] = -1;
      } else if (repeats && pick == 1 && j > 0) {
        row[j] = row[j - 1];
      } else if (t % g != 0 && pick < 16 && j + 1 < r->lens[t - 1] && prev[j + 1] >= 0) {
        row[j] = prev[j + 1];
      } else {
        row[j] = next < perm.size() ? perm[next++] : -1;
      }
    }
  }
}

std::vector<uint16_t> random_q(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> q(n * kHeadDim);
  for (uint16_t& v : q) {
    float x = normal(rng);
    if (x == 0.0f) x = 0.5f;
    v = fp8::float_to_bf16(x);
  }
  return q;
}

// Device copies of a host problem; params() is the same call on device memory.
class DeviceProblem {
 public:
  DeviceProblem(const SparseAttentionParams& hp, const HostCache& swa, const IndexRows& swa_rows,
                const HostCache* extra, const IndexRows* extra_rows, const std::vector<uint16_t>& q,
                const std::vector<float>& sinks, bool with_workspace = false)
      : swa_cache_(swa.bytes),
        swa_idx_(swa_rows.data),
        swa_lens_(swa_rows.lens),
        extra_cache_(extra ? extra->bytes : std::vector<uint8_t>{}),
        extra_idx_(extra_rows ? extra_rows->data : std::vector<int32_t>{}),
        extra_lens_(extra_rows ? extra_rows->lens : std::vector<int32_t>{}),
        q_(q),
        sinks_(sinks),
        out_(q.size()),
        lse_(hp.num_tokens * hp.num_heads),
        bad_(1) {
    p_ = hp;
    p_.q = q_.get();
    p_.out = out_.get();
    p_.lse = lse_.get();
    p_.sinks = hp.sinks ? sinks_.get() : nullptr;
    p_.swa_cache.data = swa_cache_.get();
    p_.swa_cache.space = MemorySpace::kDevice;
    p_.swa_indices.data = swa_idx_.get();
    p_.swa_indices.lens = swa_lens_.get();
    p_.swa_indices.space = MemorySpace::kDevice;
    if (extra_rows != nullptr) {
      p_.extra_cache.data = extra_cache_.get();
      p_.extra_cache.space = MemorySpace::kDevice;
      p_.extra_indices.data = extra_idx_.get();
      p_.extra_indices.lens = extra_lens_.get();
      p_.extra_indices.space = MemorySpace::kDevice;
    }
    EXPECT_EQ(cudaMemset(bad_.get(), 0, sizeof(int32_t)), cudaSuccess);
    p_.bad_index_count = bad_.get();
    if (with_workspace) {
      const int64_t bytes = sparse_attention_workspace_bytes(p_);
      workspace_ = std::make_unique<DeviceArray<uint8_t>>(static_cast<size_t>(bytes));
      workspace_->poison();
      p_.workspace = workspace_->get();
      p_.workspace_bytes = bytes;
    }
    out_.poison();
    lse_.poison();
  }
  const SparseAttentionParams& params() const { return p_; }
  std::vector<uint16_t> out() const { return out_.download(); }
  std::vector<float> lse() const { return lse_.download(); }
  int32_t bad_count() const { return bad_.download()[0]; }
  DeviceArray<int32_t>& swa_idx() { return swa_idx_; }
  DeviceArray<int32_t>& swa_lens() { return swa_lens_; }
  void poison_outputs() {
    out_.poison();
    lse_.poison();
  }

 private:
  DeviceArray<uint8_t> swa_cache_;
  DeviceArray<int32_t> swa_idx_, swa_lens_;
  DeviceArray<uint8_t> extra_cache_;
  DeviceArray<int32_t> extra_idx_, extra_lens_;
  DeviceArray<uint16_t> q_;
  DeviceArray<float> sinks_;
  DeviceArray<uint16_t> out_;
  DeviceArray<float> lse_;
  DeviceArray<int32_t> bad_;
  std::unique_ptr<DeviceArray<uint8_t>> workspace_;
  SparseAttentionParams p_;
};

int sm_count() {
  int device = 0, sms = 0;
  EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  return sms;
}

// True when the call these device params describe runs the prefill kernel, which rounds P to
// bf16 once (the comparison's wider bound).
bool rounds_p(const SparseAttentionParams& device_params) {
  return sparse_attention_kernel(device_params) == AttentionKernel::kPrefill;
}

struct Shape {
  int32_t heads, width, extra_width, swa_block, extra_block, tokens;
  CacheDtype swa_dtype, extra_dtype;
  bool sinks;
  bool split = false;  // give the call a workspace, so small batches split their keys
  AttentionKernel kernel = AttentionKernel::kAuto;
  int32_t group = 1;  // query_group_size; > 1: rows of a group share keys (share_within_groups)
};

std::string describe(const Shape& s) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "H=%d W=%d E=%d B=%d/%d T=%d %s/%s%s%s%s G=%d", s.heads, s.width,
                s.extra_width, s.swa_block, s.extra_block, s.tokens, cache_dtype_name(s.swa_dtype),
                cache_dtype_name(s.extra_dtype), s.sinks ? " sinks" : "", s.split ? " split" : "",
                s.kernel == AttentionKernel::kPrefill
                    ? " prefill"
                    : (s.kernel == AttentionKernel::kDecode ? " decode" : ""),
                s.group);
  return buf;
}

double g_max_err = 0, g_max_float_ref_err = 0, g_max_lse_err = 0;

class AttentionCudaVsCpu : public ::testing::TestWithParam<Shape> {
 protected:
  static void TearDownTestSuite() {
    if (!cuda_backend_available()) return;
    std::printf(
        "[ attention ] largest |cuda - ref_double| over all shapes: %.6g (fp32/bf16 reference: "
        "%.6g); largest lse error: %.6g\n",
        g_max_err, g_max_float_ref_err, g_max_lse_err);
  }
};

TEST_P(AttentionCudaVsCpu, MatchesTheReference) {
  SKIP_WITHOUT_GPU();
  const Shape s = GetParam();
  const uint32_t seed =
      static_cast<uint32_t>(s.heads * 7919 + s.width * 131 + s.extra_width * 17 + s.tokens);
  std::mt19937 rng(seed);
  // (A query group draws up to g x width distinct slots.)
  HostCache swa(s.swa_dtype, s.swa_block, std::max(2, s.group) * s.width + 64, seed + 1);
  IndexRows swa_rows(s.tokens, s.width, s.width + (s.width % 3));  // odd strides too
  fill_rows(&swa_rows, swa.num_slots(), &rng);
  const bool has_extra = s.extra_width > 0;
  HostCache extra(s.extra_dtype, s.extra_block > 0 ? s.extra_block : 2,
                  has_extra ? std::max(2, s.group) * s.extra_width + 64 : 32, seed + 2);
  IndexRows extra_rows(s.tokens, s.extra_width, s.extra_width);
  if (has_extra) fill_rows(&extra_rows, extra.num_slots(), &rng);
  if (s.group > 1) {
    share_within_groups(&swa_rows, swa.num_slots(), s.group, &rng);
    if (has_extra) share_within_groups(&extra_rows, extra.num_slots(), s.group, &rng);
  }
  const std::vector<uint16_t> q = random_q(int64_t{s.tokens} * s.heads, seed + 3);
  std::vector<float> sinks(s.heads);
  for (int h = 0; h < s.heads; ++h)
    sinks[h] = h % 7 == 0 ? -kInfF : (h % 7 == 1 ? kInfF : 0.5f * (h % 5) - 1.0f);

  SparseAttentionParams hp;
  hp.num_tokens = s.tokens;
  hp.num_heads = s.heads;
  hp.q = q.data();
  hp.swa_cache = swa.view();
  hp.swa_indices = swa_rows.view();
  if (has_extra) {
    hp.extra_cache = extra.view();
    hp.extra_indices = extra_rows.view();
  }
  hp.sinks = s.sinks ? sinks.data() : nullptr;
  hp.kernel = s.kernel;
  hp.query_group_size = s.group;

  DeviceProblem dev(hp, swa, swa_rows, has_extra ? &extra : nullptr,
                    has_extra ? &extra_rows : nullptr, q, sinks, s.split);
  if (s.split) {
    EXPECT_GT(dev.params().workspace_bytes, 0) << describe(s) << ": expected a split plan";
  }
  if (s.group > 1 && sparse_attention_kernel(dev.params()) != AttentionKernel::kAuto) {
    // Every grouped shape below is one the prefill kernel takes as query groups.
    EXPECT_EQ(detail::plan_ds_mla_attention(dev.params(), sm_count(), dev.params().workspace_bytes)
                  .query_group,
              s.group)
        << describe(s);
  }
  const AttentionKernel kernel = sparse_attention_kernel(dev.params());
  if (s.kernel != AttentionKernel::kAuto) EXPECT_EQ(kernel, s.kernel) << describe(s);
  SPARSE_SWA_ASSERT_OK(sparse_attention(dev.params()));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const AttentionComparison e =
      compare_attention(hp, dev.out(), dev.lse(), kernel == AttentionKernel::kPrefill);
  EXPECT_EQ(e.failures, 0) << describe(s) << ": " << e.failures
                           << " elements out of tolerance; first: " << e.first_failure;
  EXPECT_EQ(dev.bad_count(), 0);
  g_max_err = std::max(g_max_err, e.max_err);
  g_max_float_ref_err = std::max(g_max_float_ref_err, e.max_float_ref_err);
  g_max_lse_err = std::max(g_max_lse_err, e.max_lse_err);
  std::printf("[ attention ] %-52s max err %.3g (fp32 ref %.3g), lse %.3g\n", describe(s).c_str(),
              e.max_err, e.max_float_ref_err, e.max_lse_err);
}

constexpr CacheDtype kDs = CacheDtype::kFp8DsMla;
constexpr CacheDtype kBf = CacheDtype::kBf16;
constexpr CacheDtype kE4 = CacheDtype::kFp8E4m3;

std::string shape_name(const ::testing::TestParamInfo<Shape>& info) {
  const Shape& s = info.param;
  return "H" + std::to_string(s.heads) + "_W" + std::to_string(s.width) + "_E" +
         std::to_string(s.extra_width) + "_B" + std::to_string(s.swa_block) + "x" +
         std::to_string(s.extra_block) + "_T" + std::to_string(s.tokens) + "_" +
         cache_dtype_name(s.swa_dtype) + (s.sinks ? "_sinks" : "") + (s.split ? "_split" : "") +
         (s.kernel == AttentionKernel::kPrefill
              ? "_prefill"
              : (s.kernel == AttentionKernel::kDecode ? "_decode" : "")) +
         (s.group > 1 ? "_G" + std::to_string(s.group) : "");
}

// Every listed value of every axis appears; heads 3, 20 and 100 check head counts that are not
// a power of two or a multiple of the 16-head CTA group.
INSTANTIATE_TEST_SUITE_P(SampledShapes, AttentionCudaVsCpu,
                         ::testing::Values(Shape{1, 1, 0, 64, 0, 256, kDs, kDs, false},
                                           Shape{8, 63, 100, 64, 2, 64, kDs, kDs, true},
                                           Shape{16, 128, 512, 256, 2, 16, kDs, kDs, false},
                                           Shape{32, 133, 0, 64, 0, 64, kBf, kBf, true},
                                           Shape{64, 192, 1024, 64, 64, 16, kDs, kDs, false},
                                           Shape{128, 256, 512, 256, 2, 16, kDs, kDs, true},
                                           Shape{128, 2048, 1024, 64, 2, 4, kDs, kDs, false},
                                           Shape{3, 640, 100, 256, 256, 64, kBf, kBf, false},
                                           Shape{20, 1152, 0, 64, 0, 16, kDs, kDs, true},
                                           Shape{128, 1152, 0, 256, 0, 1, kBf, kBf, false},
                                           Shape{64, 2048, 512, 64, 2, 16, kBf, kDs, false},
                                           Shape{8, 128, 1024, 256, 64, 256, kDs, kBf, true},
                                           Shape{16, 640, 0, 64, 0, 256, kDs, kDs, false},
                                           Shape{1, 2048, 1024, 256, 2, 64, kBf, kDs, true},
                                           Shape{100, 63, 100, 64, 2, 256, kDs, kDs, false},
                                           Shape{32, 256, 100, 256, 256, 1, kE4, kDs, false},
                                           Shape{128, 133, 0, 64, 0, 256, kDs, kDs, false},
                                           Shape{64, 1, 1024, 64, 2, 64, kDs, kDs, true}),
                         shape_name);

// `shapes`, each with params.kernel = `kernel`.
std::vector<Shape> with_kernel(std::vector<Shape> shapes, AttentionKernel kernel) {
  for (Shape& s : shapes) s.kernel = kernel;
  return shapes;
}

// Small batches with a workspace: the keys of each token are split over several CTAs and merged
// (fp8_ds_mla caches; heads not a multiple of 16, widths not a multiple of 32, page size 2). The
// merge reads the splits in batches, 128 threads a row up to ~1056 rows on 132 SMs and a warp a
// row past that: 1 token x 64 heads (20 splits) and 20 x 64 (1280 rows, 6 splits) take each.
// Unforced, 16, 20, 40 and 64 tokens x 64 or 32 heads and 4 x 128 take the prefill kernel's
// slices of pairs, the others the decode kernel's slices of tiles; each kernel forced takes them
// all. The prefill kernel's 2-8 slices merge inside a cluster (64 tokens x 32 heads: 2 slices;
// 40 x 64: 3; 16 and 20 x 64: 5; forced, 8 x 8: 6, 1 x 16: 7, 1 x 100: 8), more (4 x 128: 9)
// through the merge kernel.
std::vector<Shape> split_shapes(AttentionKernel kernel) {
  return with_kernel({Shape{64, 128, 512, 256, 64, 1, kDs, kDs, true, true},
                      Shape{64, 128, 512, 256, 64, 16, kDs, kDs, true, true},
                      Shape{128, 128, 1024, 256, 64, 4, kDs, kDs, true, true},
                      Shape{8, 63, 300, 64, 2, 8, kDs, kDs, false, true},
                      Shape{20, 1152, 0, 64, 0, 3, kDs, kDs, true, true},
                      Shape{3, 640, 100, 256, 2, 2, kDs, kDs, false, true},
                      Shape{48, 256, 1024, 2, 2, 5, kDs, kDs, true, true},
                      Shape{100, 200, 300, 64, 2, 1, kDs, kDs, false, true},
                      Shape{64, 128, 512, 256, 2, 20, kDs, kDs, true, true},
                      Shape{32, 128, 512, 64, 64, 64, kDs, kDs, true, true},
                      Shape{64, 128, 512, 64, 64, 40, kDs, kDs, false, true},
                      Shape{16, 128, 300, 64, 2, 1, kDs, kDs, true, true}},
                     kernel);
}
INSTANTIATE_TEST_SUITE_P(SplitShapes, AttentionCudaVsCpu,
                         ::testing::ValuesIn(split_shapes(AttentionKernel::kAuto)), shape_name);
INSTANTIATE_TEST_SUITE_P(SplitPrefillKernelShapes, AttentionCudaVsCpu,
                         ::testing::ValuesIn(split_shapes(AttentionKernel::kPrefill)), shape_name);
INSTANTIATE_TEST_SUITE_P(SplitDecodeKernelShapes, AttentionCudaVsCpu,
                         ::testing::ValuesIn(split_shapes(AttentionKernel::kDecode)), shape_name);

// Prefill-like batches (many query tokens, each with its own keys) on both cache dtypes the
// tensor-core kernel reads: bf16 rows copied straight into its K stages, fp8_ds_mla decoded;
// heads 1..128 (not multiples of 16 too), widths 1 to 2048, page sizes 2, 64 and 256.
INSTANTIATE_TEST_SUITE_P(PrefillShapes, AttentionCudaVsCpu,
                         ::testing::Values(Shape{1, 1, 0, 2, 0, 40, kBf, kBf, false},
                                           Shape{8, 63, 640, 64, 2, 64, kBf, kBf, true},
                                           Shape{16, 640, 0, 256, 0, 48, kBf, kBf, false},
                                           Shape{64, 128, 512, 64, 64, 96, kBf, kBf, true},
                                           Shape{100, 1152, 0, 2, 0, 20, kBf, kBf, false},
                                           Shape{128, 128, 1024, 64, 256, 24, kBf, kBf, true},
                                           Shape{64, 2048, 0, 256, 0, 12, kBf, kBf, false},
                                           Shape{128, 128, 1024, 64, 64, 24, kDs, kDs, false},
                                           Shape{8, 640, 1152, 2, 64, 40, kDs, kDs, true},
                                           Shape{100, 63, 1, 256, 2, 64, kDs, kDs, false}),
                         shape_name);

// More (token, head group) items than an H200 has SMs on bf16 caches, so that each CTA of the
// bf16 prefill kernel walks several items (docs/design.md#attention-kernels): rows staged and
// stored by the tensor map (40 and 64 heads) or straight from registers (8), odd block counts,
// lens 0 and full, -1 holes. SPARSE_SWA_ATTENTION_WALK_CTAS=2 makes every shape here walk.
INSTANTIATE_TEST_SUITE_P(WalkingShapes, AttentionCudaVsCpu,
                         ::testing::Values(Shape{64, 128, 64, 64, 2, 300, kBf, kBf, true},
                                           Shape{40, 63, 100, 2, 64, 200, kBf, kBf, false},
                                           Shape{8, 100, 0, 64, 0, 400, kBf, kBf, true}),
                         shape_name);

// bf16 caches with a workspace: split and merged like fp8_ds_mla, by either kernel.
std::vector<Shape> split_bf16_shapes(AttentionKernel kernel) {
  return with_kernel({Shape{64, 128, 512, 256, 64, 1, kBf, kBf, true, true},
                      Shape{128, 128, 1024, 64, 2, 3, kBf, kBf, false, true},
                      Shape{20, 1152, 0, 2, 0, 2, kBf, kBf, true, true},
                      Shape{8, 63, 300, 64, 256, 8, kBf, kBf, false, true},
                      Shape{100, 1152, 0, 64, 0, 12, kBf, kBf, false, true},
                      Shape{16, 128, 512, 64, 64, 32, kBf, kBf, true, true}},
                     kernel);
}
INSTANTIATE_TEST_SUITE_P(SplitBf16Shapes, AttentionCudaVsCpu,
                         ::testing::ValuesIn(split_bf16_shapes(AttentionKernel::kAuto)),
                         shape_name);
INSTANTIATE_TEST_SUITE_P(SplitBf16PrefillKernelShapes, AttentionCudaVsCpu,
                         ::testing::ValuesIn(split_bf16_shapes(AttentionKernel::kPrefill)),
                         shape_name);

// The prefill kernels, forced, on both cache dtypes: heads 1..128 (not multiples of 16 too),
// widths 1 to 2048 (odd block counts: of 32 keys for fp8_ds_mla, of 64 for bf16; tails), both
// segments or one, page sizes 2, 64 and 256; lens 0, full and between, -1 holes (fill_rows).
constexpr AttentionKernel kPre = AttentionKernel::kPrefill;
INSTANTIATE_TEST_SUITE_P(
    PrefillKernelShapes, AttentionCudaVsCpu,
    ::testing::Values(Shape{1, 1, 0, 2, 0, 40, kBf, kBf, false, false, kPre},
                      Shape{8, 63, 640, 64, 2, 64, kBf, kBf, true, false, kPre},
                      Shape{16, 640, 0, 256, 0, 48, kBf, kBf, false, false, kPre},
                      Shape{64, 128, 512, 64, 64, 96, kBf, kBf, true, false, kPre},
                      Shape{100, 1152, 0, 2, 0, 20, kBf, kBf, false, false, kPre},
                      Shape{128, 128, 1024, 64, 256, 24, kBf, kBf, true, false, kPre},
                      Shape{64, 2048, 0, 256, 0, 12, kBf, kBf, false, false, kPre},
                      Shape{3, 200, 100, 64, 2, 33, kBf, kBf, true, false, kPre},
                      Shape{128, 1, 63, 2, 256, 30, kBf, kBf, false, false, kPre},
                      Shape{8, 63, 640, 64, 2, 64, kDs, kDs, true, false, kPre},
                      Shape{64, 128, 512, 64, 64, 96, kDs, kDs, false, false, kPre},
                      Shape{100, 1152, 0, 2, 0, 20, kDs, kDs, true, false, kPre},
                      Shape{128, 1, 63, 256, 2, 30, kDs, kDs, false, false, kPre},
                      Shape{3, 200, 100, 64, 2, 33, kDs, kDs, true, false, kPre},
                      Shape{16, 2048, 0, 256, 0, 12, kDs, kDs, false, false, kPre}),
    shape_name);

// The decode kernel unsplit (the prefill kernel takes these shapes by default): every cache
// dtype it reads, heads and widths as above.
constexpr AttentionKernel kDec = AttentionKernel::kDecode;
INSTANTIATE_TEST_SUITE_P(
    DecodeKernelShapes, AttentionCudaVsCpu,
    ::testing::Values(Shape{1, 1, 0, 64, 0, 256, kDs, kDs, false, false, kDec},
                      Shape{8, 63, 100, 64, 2, 64, kDs, kDs, true, false, kDec},
                      Shape{32, 133, 0, 64, 0, 64, kBf, kBf, true, false, kDec},
                      Shape{128, 256, 512, 256, 2, 16, kDs, kDs, true, false, kDec},
                      Shape{3, 640, 100, 256, 256, 64, kBf, kBf, false, false, kDec},
                      Shape{20, 1152, 0, 64, 0, 16, kDs, kDs, true, false, kDec},
                      Shape{100, 63, 100, 64, 2, 256, kDs, kDs, false, false, kDec},
                      Shape{64, 2048, 0, 256, 0, 12, kBf, kBf, false, false, kDec}),
    shape_name);

constexpr AttentionKernel kAny = AttentionKernel::kAuto;
// Query groups (docs/design.md#query-groups): g consecutive rows share most keys, some keys
// repeat inside a row; the fp8_ds_mla prefill kernel walks each group's union once. Unforced
// when the groups fill the SMs (T / g >= 132 on an H200), forced below that; g x H from 3 to 64
// rows, widths not multiples of 32, page size 2, lens 0 and full, -1 holes, a shorter last
// group, one segment or two.
INSTANTIATE_TEST_SUITE_P(
    GroupShapes, AttentionCudaVsCpu,
    ::testing::Values(Shape{8, 640, 1152, 2, 64, 600, kDs, kDs, true, true, kAny, 2},
                      Shape{16, 128, 512, 64, 64, 1001, kDs, kDs, false, true, kAny, 4},
                      Shape{8, 128, 512, 64, 64, 128, kDs, kDs, true, true, kPre, 2},
                      Shape{16, 128, 512, 256, 2, 37, kDs, kDs, false, true, kPre, 4},
                      Shape{3, 63, 100, 64, 2, 50, kDs, kDs, true, true, kPre, 3},
                      Shape{1, 1, 0, 64, 0, 40, kDs, kDs, false, true, kPre, 8},
                      Shape{32, 128, 512, 64, 64, 64, kDs, kDs, false, true, kPre, 2},
                      Shape{20, 200, 300, 64, 2, 9, kDs, kDs, true, true, kPre, 3},
                      Shape{8, 128, 0, 64, 0, 300, kDs, kDs, false, true, kPre, 8}),
    shape_name);

// A small fixed problem for the behaviour tests below.
struct SmallProblem {
  SmallProblem(int32_t heads, int32_t tokens, int32_t width, CacheDtype dtype = kDs)
      : cache(dtype, 64, 256, 99),
        rows(tokens, width, width),
        q(random_q(int64_t{tokens} * heads, 98)) {
    std::mt19937 rng(97);
    fill_rows(&rows, cache.num_slots(), &rng);
    hp.num_tokens = tokens;
    hp.num_heads = heads;
    hp.q = q.data();
    hp.swa_cache = cache.view();
    hp.swa_indices = rows.view();
  }
  HostCache cache;
  IndexRows rows;
  std::vector<uint16_t> q;
  SparseAttentionParams hp;
};

// sparse_attention_max_workspace_bytes() bounds the workspace of every shape, so one allocation
// of it (AttentionWorkspace, the Python binding's per-stream cache) serves every call.
TEST(AttentionCuda, MaxWorkspaceBoundsEveryShape) {
  if (!cuda_backend_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t most = sparse_attention_max_workspace_bytes();
  int64_t largest = 0;
  SparseAttentionParams p;
  for (int32_t heads : {1, 8, 16, 63, 64, 65, 100, 128}) {
    for (int64_t tokens : {1, 2, 3, 7, 64, 200}) {
      for (int32_t width : {64, 128, 512, 2048, 100000}) {
        for (int32_t extra : {0, 512}) {
          p.num_heads = heads;
          p.num_tokens = tokens;
          p.swa_indices.rows = tokens;
          p.swa_indices.width = width;
          p.extra_indices.rows = extra > 0 ? tokens : 0;
          p.extra_indices.width = extra;
          const int64_t bytes = sparse_attention_workspace_bytes(p);
          EXPECT_LE(bytes, most) << heads << " heads, " << tokens << " tokens, width " << width;
          largest = std::max(largest, bytes);
        }
      }
    }
  }
  EXPECT_EQ(largest, most);  // the bound is reached (one token, 64 heads): it is not loose
  auto w = AttentionWorkspace::create();
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(w.value()->bytes(), most);
  EXPECT_EQ(w.value()->data() != nullptr, most > 0);
}

// Runs the call, then checks that it counted the `planted` bad entries and matches the CPU
// reference on `masked` (the same rows with -1 in their place: the CPU refuses them).
void expect_masked_and_counted(DeviceProblem& dev, const SparseAttentionParams& hp,
                               const IndexRows& masked, int32_t planted) {
  SPARSE_SWA_ASSERT_OK(sparse_attention(dev.params()));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(dev.bad_count(), planted);
  SparseAttentionParams ref = hp;
  ref.swa_indices = masked.view();
  const AttentionComparison e =
      compare_attention(ref, dev.out(), dev.lse(), rounds_p(dev.params()));
  EXPECT_EQ(e.failures, 0) << e.first_failure;
}

// 8 tokens x 64-wide rows, lens at least 18, where plant(t, row, masked_row) writes bad entries
// into token t's row (and -1 in their place into the reference's) and returns how many. Each
// entry must be counted once however many head groups read it (40 heads: one group, 100: two),
// under both cache dtypes and both kernels (each producer resolves and counts keys its own way);
// the CPU refuses the planted rows with `cpu_error`.
template <class Plant>
void expect_planted_entries_masked_and_counted(const std::vector<std::string>& cpu_error,
                                               Plant plant) {
  for (const CacheDtype dtype : {kDs, CacheDtype::kBf16}) {
    for (const AttentionKernel kernel : {AttentionKernel::kDecode, AttentionKernel::kPrefill}) {
      for (const int32_t heads : {40, 100}) {
        SCOPED_TRACE(std::string(dtype == kDs ? "fp8_ds_mla" : "bf16") +
                     (kernel == AttentionKernel::kDecode ? " decode " : " prefill ") +
                     std::to_string(heads) + " heads");
        SmallProblem p(heads, 8, 64, dtype);
        p.hp.kernel = kernel;
        int32_t planted = 0;
        IndexRows masked = p.rows;
        for (int64_t t = 0; t < 8; ++t) {
          p.rows.lens[t] = std::max(p.rows.lens[t], 18);
          masked.lens[t] = p.rows.lens[t];
          for (int32_t j = 0; j < 18; ++j) {  // fill_rows leaves garbage past its lens
            int32_t& e = p.rows.data[t * 64 + j];
            if (e != -1 && (e < kPoisonSlots || e >= p.cache.num_slots())) {
              e = masked.data[t * 64 + j] = kPoisonSlots + j;
            }
          }
          planted += plant(t, &p.rows.data[t * 64], &masked.data[t * 64], p.cache.num_slots());
        }
        std::vector<double> ref_out(8 * heads * kHeadDim), ref_lse(8 * heads);
        EXPECT_TRUE(testing::IsInvalidArgument(
            sparse_attention_reference(p.hp, ref_out.data(), ref_lse.data()), cpu_error));
        DeviceProblem dev(p.hp, p.cache, p.rows, nullptr, nullptr, p.q, {});
        expect_masked_and_counted(dev, p.hp, masked, planted);
      }
    }
  }
}

// Entries in both 16-key halves of the first block.
TEST(AttentionCuda, OutOfRangeEntriesInsideTheLengthAreMaskedAndCounted) {
  SKIP_WITHOUT_GPU();
  expect_planted_entries_masked_and_counted(
      {"params.swa_indices[0][0]: slot", "is outside the cache"},
      [](int64_t t, int32_t* row, int32_t* masked, int64_t slots) {
        for (int32_t j : {0, 2, 17}) {
          row[j] = static_cast<int32_t>(slots + 1000 * t + j);
          masked[j] = -1;
        }
        return 3;
      });
}

TEST(AttentionCuda, EntriesBelowMinusOneInsideTheLengthAreMaskedAndCounted) {
  SKIP_WITHOUT_GPU();
  expect_planted_entries_masked_and_counted(
      {"params.swa_indices[0][0]: slot -2 is below -1"},
      [](int64_t t, int32_t* row, int32_t* masked, int64_t) {
        row[1] = masked[1] = -1;  // a hole: skipped, not counted
        for (int32_t j : {0, 2, 17}) {
          row[j] = j == 0 ? -2 - static_cast<int32_t>(t) : -2147483647 - 1;
          masked[j] = -1;
        }
        return 3;
      });
}

TEST(AttentionCuda, QueryGroupsMaskAndCountOutOfRangeEntriesOncePerToken) {
  SKIP_WITHOUT_GPU();
  SmallProblem p(8, 9, 64);  // groups of 2 tokens x 8 heads; the last group has one token
  p.hp.query_group_size = 2;
  p.hp.kernel = AttentionKernel::kPrefill;  // 5 groups: only forced
  int32_t planted = 0;
  IndexRows masked = p.rows;
  for (int64_t t = 0; t < 9; ++t) {
    p.rows.lens[t] = std::max(p.rows.lens[t], 4);
    masked.lens[t] = p.rows.lens[t];
    for (int32_t j : {0, 3}) {  // the same bad id in both tokens of a group: counted twice
      p.rows.data[t * 64 + j] = j == 0 ? static_cast<int32_t>(p.cache.num_slots() + 7) : -3;
      masked.data[t * 64 + j] = -1;
      ++planted;
    }
  }
  DeviceProblem dev(p.hp, p.cache, p.rows, nullptr, nullptr, p.q, {}, /*with_workspace=*/true);
  if (sparse_attention_kernel(dev.params()) != AttentionKernel::kAuto) {
    EXPECT_EQ(detail::plan_ds_mla_attention(dev.params(), sm_count(), dev.params().workspace_bytes)
                  .query_group,
              2);
  }
  expect_masked_and_counted(dev, p.hp, masked, planted);
}

TEST(AttentionCuda, QueryGroupsNeedTheirWorkspaceAndRunWithoutIt) {
  SKIP_WITHOUT_GPU();
  SmallProblem p(16, 8, 64);
  p.hp.query_group_size = 4;
  p.hp.kernel = AttentionKernel::kPrefill;
  DeviceProblem dev(p.hp, p.cache, p.rows, nullptr, nullptr, p.q, {});  // no workspace
  if (sparse_attention_kernel(dev.params()) != AttentionKernel::kAuto) {
    EXPECT_EQ(detail::plan_ds_mla_attention(dev.params(), sm_count(), 0).query_group, 1);
    EXPECT_GT(sparse_attention_workspace_bytes(dev.params()), 0);
  }
  SPARSE_SWA_ASSERT_OK(sparse_attention(dev.params()));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const AttentionComparison e =
      compare_attention(p.hp, dev.out(), dev.lse(), rounds_p(dev.params()));
  EXPECT_EQ(e.failures, 0) << e.first_failure;
}

TEST(AttentionCuda, DeviceLensOutsideTheWidthAreClamped) {
  SKIP_WITHOUT_GPU();
  SmallProblem p(8, 6, 32);
  for (int64_t i = 0; i < 6 * 32; ++i)
    p.rows.data[i] = kPoisonSlots + static_cast<int32_t>(i * 7 % 200);
  DeviceProblem dev(p.hp, p.cache, p.rows, nullptr, nullptr, p.q, {});
  const std::vector<int32_t> wild = {-5, 33, 1000000, 0, 32, -2147483647 - 1};
  dev.swa_lens().upload(wild);
  SPARSE_SWA_ASSERT_OK(sparse_attention(dev.params()));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int t = 0; t < 6; ++t) p.rows.lens[t] = std::clamp(wild[t], 0, 32);
  const AttentionComparison e =
      compare_attention(p.hp, dev.out(), dev.lse(), rounds_p(dev.params()));
  EXPECT_EQ(e.failures, 0) << e.first_failure;
}

TEST(AttentionCuda, GraphCaptureAndReplayAfterInPlaceUpdates) {
  SKIP_WITHOUT_GPU();
  SmallProblem p(16, 32, 128);
  DeviceProblem dev(p.hp, p.cache, p.rows, nullptr, nullptr, p.q, {});
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  const Status st = sparse_attention(dev.params(), stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  SPARSE_SWA_ASSERT_OK(st);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int step = 0; step < 3; ++step) {
    std::mt19937 rng(1000 + step);
    fill_rows(&p.rows, p.cache.num_slots(), &rng);  // new rows, same addresses
    dev.swa_idx().upload(p.rows.data);
    dev.swa_lens().upload(p.rows.lens);
    dev.poison_outputs();
    // The uploads and the poison ran on the legacy stream, which a non-blocking stream does
    // not wait for.
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const AttentionComparison e =
        compare_attention(p.hp, dev.out(), dev.lse(), rounds_p(dev.params()));
    EXPECT_EQ(e.failures, 0) << "replay " << step << ": " << e.first_failure;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(AttentionCuda, ConstantRowsGiveTheConstantExactly) {
  SKIP_WITHOUT_GPU();
  // bf16 cache whose keys [16, 216) are all the same row c; past lens: different keys.
  HostCache cache(kBf, 64, 512, 5);
  std::vector<float> c(kHeadDim);
  for (int d = 0; d < kHeadDim; ++d)
    c[d] = fp8::bf16_to_float(fp8::float_to_bf16(0.37f * (d % 11) - 1.5f));
  std::vector<float> same;
  std::vector<int64_t> slots;
  for (int i = 16; i < 216; ++i) {
    same.insert(same.end(), c.begin(), c.end());
    slots.push_back(i);
  }
  SPARSE_SWA_ASSERT_OK(encode_kv_rows({same.data(), 200, kHeadDim, kHeadDim}, slots, cache.view()));
  const int32_t T = 5, H = 24, W = 256;
  IndexRows rows(T, W, W);
  for (int t = 0; t < T; ++t) {
    rows.lens[t] = 150 + t;
    for (int j = 0; j < W; ++j)
      rows.data[t * W + j] = j < rows.lens[t] ? 16 + (j * 13 + t) % 200 : 300 + j;
  }
  const std::vector<uint16_t> q = random_q(T * H, 6);
  SparseAttentionParams hp;
  hp.num_tokens = T;
  hp.num_heads = H;
  hp.q = q.data();
  hp.swa_cache = cache.view();
  hp.swa_indices = rows.view();
  DeviceProblem dev(hp, cache, rows, nullptr, nullptr, q, {});
  SPARSE_SWA_ASSERT_OK(sparse_attention(dev.params()));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> out = dev.out();
  for (int64_t i = 0; i < T * H * kHeadDim; ++i)
    ASSERT_EQ(fp8::bf16_to_float(out[i]), c[i % kHeadDim]) << i;
}

TEST(AttentionCuda, HostStagedEntryPointMatchesTheDevicePath) {
  SKIP_WITHOUT_GPU();
  SmallProblem p(5, 12, 96);
  std::vector<uint16_t> out(12 * 5 * kHeadDim, 0xffff);
  std::vector<float> lse(12 * 5, std::nanf(""));
  SparseAttentionParams hp = p.hp;
  hp.out = out.data();
  hp.lse = lse.data();
  SPARSE_SWA_ASSERT_OK(sparse_attention_cuda_from_host(hp));
  DeviceProblem dev(p.hp, p.cache, p.rows, nullptr, nullptr, p.q, {});
  SPARSE_SWA_ASSERT_OK(sparse_attention(dev.params()));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(out, dev.out());
  const AttentionComparison e = compare_attention(p.hp, out, lse, rounds_p(dev.params()));
  EXPECT_EQ(e.failures, 0) << e.first_failure;
}

TEST(AttentionCuda, HostPointersAreRefusedBeforeLaunch) {
  SKIP_WITHOUT_GPU();
  SmallProblem p(4, 2, 16);
  DeviceProblem dev(p.hp, p.cache, p.rows, nullptr, nullptr, p.q, {});
  SparseAttentionParams bad = dev.params();
  bad.q = p.q.data();
  EXPECT_TRUE(testing::IsInvalidArgument(sparse_attention(bad),
                                         {"params.q: expected device or managed memory"}));
  bad = dev.params();
  bad.swa_cache.data = p.cache.bytes.data();
  EXPECT_TRUE(testing::IsInvalidArgument(sparse_attention(bad), {"params.swa_cache.data"}));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// A caller that knows its pointers' device (the Python binding, from DLPack) skips the driver
// queries: the result is the same, and the device, null pointers and alignment are still checked.
TEST(AttentionCuda, KnownPointerDeviceSkipsTheQueriesButNotTheChecks) {
  SKIP_WITHOUT_GPU();
  int device = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  SmallProblem p(6, 20, 80);
  DeviceProblem dev(p.hp, p.cache, p.rows, nullptr, nullptr, p.q, {});
  SparseAttentionParams known = dev.params();
  known.pointers_device = device;
  SPARSE_SWA_ASSERT_OK(sparse_attention(known));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const AttentionComparison e =
      compare_attention(p.hp, dev.out(), dev.lse(), rounds_p(dev.params()));
  EXPECT_EQ(e.failures, 0) << e.first_failure;

  SparseAttentionParams bad = known;
  bad.pointers_device = device + 1;
  EXPECT_TRUE(testing::IsInvalidArgument(sparse_attention(bad),
                                         {"params.pointers_device: expected the current device"}));
  bad = known;
  bad.out = nullptr;
  EXPECT_TRUE(testing::IsInvalidArgument(sparse_attention(bad), {"params.out"}));
  bad = known;
  bad.swa_indices.lens = nullptr;
  EXPECT_TRUE(testing::IsInvalidArgument(sparse_attention(bad), {"params.swa_indices", "lens"}));
  bad = known;
  bad.out = known.out + 4;
  EXPECT_TRUE(testing::IsInvalidArgument(sparse_attention(bad),
                                         {"params.out: expected a 16-byte aligned address"}));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// The kernels move q and out in 16-byte pieces: a pointer off that alignment (a view starting
// mid-row) is an error naming the field, never a misaligned access on the device.
TEST(AttentionCuda, MisalignedPointersAreRefusedBeforeLaunch) {
  SKIP_WITHOUT_GPU();
  SmallProblem p(4, 2, 16);
  DeviceProblem dev(p.hp, p.cache, p.rows, nullptr, nullptr, p.q, {});
  SparseAttentionParams bad = dev.params();
  bad.q = dev.params().q + 1;
  EXPECT_TRUE(testing::IsInvalidArgument(sparse_attention(bad),
                                         {"params.q: expected a 16-byte aligned address"}));
  bad = dev.params();
  bad.out = dev.params().out + 4;  // 8 bytes: enough for 4-byte stores, not for 16
  EXPECT_TRUE(testing::IsInvalidArgument(sparse_attention(bad),
                                         {"params.out: expected a 16-byte aligned address"}));
  bad = dev.params();
  bad.lse = reinterpret_cast<float*>(reinterpret_cast<char*>(dev.params().lse) + 2);
  EXPECT_TRUE(testing::IsInvalidArgument(sparse_attention(bad),
                                         {"params.lse: expected a 4-byte aligned address"}));
  bad = dev.params();
  bad.swa_indices.lens =
      reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(bad.swa_indices.lens) + 1);
  EXPECT_TRUE(testing::IsInvalidArgument(
      sparse_attention(bad), {"params.swa_indices.lens: expected a 4-byte aligned address"}));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(AttentionCuda, KeysOfExtremeScaleMatchTheReference) {
  SKIP_WITHOUT_GPU();
  // fp8_ds_mla rows around 2^16 and 2^-110 (scale bytes near 136 and 10) beside ordinary rows;
  // tokens draw their keys from one class or from all three. Queries that meet 2^16 keys are scaled
  // by 2^-16 so the scores stay near 1 (an lse near 2^16 would leave fp32 too few digits for the
  // comparison).
  const int32_t kSlots = 512, T = 12, H = 64, W = 96;
  HostCache cache(kDs, 64, kSlots, 41);
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> rows(int64_t{kSlots} * kHeadDim);
  std::vector<int64_t> slots(kSlots);
  for (int32_t s = 0; s < kSlots; ++s) {
    const float scale = s % 3 == 0 ? 0x1p16f : (s % 3 == 1 ? 0x1p-110f : 1.0f);
    for (int d = 0; d < kHeadDim; ++d) {
      // Large rows positive: weighted sums of +-2^16 that cancel to ~1 would leave fp32 (ours and
      // the fp32 reference's, in different orders) a few digits only.
      const float x = normal(rng);
      rows[int64_t{s} * kHeadDim + d] = (s % 3 == 0 ? std::abs(x) + 0.5f : x) * scale;
    }
    slots[s] = s;
  }
  SPARSE_SWA_ASSERT_OK(
      encode_kv_rows({rows.data(), kSlots, kHeadDim, kHeadDim}, slots, cache.view()));
  IndexRows idx(T, W, W);
  for (int32_t t = 0; t < T; ++t) {
    idx.lens[t] = W - t;
    for (int32_t j = 0; j < W; ++j) {
      const int32_t pick = static_cast<int32_t>(rng() % (kSlots / 3));
      idx.data[t * W + j] = t % 4 == 3 ? static_cast<int32_t>(rng() % kSlots) : 3 * pick + t % 4;
    }
  }
  std::vector<uint16_t> q = random_q(int64_t{T} * H, 43);
  for (int32_t t = 0; t < T; ++t) {
    if (t % 4 == 1 || t % 4 == 2) continue;
    for (int64_t i = int64_t{t} * H * kHeadDim; i < int64_t{t + 1} * H * kHeadDim; ++i) {
      q[i] = fp8::float_to_bf16(fp8::bf16_to_float(q[i]) * 0x1p-16f);  // exact
    }
  }
  SparseAttentionParams hp;
  hp.num_tokens = T;
  hp.num_heads = H;
  hp.q = q.data();
  hp.swa_cache = cache.view();
  hp.swa_indices = idx.view();
  DeviceProblem dev(hp, cache, idx, nullptr, nullptr, q, {});
  SPARSE_SWA_ASSERT_OK(sparse_attention(dev.params()));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const AttentionComparison e = compare_attention(hp, dev.out(), dev.lse(), rounds_p(dev.params()));
  EXPECT_EQ(e.failures, 0) << e.first_failure;
}

TEST(AttentionCuda, KernelChoiceFollowsTheShapesAndCanBeForced) {
  SKIP_WITHOUT_GPU();
  int device = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  HostCache bf(kBf, 64, 256, 7);
  IndexRows many(sms, 640, 640), half(sms / 2, 640, 640), few(4, 640, 640), narrow(4, 63, 63);
  std::vector<uint16_t> q = random_q(int64_t{sms} * 64, 8);
  SparseAttentionParams p;
  p.num_heads = 64;
  p.q = q.data();
  p.swa_cache = bf.view();
  p.swa_cache.space = MemorySpace::kDevice;  // views only: nothing runs
  int64_t unused_workspace = 0;
  auto kernel_for = [&](const IndexRows& rows, CacheDtype dtype, AttentionKernel forced,
                        bool workspace) {
    p.num_tokens = rows.rows;
    p.swa_indices = rows.view();
    p.swa_indices.space = MemorySpace::kDevice;
    p.swa_cache.dtype = dtype;
    p.kernel = forced;
    p.workspace = workspace ? &unused_workspace : nullptr;
    p.workspace_bytes = workspace ? sparse_attention_max_workspace_bytes() : 0;
    return sparse_attention_kernel(p);
  };
  const AttentionKernel kAuto = AttentionKernel::kAuto, kDec = AttentionKernel::kDecode;
  if (kernel_for(many, kBf, kAuto, true) == kAuto) GTEST_SKIP() << "no sm_90a code here";
  for (const CacheDtype dtype : {kBf, kDs}) {
    // Tokens x head groups that fill the SMs: never split, the prefill kernel.
    EXPECT_EQ(kernel_for(many, dtype, kAuto, true), kPre);
    // Small batches of long rows split with a workspace, not without one: over the prefill
    // kernel where its slices get two pairs of blocks or more, else over the decode kernel.
    EXPECT_EQ(kernel_for(half, dtype, kAuto, true), kPre);
    EXPECT_EQ(kernel_for(few, dtype, kAuto, true), kDec);
    EXPECT_EQ(kernel_for(few, dtype, kAuto, false), kPre);
    EXPECT_EQ(kernel_for(narrow, dtype, kAuto, true), kPre);  // too few keys to split
    EXPECT_EQ(kernel_for(many, dtype, kDec, false), kDec);
    EXPECT_EQ(kernel_for(few, dtype, kPre, true), kPre);
  }
  EXPECT_EQ(kernel_for(many, kE4, kDec, false), kAuto);  // the general kernel's cache
}

TEST(AttentionCuda, ForcedKernelsThatCannotTakeTheCallAreRefused) {
  SKIP_WITHOUT_GPU();
  SmallProblem p(16, 4, 64);  // fp8_ds_mla
  DeviceProblem dev(p.hp, p.cache, p.rows, nullptr, nullptr, p.q, {});
  if (sparse_attention_kernel(dev.params()) == AttentionKernel::kAuto) {
    GTEST_SKIP() << "no sm_90a code for this device";
  }
  SmallProblem e4(16, 4, 64, kE4);
  DeviceProblem e4_dev(e4.hp, e4.cache, e4.rows, nullptr, nullptr, e4.q, {});
  SparseAttentionParams bad = e4_dev.params();
  bad.kernel = AttentionKernel::kPrefill;
  EXPECT_TRUE(testing::IsInvalidArgument(
      sparse_attention(bad),
      {"params.kernel", "read fp8_ds_mla or bf16 caches, both segments alike, got fp8_e4m3"}));
  bad = dev.params();
  bad.kernel = static_cast<AttentionKernel>(7);
  EXPECT_TRUE(testing::IsInvalidArgument(
      sparse_attention(bad), {"params.kernel: expected kAuto (0), kDecode (1) or kPrefill (2), "
                              "got 7"}));
  bad.kernel = AttentionKernel::kDecode;
  SPARSE_SWA_EXPECT_OK(sparse_attention(bad));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const AttentionComparison e =
      compare_attention(p.hp, dev.out(), dev.lse(), rounds_p(dev.params()));
  EXPECT_EQ(e.failures, 0) << e.first_failure;
}

// The plan of the tensor-core kernels is host arithmetic on shapes: checked here without a device
// (docs/design.md#attention-kernels). A partial row is 512 fp32 + (max, sum) = 2056 bytes.
TEST(AttentionPlan, SplitsSmallBatchesOfLongRowsOverEitherKernel) {
  constexpr int kSms = 132;
  constexpr int64_t kRow = 2056;
  SparseAttentionParams p;
  p.num_heads = 64;
  p.swa_indices.width = 640;  // 20 tiles of 32 keys
  auto plan = [&](int64_t tokens, int64_t workspace) {
    p.num_tokens = tokens;
    p.swa_indices.rows = tokens;
    return detail::plan_ds_mla_attention(p, kSms, workspace);
  };
  // 4 tokens x 1 group: 33 CTAs per token would fill the SMs: the prefill kernel's slices would
  // be one pair of blocks, so the decode kernel takes 20 slices of 1 tile.
  detail::DsMlaPlan d = plan(4, -1);
  EXPECT_FALSE(d.prefill);
  EXPECT_EQ(d.groups, 1);
  EXPECT_EQ(d.splits, 20);
  EXPECT_EQ(d.workspace_bytes, 20 * 4 * 64 * kRow);
  EXPECT_FALSE(d.cluster_merge);      // the decode kernel's slices: the merge kernel
  EXPECT_EQ(plan(8, -1).splits, 16);  // 132 / 8 SMs per token
  // 16 tokens: 8 CTAs per token, the prefill kernel's 10 pairs in 5 slices of 2; 64 tokens: 2.
  d = plan(16, -1);
  EXPECT_TRUE(d.prefill);
  EXPECT_EQ(d.splits, 5);
  EXPECT_EQ(d.workspace_bytes, 5 * 16 * 64 * kRow);
  EXPECT_TRUE(d.cluster_merge);  // a cluster of 5 per token, merged in the kernel
  EXPECT_TRUE(plan(64, -1).cluster_merge);
  EXPECT_TRUE(plan(64, -1).prefill);
  EXPECT_EQ(plan(64, -1).splits, 2);
  // A workspace for 3 slices gives 3; none (or too small for 2) gives the prefill kernel.
  d = plan(4, 3 * 4 * 64 * kRow + 100);
  EXPECT_FALSE(d.prefill);
  EXPECT_EQ(d.splits, 3);
  for (const int64_t workspace : {int64_t{0}, 2 * 4 * 64 * kRow - 1}) {
    d = plan(4, workspace);
    EXPECT_TRUE(d.prefill) << workspace;
    EXPECT_EQ(d.splits, 1);
    EXPECT_EQ(d.workspace_bytes, 0);
  }
  // Tokens x groups that fill the SMs never split.
  d = plan(kSms, -1);
  EXPECT_TRUE(d.prefill);
  EXPECT_EQ(d.splits, 1);
  p.num_heads = 128;  // 2 groups: 66 tokens fill the SMs, 65 do not (splits 132 / 130 = 1 anyway)
  EXPECT_TRUE(plan(66, -1).prefill);
  EXPECT_EQ(plan(66, -1).groups, 2);
  EXPECT_TRUE(plan(65, -1).prefill);
  EXPECT_TRUE(plan(33, -1).prefill);  // 66 CTAs: 2 slices of 5 pairs each
  EXPECT_EQ(plan(33, -1).splits, 2);
  p.num_heads = 64;
  // Fewer than 8 tiles (SWA 128 + extra 96 = 224 keys, 7 tiles): never split.
  p.swa_indices.width = 128;
  p.extra_indices.rows = 1;
  p.extra_indices.width = 96;
  EXPECT_TRUE(plan(1, -1).prefill);
  p.extra_indices.width = 129;  // 257 keys: 9 tiles, 9 slices of one
  EXPECT_FALSE(plan(1, -1).prefill);
  EXPECT_EQ(plan(1, -1).splits, 9);
  EXPECT_EQ(plan(16, -1).splits, 8);  // 132 / 16 SMs per token (5 pairs: one per slice)
  // Forced kernels: the prefill kernel splits into single pairs too.
  p.kernel = AttentionKernel::kPrefill;
  d = plan(1, -1);
  EXPECT_TRUE(d.prefill);
  EXPECT_EQ(d.splits, 5);
  EXPECT_EQ(d.workspace_bytes, 5 * 64 * kRow);
  EXPECT_TRUE(d.cluster_merge);
  p.extra_indices.width = 512;  // 640 keys, 10 pairs: 10 slices, more than a cluster holds
  d = plan(1, -1);
  EXPECT_EQ(d.splits, 10);
  EXPECT_FALSE(d.cluster_merge);
  EXPECT_EQ(d.workspace_bytes, 10 * 64 * kRow);
  p.extra_indices.width = 129;
  d = plan(1, 0);  // no workspace: unsplit
  EXPECT_TRUE(d.prefill);
  EXPECT_EQ(d.splits, 1);
  p.kernel = AttentionKernel::kDecode;
  d = plan(kSms, -1);
  EXPECT_FALSE(d.prefill);
  EXPECT_EQ(d.splits, 1);
}

// Query groups: the unions' workspace is [G, cap] slots and token bits and [G, 2] lens, each
// rounded up to 16 bytes; the prefill kernel takes them, unsplit.
TEST(AttentionPlan, QueryGroupsTakeThePrefillKernelWhenTheyFillTheSms) {
  constexpr int kSms = 132;
  SparseAttentionParams p;
  p.num_heads = 8;
  p.swa_indices.width = 128;
  p.extra_indices.rows = 1;
  p.extra_indices.width = 512;
  p.query_group_size = 2;
  auto plan = [&](int64_t tokens, int64_t workspace) {
    p.num_tokens = tokens;
    p.swa_indices.rows = tokens;
    p.extra_indices.rows = tokens;
    return detail::plan_ds_mla_attention(p, kSms, workspace);
  };
  auto union_bytes = [](int64_t groups, int64_t cap) {
    return 2 * ((groups * cap * 4 + 15) / 16 * 16) + (groups * 8 + 15) / 16 * 16;
  };
  // 600 tokens = 300 groups of 2 x 8 heads (16 rows), unions of at most 1280 entries.
  detail::DsMlaPlan d = plan(600, -1);
  EXPECT_EQ(d.query_group, 2);
  EXPECT_EQ(d.group_cap, 1280);
  EXPECT_TRUE(d.prefill);
  EXPECT_EQ(d.splits, 1);
  EXPECT_EQ(d.workspace_bytes, union_bytes(300, 1280));
  EXPECT_EQ(plan(600, union_bytes(300, 1280)).query_group, 2);
  d = plan(600, union_bytes(300, 1280) - 1);  // no room for the unions: no groups
  EXPECT_EQ(d.query_group, 1);
  EXPECT_TRUE(d.prefill);
  EXPECT_EQ(d.workspace_bytes, 0);
  // 264 tokens = 132 groups fill the SMs; 262 (131 groups) do not: the usual plan.
  EXPECT_EQ(plan(264, -1).query_group, 2);
  d = plan(262, -1);
  EXPECT_EQ(d.query_group, 1);
  EXPECT_TRUE(d.prefill);  // 262 tokens fill the SMs without splits
  d = plan(64, -1);
  EXPECT_EQ(d.query_group, 1);
  EXPECT_TRUE(d.prefill);  // 64 tokens: two slices each, no groups
  EXPECT_EQ(d.splits, 2);
  // Forced: the prefill kernel takes groups at any count, the decode kernel never.
  p.kernel = AttentionKernel::kPrefill;
  d = plan(128, -1);
  EXPECT_EQ(d.query_group, 2);
  EXPECT_TRUE(d.prefill);
  EXPECT_EQ(d.workspace_bytes, union_bytes(64, 1280));
  p.kernel = AttentionKernel::kDecode;
  EXPECT_EQ(plan(600, -1).query_group, 1);
  p.kernel = AttentionKernel::kAuto;
  // Rows past one CTA (2 x 64 heads), entries past one union CTA (8 x 640), bf16 caches: none.
  p.num_heads = 64;
  EXPECT_EQ(plan(600, -1).query_group, 1);
  p.num_heads = 8;
  p.query_group_size = 8;
  EXPECT_EQ(plan(2400, -1).query_group, 1);
  p.query_group_size = 2;
  p.swa_cache.dtype = CacheDtype::kBf16;
  p.extra_cache.dtype = CacheDtype::kBf16;
  EXPECT_EQ(plan(600, -1).query_group, 1);
}

}  // namespace
}  // namespace sparse_swa
