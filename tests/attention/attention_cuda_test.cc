// SPDX-License-Identifier: Apache-2.0
// CUDA sparse attention vs the CPU reference on random data (never zeros) over a sample of
// heads x widths x extra widths x page sizes x batches x cache dtypes x kernels, outputs poisoned
// first; the paths the plan leaves to few shapes also with what detail::AttentionOverrides forces
// (CTAs that walk many items, 1-16 heads on the 64-row kernel, every split through the merge
// kernel). Tolerance: tests/testing/attention_compare.h (elementwise against the double and fp32
// references; NaN never passes). The problems: tests/support/attention_cuda_problem.h.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention/overrides.h"
#include "attention/sm90_plan.h"
#include "sparse_swa/attention.h"
#include "support/attention_cuda_problem.h"
#include "support/device_array.h"
#include "support/status_matchers.h"
#include "testing/attention_compare.h"

namespace sparse_swa {
namespace {

constexpr float kInfF = std::numeric_limits<float>::infinity();

using testing::AttentionComparison;
using testing::compare_attention;
using testing::DeviceProblem;
using testing::fill_rows;
using testing::HostCache;
using testing::IndexRows;
using testing::kBf;
using testing::kDs;
using testing::kE4;
using testing::random_q;
using testing::share_within_groups;
using testing::sm_count;

struct Shape {
  int32_t heads, width, extra_width, swa_block, extra_block, tokens;
  CacheDtype swa_dtype, extra_dtype;
  bool sinks;
  bool split = false;  // give the call a workspace, so small batches split their keys
  AttentionKernel kernel = AttentionKernel::kAuto;
  int32_t group = 1;  // query_group_size; > 1: rows of a group share keys (share_within_groups)
  detail::AttentionOverrides overrides = {};
};

// The forced paths of a shape (AttentionOverrides beside the defaults), for names.
std::string overrides_name(const detail::AttentionOverrides& o) {
  std::string name;
  if (!o.few_heads) name += "_no_few_heads";
  if (!o.decoded_keys) name += "_direct";
  if (!o.cluster_merge) name += "_merge_kernel";
  if (o.max_walking_ctas > 0) name += "_walk" + std::to_string(o.max_walking_ctas);
  return name;
}

std::string describe(const Shape& s) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "H=%d W=%d E=%d B=%d/%d T=%d %s/%s%s%s %s G=%d%s", s.heads,
                s.width, s.extra_width, s.swa_block, s.extra_block, s.tokens,
                cache_dtype_name(s.swa_dtype), cache_dtype_name(s.extra_dtype),
                s.sinks ? " sinks" : "", s.split ? " split" : "", attention_kernel_name(s.kernel),
                s.group, overrides_name(s.overrides).c_str());
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
    // Every grouped shape below is one the pair kernel takes as query groups.
    EXPECT_EQ(detail::plan_sm90_attention(dev.params(), detail::SmCapacity::ideal(sm_count()),
                                          dev.params().workspace_bytes)
                  .query_group,
              s.group)
        << describe(s);
  }
  const AttentionKernel kernel = sparse_attention_kernel(dev.params());
  if (s.kernel != AttentionKernel::kAuto) EXPECT_EQ(kernel, s.kernel) << describe(s);
  SPARSE_SWA_ASSERT_OK(detail::sparse_attention_with(dev.params(), s.overrides));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const AttentionComparison e =
      compare_attention(hp, dev.out(), dev.lse(), kernel == AttentionKernel::kSm90Pairs);
  EXPECT_EQ(e.failures, 0) << describe(s) << ": " << e.failures
                           << " elements out of tolerance; first: " << e.first_failure;
  EXPECT_EQ(dev.bad_count(), 0);
  g_max_err = std::max(g_max_err, e.max_err);
  g_max_float_ref_err = std::max(g_max_float_ref_err, e.max_float_ref_err);
  g_max_lse_err = std::max(g_max_lse_err, e.max_lse_err);
  std::printf("[ attention ] %-52s max err %.3g (fp32 ref %.3g), lse %.3g\n", describe(s).c_str(),
              e.max_err, e.max_float_ref_err, e.max_lse_err);
}

