// SPDX-License-Identifier: Apache-2.0
// Behaviour of the CUDA sparse attention beyond the sampled shapes: one workspace bounds every
// call, bad index entries are masked and counted, device lens outside 0..width are clamped, graph
// capture and replay, constant rows give the constant exactly, keys of extreme scale, the
// host-staged entry point, pointer and kernel checks before launch, the kernel choice.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention/overrides.h"
#include "attention/sm90_plan.h"
#include "common/fp8_e4m3.h"
#include "sparse_swa/attention.h"
#include "support/attention_cuda_problem.h"
#include "support/device_array.h"
#include "support/status_matchers.h"
#include "testing/attention_compare.h"

namespace sparse_swa {
namespace {

using testing::AttentionComparison;
using testing::compare_attention;
using testing::DeviceProblem;
using testing::fill_rows;
using testing::HostCache;
using testing::IndexRows;
using testing::kBf;
using testing::kDs;
using testing::kE4;
using testing::kPoisonSlots;
using testing::random_q;
using testing::rounds_p;
using testing::sm_count;
using testing::SmallProblem;

constexpr AttentionKernel kPre = AttentionKernel::kSm90Pairs;

// sparse_attention_max_workspace_bytes() bounds the workspace of every shape, so one allocation
// of it (AttentionWorkspace, the Python binding's per-stream cache) serves every call.
TEST(AttentionCuda, MaxWorkspaceBoundsEveryShape) {
  if (!cuda_backend_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t most = sparse_attention_max_workspace_bytes();
  int64_t largest = 0;
  SparseAttentionParams p;
  // Token counts past one wave of CTAs too, whose last wave's tokens take slices
  // (docs/design.md#splits).
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  std::vector<int64_t> token_counts = {1, 2, 3, 7, 64, 200};
  for (int64_t t = sms + 1; t <= 3 * sms; ++t) token_counts.push_back(t);
  for (int32_t heads : {1, 8, 16, 63, 64, 65, 100, 128}) {
    for (int64_t tokens : token_counts) {
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
    for (const AttentionKernel kernel :
         {AttentionKernel::kSm90Tile32, AttentionKernel::kSm90Pairs}) {
      for (const int32_t heads : {40, 100}) {
        SCOPED_TRACE(std::string(dtype == kDs ? "fp8_ds_mla" : "bf16") + " " +
                     attention_kernel_name(kernel) + " " + std::to_string(heads) + " heads");
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
  p.hp.kernel = AttentionKernel::kSm90Pairs;  // 5 groups: only forced
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
    EXPECT_EQ(detail::plan_sm90_attention(dev.params(), detail::SmCapacity::ideal(sm_count()),
                                          dev.params().workspace_bytes)
                  .query_group,
              2);
  }
  expect_masked_and_counted(dev, p.hp, masked, planted);
}

TEST(AttentionCuda, QueryGroupsNeedTheirWorkspaceAndRunWithoutIt) {
  SKIP_WITHOUT_GPU();
  SmallProblem p(16, 8, 64);
  p.hp.query_group_size = 4;
  p.hp.kernel = AttentionKernel::kSm90Pairs;
  DeviceProblem dev(p.hp, p.cache, p.rows, nullptr, nullptr, p.q, {});  // no workspace
  if (sparse_attention_kernel(dev.params()) != AttentionKernel::kAuto) {
    EXPECT_EQ(detail::plan_sm90_attention(dev.params(), detail::SmCapacity::ideal(sm_count()), 0)
                  .query_group,
              1);
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

void check_decoded_keys(int32_t H);

TEST(AttentionCuda, DecodedKeysMatchTheReferenceAndCountBadEntries) {
  SKIP_WITHOUT_GPU();
  // A prefill-sized call on two fp8_ds_mla caches that names each slot ~200 times: with room in
  // the workspace its keys are decoded once (docs/design.md#decoded-keys), without it the kernel
  // reads the caches. Pages of 2 and 64 slots, a row stride past the width, lens 0 / full /
  // random, -1 holes, sinks, and planted entries past the caches and below -1 (masked, counted
  // once). 64 heads take the 64-row bf16 kernel (the last wave's tokens in slices), 9 the
  // few-heads one (docs/design.md#few-heads).
  for (const int32_t H : {64, 9}) {
    SCOPED_TRACE("heads " + std::to_string(H));
    check_decoded_keys(H);
  }
}

void check_decoded_keys(int32_t H) {
  const int sms = sm_count();
  const int64_t T = 2 * sms + 7;
  const int32_t W0 = 128, W1 = 200;
  HostCache swa(kDs, 2, 96, 31), extra(kDs, 64, 320, 32);
  IndexRows swa_rows(T, W0, W0), extra_rows(T, W1, W1 + 3);
  std::mt19937 rng(33);
  fill_rows(&swa_rows, swa.num_slots(), &rng);
  fill_rows(&extra_rows, extra.num_slots(), &rng);
  IndexRows swa_masked = swa_rows, extra_masked = extra_rows;
  int32_t planted_swa = 0, planted = 0;
  for (int64_t t = 0; t < T; t += 5) {
    if (swa_rows.lens[t] > 0) {
      swa_rows.data[t * W0] = static_cast<int32_t>(swa.num_slots() + t);
      swa_masked.data[t * W0] = -1;
      ++planted_swa;
    }
    if (extra_rows.lens[t] > 2) {
      extra_rows.data[t * extra_rows.stride + 1] = std::numeric_limits<int32_t>::max();
      extra_rows.data[t * extra_rows.stride + 2] = -3;
      extra_masked.data[t * extra_rows.stride + 1] = extra_masked.data[t * extra_rows.stride + 2] =
          -1;
      planted += 2;
    }
  }
  planted += planted_swa;
  std::vector<uint16_t> q = random_q(T * H, 34);
  std::vector<float> sinks(H);
  for (int32_t h = 0; h < H; ++h) sinks[h] = 0.25f * (h % 7) - 0.75f;
  SparseAttentionParams hp;
  hp.num_tokens = T;
  hp.num_heads = H;
  hp.q = q.data();
  hp.sinks = sinks.data();
  hp.swa_cache = swa.view();
  hp.swa_indices = swa_rows.view();
  hp.extra_cache = extra.view();
  hp.extra_indices = extra_rows.view();
  SparseAttentionParams ref = hp;
  ref.swa_indices = swa_masked.view();
  ref.extra_indices = extra_masked.view();
  // With room: decoded keys; without: the caches read directly; with room but the decoded keys
  // turned off (detail::AttentionOverrides): read directly, the workspace holding only slices.
  struct Case {
    bool room, decoded;
    const char* what;
  };
  for (const Case c :
       {Case{true, true, "decoded keys"}, Case{false, false, "no room: the caches read directly"},
        Case{true, false, "decoded keys turned off: the caches read directly"}}) {
    SCOPED_TRACE(c.what);
    detail::AttentionOverrides overrides;
    overrides.decoded_keys = c.decoded || !c.room;
    DeviceProblem dev(hp, swa, swa_rows, &extra, &extra_rows, q, sinks, c.room);
    if (sparse_attention_kernel(dev.params()) == AttentionKernel::kAuto) {
      GTEST_SKIP() << "no sm_90a code for this device";
    }
    const int64_t bytes = dev.params().workspace == nullptr ? 0 : dev.params().workspace_bytes;
    const detail::Sm90Plan plan =
        detail::plan_sm90_attention(dev.params(), detail::SmCapacity::ideal(sms), bytes, overrides);
    EXPECT_EQ(plan.decoded_keys, c.decoded);
    if (c.decoded && H == 64) {
      // Two waves and 7 tokens: the last 7 in slices of one pair of 64-key blocks (328 keys: 3),
      // their partials after the decoded rows.
      EXPECT_EQ(plan.splits, 3);
      EXPECT_EQ(plan.whole_tokens, 2 * sms);
    }
    SPARSE_SWA_ASSERT_OK(detail::sparse_attention_with(dev.params(), overrides));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(dev.bad_count(), planted);
    const AttentionComparison e =
        compare_attention(ref, dev.out(), dev.lse(), rounds_p(dev.params()));
    EXPECT_EQ(e.failures, 0) << e.first_failure;
  }
  // Both segments over one cache, as a prefill pool: one slot space, each key decoded once.
  IndexRows pool_rows(T, W1, W1);
  fill_rows(&pool_rows, swa.num_slots(), &rng);
  SparseAttentionParams pooled = hp;
  pooled.extra_cache = swa.view();
  pooled.extra_indices = pool_rows.view();
  DeviceProblem dev(pooled, swa, swa_rows, &swa, &pool_rows, q, sinks, true);
  SparseAttentionParams one_cache = dev.params();
  one_cache.extra_cache = one_cache.swa_cache;  // the device copy of the SWA cache
  EXPECT_TRUE(detail::plan_sm90_attention(one_cache, detail::SmCapacity::ideal(sms),
                                          one_cache.workspace_bytes)
                  .decoded_keys);
  SPARSE_SWA_ASSERT_OK(sparse_attention(one_cache));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(dev.bad_count(), planted_swa);
  pooled.swa_indices = swa_masked.view();
  const AttentionComparison e =
      compare_attention(pooled, dev.out(), dev.lse(), rounds_p(dev.params()));
  EXPECT_EQ(e.failures, 0) << "one cache: " << e.first_failure;
}

TEST(AttentionCuda, ZeroAndNegativeScalesMatchTheReference) {
  SKIP_WITHOUT_GPU();
  // Any finite scale is allowed: with a zero one every valid key weighs the same, with a negative
  // one the lowest scores weigh most (a kernel that took the raw scores' maximum before scaling
  // would get both wrong).
  for (const CacheDtype dtype : {kBf, kDs}) {
    for (const AttentionKernel kernel : {AttentionKernel::kSm90Tile32, kPre}) {
      for (const float scale : {-0.06f, 0.0f, 0.06f}) {
        SmallProblem p(64, 6, 150, dtype);
        p.hp.softmax_scale = scale;
        p.hp.kernel = kernel;
        DeviceProblem dev(p.hp, p.cache, p.rows, nullptr, nullptr, p.q, {});
        if (sparse_attention_kernel(dev.params()) == AttentionKernel::kAuto) {
          GTEST_SKIP() << "no sm_90a code for this device";
        }
        SPARSE_SWA_ASSERT_OK(sparse_attention(dev.params()));
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const AttentionComparison e =
            compare_attention(p.hp, dev.out(), dev.lse(), rounds_p(dev.params()));
        EXPECT_EQ(e.failures, 0) << "dtype " << static_cast<int>(dtype) << ", kernel "
                                 << static_cast<int>(kernel) << ", scale " << scale << ": "
                                 << e.first_failure;
      }
    }
  }
}

TEST(AttentionCuda, KernelChoiceFollowsTheShapesAndCanBeForced) {
  SKIP_WITHOUT_GPU();
  int device = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  HostCache bf(kBf, 64, 256, 7);
  IndexRows many(sms, 640, 640), half(sms / 2, 640, 640), few(4, 640, 640), eight(8, 640, 640),
      narrow(4, 63, 63);
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
  const AttentionKernel kAuto = AttentionKernel::kAuto, kDec = AttentionKernel::kSm90Tile32;
  if (kernel_for(many, kBf, kAuto, true) == kAuto) GTEST_SKIP() << "no sm_90a code here";
  for (const CacheDtype dtype : {kBf, kDs}) {
    // Tokens x head groups that fill the SMs: never split, the pair kernel.
    EXPECT_EQ(kernel_for(many, dtype, kAuto, true), kPre);
    // Small batches of long rows split with a workspace, not without one: over the pair
    // kernel where its slices get two pairs of blocks or more; where they would get one, bf16
    // rows of fewer than 5 items over the tile32 kernel's single tiles, fp8_ds_mla rows and
    // larger bf16 batches still over the pair kernel (docs/design.md#splits).
    EXPECT_EQ(kernel_for(half, dtype, kAuto, true), kPre);
    EXPECT_EQ(kernel_for(few, dtype, kAuto, true), dtype == kBf ? kDec : kPre);
    EXPECT_EQ(kernel_for(eight, dtype, kAuto, true), kPre);
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
  bad.kernel = AttentionKernel::kSm90Pairs;
  EXPECT_TRUE(testing::IsInvalidArgument(
      sparse_attention(bad),
      {"params.kernel", "read fp8_ds_mla or bf16 caches, both segments alike, got fp8_e4m3"}));
  bad = dev.params();
  bad.kernel = static_cast<AttentionKernel>(7);
  EXPECT_TRUE(testing::IsInvalidArgument(
      sparse_attention(bad),
      {"params.kernel: expected kAuto (0), kSm90Tile32 (1) or kSm90Pairs (2), "
       "got 7"}));
  bad.kernel = AttentionKernel::kSm90Tile32;
  SPARSE_SWA_EXPECT_OK(sparse_attention(bad));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const AttentionComparison e =
      compare_attention(p.hp, dev.out(), dev.lse(), rounds_p(dev.params()));
  EXPECT_EQ(e.failures, 0) << e.first_failure;
}

}  // namespace
}  // namespace sparse_swa