std::string shape_name(const ::testing::TestParamInfo<Shape>& info) {
  const Shape& s = info.param;
  return "H" + std::to_string(s.heads) + "_W" + std::to_string(s.width) + "_E" +
         std::to_string(s.extra_width) + "_B" + std::to_string(s.swa_block) + "x" +
         std::to_string(s.extra_block) + "_T" + std::to_string(s.tokens) + "_" +
         cache_dtype_name(s.swa_dtype) + (s.sinks ? "_sinks" : "") + (s.split ? "_split" : "") +
         (s.kernel != AttentionKernel::kAuto ? std::string("_") + attention_kernel_name(s.kernel)
                                             : std::string()) +
         (s.group > 1 ? "_G" + std::to_string(s.group) : "") + overrides_name(s.overrides);
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

// `shapes`, each run with `overrides`.
std::vector<Shape> with_overrides(std::vector<Shape> shapes, detail::AttentionOverrides overrides) {
  for (Shape& s : shapes) s.overrides = overrides;
  return shapes;
}
// The bf16 pair and few-heads kernels' CTAs capped at 2, so that each walks many items.
detail::AttentionOverrides walk2() {
  detail::AttentionOverrides o;
  o.max_walking_ctas = 2;
  return o;
}

// Small batches with a workspace: the keys of each token are split over several CTAs and merged
// (fp8_ds_mla caches; heads not a multiple of 16, widths not a multiple of 32, page size 2). The
// merge kernel reads the splits in batches, 128 threads a row up to ~1056 rows on 132 SMs and a
// warp a row past that: 1 token x 64 heads (10 slices; 20 with the tile32 kernel forced) and
// 20 x 64 with the tile32 kernel forced (1280 rows, 6 splits) take each. Unforced, every shape
// takes the pair kernel's slices of pairs; each kernel forced takes them all. The pair
// kernel's 2-8 slices merge inside a cluster from 16 (token, head group) items on (64 tokens x 32
// heads: 2 slices; 40 x 64: 3, or 2 where 40 clusters of 3 do not run at once, as on an H100;
// 16 and 20 x 64: 5) and, forced, at any count (8 x 8: 6, 1 x 16: 7, 1 x 100: 8); fewer items
// and more slices (4 x 128: 9, 5 x 48: 20) go through the merge kernel.
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

// Past one wave of CTAs on 132 SMs (the tile32 kernel never splits these;
// docs/design.md#splits): 134 tokens x 3 heads over 896 keys run 132 tokens whole and the last 2
// in 14 slices; 67 x 65 heads (two head groups, the second of one head) over 512 keys run 66
// whole and the last token's two items in 8 slices. On bf16 rows (the bf16 kernel's CTAs walk
// items; its pairs are of 64-key blocks): 133 x 20 heads over 640 keys, the last token in 5
// slices, and 265 x 20 (past two waves) the same; 67 x 65 over 512 keys, the last token's two
// items in 4.
std::vector<Shape> last_wave_shapes(AttentionKernel kernel) {
  return with_kernel({Shape{3, 128, 768, 64, 2, 134, kDs, kDs, false, true},
                      Shape{65, 128, 384, 64, 2, 67, kDs, kDs, true, true},
                      Shape{20, 128, 512, 64, 64, 133, kBf, kBf, true, true},
                      Shape{20, 128, 512, 64, 2, 265, kBf, kBf, false, true},
                      Shape{65, 128, 384, 2, 64, 67, kBf, kBf, false, true}},
                     kernel);
}
INSTANTIATE_TEST_SUITE_P(SplitShapes, AttentionCudaVsCpu,
                         ::testing::ValuesIn(split_shapes(AttentionKernel::kAuto)), shape_name);
// The same with the pair kernels' 2-8 slices merged by the merge kernel instead of in clusters.
INSTANTIATE_TEST_SUITE_P(SplitShapesMergeKernel, AttentionCudaVsCpu,
                         ::testing::ValuesIn(with_overrides(split_shapes(AttentionKernel::kAuto),
                                                            [] {
                                                              detail::AttentionOverrides o;
                                                              o.cluster_merge = false;
                                                              return o;
                                                            }())),
                         shape_name);
INSTANTIATE_TEST_SUITE_P(SplitPairsKernelShapes, AttentionCudaVsCpu,
                         ::testing::ValuesIn(split_shapes(AttentionKernel::kSm90Pairs)),
                         shape_name);
INSTANTIATE_TEST_SUITE_P(SplitTile32KernelShapes, AttentionCudaVsCpu,
                         ::testing::ValuesIn(split_shapes(AttentionKernel::kSm90Tile32)),
                         shape_name);
INSTANTIATE_TEST_SUITE_P(LastWaveShapes, AttentionCudaVsCpu,
                         ::testing::ValuesIn(last_wave_shapes(AttentionKernel::kAuto)), shape_name);
INSTANTIATE_TEST_SUITE_P(
    LastWaveShapesWalk2, AttentionCudaVsCpu,
    ::testing::ValuesIn(with_overrides(last_wave_shapes(AttentionKernel::kAuto), walk2())),
    shape_name);
INSTANTIATE_TEST_SUITE_P(LastWavePairsKernelShapes, AttentionCudaVsCpu,
                         ::testing::ValuesIn(last_wave_shapes(AttentionKernel::kSm90Pairs)),
                         shape_name);

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
// bf16 pair kernel walks several items (docs/design.md#attention-kernels): rows staged and
// stored by the tensor map (40 and 64 heads) or straight from registers (8), odd block counts,
// lens 0 and full, -1 holes; and with every CTA walking many items (walk2).
std::vector<Shape> walking_shapes() {
  return {Shape{64, 128, 64, 64, 2, 300, kBf, kBf, true},
          Shape{40, 63, 100, 2, 64, 200, kBf, kBf, false},
          Shape{8, 100, 0, 64, 0, 400, kBf, kBf, true}};
}
INSTANTIATE_TEST_SUITE_P(WalkingShapes, AttentionCudaVsCpu, ::testing::ValuesIn(walking_shapes()),
                         shape_name);
INSTANTIATE_TEST_SUITE_P(WalkingShapesWalk2, AttentionCudaVsCpu,
                         ::testing::ValuesIn(with_overrides(walking_shapes(), walk2())),
                         shape_name);

// The few-heads kernel (docs/design.md#few-heads): 1..16 heads on bf16 rows, the keys in the
// MMA's M dimension with 8 columns (1-8 heads) or 16 (9-16); more tokens than SMs (each CTA walks
// items) and fewer, widths 1 to 2048, page sizes 2, 64 and 256, lens 0 and full, -1 holes. With a
// workspace past one wave on 132 SMs, the last wave's tokens take slices merged by the merge
// kernel (docs/design.md#splits): 133 x 8 heads over 640 keys, the last token in 5 slices; 265 x
// 13 over 700 (two waves + 1: 6 slices, the last of 60 keys); 140 x 3 over 300, the last 8 tokens
// in 3 slices (128, 128 and 44 keys). The same shapes also with every CTA walking many items, and
// on the 64-row bf16 kernel.
std::vector<Shape> few_heads_shapes() {
  return {Shape{1, 1, 0, 2, 0, 300, kBf, kBf, false},
          Shape{5, 63, 100, 64, 2, 200, kBf, kBf, true},
          Shape{8, 640, 0, 256, 0, 150, kBf, kBf, false},
          Shape{9, 128, 512, 64, 64, 140, kBf, kBf, true},
          Shape{16, 128, 1024, 64, 256, 300, kBf, kBf, false},
          Shape{16, 2048, 0, 64, 0, 20, kBf, kBf, true},
          Shape{12, 200, 300, 2, 64, 33, kBf, kBf, true, false, AttentionKernel::kSm90Pairs},
          Shape{8, 128, 512, 64, 64, 133, kBf, kBf, true, true},
          Shape{13, 128, 572, 2, 64, 265, kBf, kBf, false, true},
          Shape{3, 100, 200, 64, 2, 140, kBf, kBf, true, true}};
}
INSTANTIATE_TEST_SUITE_P(FewHeadsShapes, AttentionCudaVsCpu,
                         ::testing::ValuesIn(few_heads_shapes()), shape_name);
INSTANTIATE_TEST_SUITE_P(FewHeadsShapesWalk2, AttentionCudaVsCpu,
                         ::testing::ValuesIn(with_overrides(few_heads_shapes(), walk2())),
                         shape_name);
INSTANTIATE_TEST_SUITE_P(FewHeadsShapesOn64Rows, AttentionCudaVsCpu,
                         ::testing::ValuesIn(with_overrides(few_heads_shapes(),
                                                            [] {
                                                              detail::AttentionOverrides o;
                                                              o.few_heads = false;
                                                              return o;
                                                            }())),
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
INSTANTIATE_TEST_SUITE_P(SplitBf16PairsKernelShapes, AttentionCudaVsCpu,
                         ::testing::ValuesIn(split_bf16_shapes(AttentionKernel::kSm90Pairs)),
                         shape_name);

// The pair kernels, forced, on both cache dtypes: heads 1..128 (not multiples of 16 too),
// widths 1 to 2048 (odd block counts: of 32 keys for fp8_ds_mla, of 64 for bf16; tails), both
// segments or one, page sizes 2, 64 and 256; lens 0, full and between, -1 holes (fill_rows).
constexpr AttentionKernel kPre = AttentionKernel::kSm90Pairs;
std::vector<Shape> pairs_kernel_shapes() {
  return {Shape{1, 1, 0, 2, 0, 40, kBf, kBf, false, false, kPre},
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
          Shape{16, 2048, 0, 256, 0, 12, kDs, kDs, false, false, kPre}};
}
INSTANTIATE_TEST_SUITE_P(PairsKernelShapes, AttentionCudaVsCpu,
                         ::testing::ValuesIn(pairs_kernel_shapes()), shape_name);
// The bf16 ones with every CTA of the bf16 kernels walking many items.
std::vector<Shape> bf16_pairs_kernel_shapes_walk2() {
  std::vector<Shape> bf16;
  for (const Shape& s : pairs_kernel_shapes()) {
    if (s.swa_dtype == kBf) bf16.push_back(s);
  }
  return with_overrides(bf16, walk2());
}
INSTANTIATE_TEST_SUITE_P(PairsKernelShapesWalk2, AttentionCudaVsCpu,
                         ::testing::ValuesIn(bf16_pairs_kernel_shapes_walk2()), shape_name);

// The tile32 kernel unsplit (the pair kernels take these shapes by default): every cache dtype
// it reads, heads and widths as above.
constexpr AttentionKernel kDec = AttentionKernel::kSm90Tile32;
INSTANTIATE_TEST_SUITE_P(
    Tile32KernelShapes, AttentionCudaVsCpu,
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
// repeat inside a row; the fp8_ds_mla pair kernel walks each group's union once. Unforced
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

}  // namespace
}  // namespace sparse_swa
