// SPDX-License-Identifier: Apache-2.0
// CUDA index consumers vs the CPU reference: bitwise equality of every output (poisoned first,
// stride padding included) on thousands of random batches, masking of out-of-range inputs
// without faults, and capture into a CUDA graph (the launchers never synchronise).
// Run under compute-sanitizer: --gtest_filter='ConsumersCuda*'.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <vector>

#include "cuda/cuda_utils.h"
#include "sparse_swa/consumers.h"
#include "sparse_swa/metadata_builder.h"
#include "support/device_array.h"
#include "support/status_matchers.h"
#include "testing/random_batch.h"

namespace sparse_swa {
namespace {

using testing::RandomBatch;
using Row = std::vector<int32_t>;

constexpr int kPoisonByte = 0x5a;
constexpr int32_t kPoison = 0x5a5a5a5a;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : fallback;
}

// Device allocations of one test case, freed together.
class Arena {
 public:
  template <typename T>
  T* alloc(size_t n) {
    auto block = std::make_unique<detail::DeviceBuffer<T>>();
    if (!block->allocate(std::max<size_t>(n, 1)).ok())
      throw std::runtime_error("cudaMalloc failed");
    T* p = block->get();
    blocks_.push_back(std::shared_ptr<void>(std::move(block)));
    cudaMemset(p, kPoisonByte, std::max<size_t>(n, 1) * sizeof(T));
    return p;
  }
  template <typename T>
  T* upload(const T* src, size_t n) {
    T* d = alloc<T>(n);
    if (n > 0 && cudaMemcpy(d, src, n * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess) {
      throw std::runtime_error("cudaMemcpy failed");
    }
    return d;
  }
  template <typename T>
  std::span<const T> upload(std::span<const T> s) {
    return {upload(s.data(), s.size()), s.size()};
  }
  MatrixView<const int32_t> upload(const MatrixView<const int32_t>& m) {
    MatrixView<const int32_t> d = m;
    d.data = upload(m.data, static_cast<size_t>(m.rows * m.stride));
    d.space = MemorySpace::kDevice;
    return d;
  }
  ConstIndexView upload(const ConstIndexView& v) {
    ConstIndexView d = v;
    d.data = upload(v.data, static_cast<size_t>(v.rows * v.row_stride));
    d.lens = upload(v.lens, static_cast<size_t>(v.rows));
    d.space = MemorySpace::kDevice;
    return d;
  }

 private:
  std::vector<std::shared_ptr<void>> blocks_;  // DeviceBuffers of several element types
};

Row download(const int32_t* d, size_t n) {
  Row h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(int32_t), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

// A poisoned output matrix on each side, same shape and stride.
struct OutputPair {
  OutputPair(Arena* arena, int64_t rows, int32_t width, int64_t stride)
      : rows(rows),
        width(width),
        stride(stride),
        host_data(rows * stride, kPoison),
        host_lens(rows, kPoison) {
    dev_data = arena->alloc<int32_t>(rows * stride);
    dev_lens = arena->alloc<int32_t>(rows);
  }
  IndexView host() { return {host_data.data(), host_lens.data(), rows, width, stride, 0}; }
  IndexView device() { return {dev_data, dev_lens, rows, width, stride, 0, MemorySpace::kDevice}; }
  // Empty when equal, else the first difference.
  std::string compare() const {
    const Row d = download(dev_data, rows * stride), l = download(dev_lens, rows);
    for (int64_t i = 0; i < rows * stride; ++i) {
      if (d[i] != host_data[i]) {
        return str_cat("data[", i / stride, "][", i % stride, "]: cpu ", host_data[i], " vs gpu ",
                       d[i]);
      }
    }
    for (int64_t i = 0; i < rows; ++i) {
      if (l[i] != host_lens[i])
        return str_cat("lens[", i, "]: cpu ", host_lens[i], " vs gpu ", l[i]);
    }
    return "";
  }
  int64_t rows;
  int32_t width;
  int64_t stride;
  Row host_data, host_lens;
  int32_t* dev_data;
  int32_t* dev_lens;
};

// Device copies of a host step: the metadata's views and the batch arrays.
struct DeviceStep {
  DeviceStep(Arena* a, const SwaMetadata& h, const BatchInput& hb) {
    md = h;
    md.space = MemorySpace::kDevice;
    md.token_to_req_indices = a->upload(h.token_to_req_indices);
    md.is_valid_token = a->upload(h.is_valid_token);
    md.decode_swa = a->upload(h.decode_swa);
    md.prefill_swa = a->upload(h.prefill_swa);
    if (h.has_image()) {
      md.left_visible = a->upload(h.left_visible);
      md.right_visible = a->upload(h.right_visible);
    }
    md.prefill_gather_lens = a->upload(h.prefill_gather_lens);
    md.replay_start = a->upload(h.replay_start);  // the consumers read the metadata's copy
    batch = hb;
    batch.query_start_loc = a->upload(hb.query_start_loc);
    batch.seq_lens = a->upload(hb.seq_lens);
    batch.block_table = a->upload(hb.block_table);
    batch.slot_mapping = a->upload(hb.slot_mapping);
  }
  SwaMetadata md;
  BatchInput batch;
};

// A host matrix with random entries.
struct HostMatrix {
  HostMatrix(int64_t rows, int64_t cols, int64_t stride) : rows(rows), cols(cols), stride(stride) {
    data.assign(std::max<int64_t>(rows * stride, 0), -7);
  }
  int32_t& at(int64_t i, int64_t j) { return data[i * stride + j]; }
  MatrixView<const int32_t> view() const { return {data.data(), rows, cols, stride}; }
  int64_t rows, cols, stride;
  Row data;
};

struct LayerInputs {
  HostMatrix cbt{0, 0, 0};
  int32_t cbs = 1;
  int32_t ratio = 1;
  HostMatrix decode_local{0, 0, 0};
  HostMatrix decode_global{0, 0, 0};
  Row decode_global_lens;
  HostMatrix prefill_local{0, 0, 0};
};

// A random compressed layer for the step: ratio from {1, 2, 4, 128}, a compressed block table
// with some negative ids, local indices that are mostly valid, some -1 and some out of range.
LayerInputs random_layer(RandomBatch& gen, const SwaMetadata& md, const BatchInput& b) {
  LayerInputs in;
  const int32_t ratios[] = {1, 2, 4, 128};
  in.ratio = ratios[gen.uniform(0, 3)];
  if (in.ratio == 1) return in;
  const int32_t sizes[] = {1, 2, 3, 16, 64};
  in.cbs = sizes[gen.uniform(0, 4)];
  int32_t max_entries = 1;
  for (int32_t s : b.seq_lens) max_entries = std::max(max_entries, s / in.ratio + 1);
  const int64_t cols = (max_entries + in.cbs - 1) / in.cbs;
  in.cbt = HostMatrix(b.num_reqs(), cols, cols + gen.uniform(0, 3));
  for (int64_t r = 0; r < in.cbt.rows; ++r) {
    for (int64_t j = 0; j < cols; ++j)
      in.cbt.at(r, j) = gen.chance(0.03) ? -1 : gen.uniform(0, 5000);
  }
  auto local_index = [&](int32_t r) {
    const int32_t entries = std::max(b.seq_lens[r] / in.ratio, 1);
    if (gen.chance(0.1)) return -1;
    if (gen.chance(0.03)) return gen.uniform(entries, entries + 3 * in.cbs);
    return gen.uniform(0, entries - 1);
  };
  const int32_t topks[] = {1, 3, 8, 64, 130};
  const int32_t td = md.num_decode_tokens, tp = md.num_prefill_tokens;
  const int32_t k = topks[gen.uniform(0, 4)];
  if (in.ratio == 128 && gen.chance(0.7)) {  // C128A: global indices + lens
    in.decode_global = HostMatrix(td, k, k + gen.uniform(0, 2));
    in.decode_global_lens.resize(td);
    for (int32_t t = 0; t < td; ++t) {
      in.decode_global_lens[t] = gen.uniform(0, k);
      for (int32_t j = 0; j < k; ++j) in.decode_global.at(t, j) = gen.uniform(-1, 90000);
    }
  } else {
    in.decode_local = HostMatrix(td, k, k + gen.uniform(0, 2));
    for (int32_t t = 0; t < td; ++t) {
      const int32_t r = std::clamp(md.token_to_req_indices[t], 0, b.num_reqs() - 1);
      for (int32_t j = 0; j < k; ++j) in.decode_local.at(t, j) = local_index(r);
    }
  }
  const int32_t kp = topks[gen.uniform(0, 4)];
  in.prefill_local = HostMatrix(tp, kp, kp + gen.uniform(0, 2));
  for (int32_t p = 0; p < tp; ++p) {
    const int32_t r = std::clamp(md.token_to_req_indices[td + p], 0, b.num_reqs() - 1);
    for (int32_t j = 0; j < kp; ++j) in.prefill_local.at(p, j) = local_index(r);
  }
  return in;
}

// Every consumer on the CPU and on the GPU for one step; empty when all outputs agree.
std::string compare_step(RandomBatch& gen, const SwaMetadata& md, const BatchInput& batch,
                         int32_t block_size, int64_t* compared) {
  Arena arena;
  DeviceStep dev(&arena, md, batch);
  const ConsumerStep host_step{md, batch, block_size};
  const ConsumerStep dev_step{dev.md, dev.batch, block_size};
  LayerInputs in = random_layer(gen, md, batch);
  CompressedTopk host_topk, dev_topk;
  host_topk.cache = {in.cbt.view(), in.cbs, in.ratio};
  if (in.ratio > 1) {
    host_topk.decode_local = in.decode_local.view();
    if (in.decode_global.cols > 0) {
      host_topk.decode_global = {
          in.decode_global.data.data(), in.decode_global_lens.data(),
          in.decode_global.rows,        static_cast<int32_t>(in.decode_global.cols),
          in.decode_global.stride,      0};
    }
    host_topk.prefill_local = in.prefill_local.view();
  }
  dev_topk.cache = {arena.upload(host_topk.cache.block_table), in.cbs, in.ratio};
  dev_topk.decode_local = arena.upload(host_topk.decode_local);
  dev_topk.prefill_local = arena.upload(host_topk.prefill_local);
  if (host_topk.decode_global.rows > 0 || host_topk.decode_global.width > 0) {
    dev_topk.decode_global = arena.upload(host_topk.decode_global);
  }

  // Mixed matrix in both forms, with spare columns and a capacity stride.
  const MixedMatrixShape shape = mixed_matrix_shape(md, host_topk);
  Status a, b;
  for (MixedMatrixForm form : {MixedMatrixForm::kFlashInferSm100, MixedMatrixForm::kVerbatim}) {
    const int32_t width = shape.row_width + 4 * gen.uniform(0, 1);
    OutputPair mixed(&arena, md.num_tokens + gen.uniform(0, 2), width,
                     width + 4 * gen.uniform(0, 2));
    Row swa_host(md.num_tokens, kPoison);
    int32_t* swa_dev = arena.alloc<int32_t>(md.num_tokens);
    a = build_mixed_matrix(host_step, host_topk, form, mixed.host(), swa_host);
    b = build_mixed_matrix(dev_step, dev_topk, form, mixed.device(), {swa_dev, swa_host.size()});
    const std::string name = str_cat("mixed (", mixed_matrix_form_name(form), ")");
    if (!a.ok() || !b.ok()) return name + ": " + a.to_string() + " / " + b.to_string();
    if (auto d = mixed.compare(); !d.empty()) return name + " " + d;
    if (download(swa_dev, swa_host.size()) != swa_host) return name + " swa_lens differ";
    *compared += md.num_tokens;
  }

  // Compressed top-k -> global (decode rows) and the C128A copy.
  if (host_topk.decode_local.cols > 0 && md.num_decode_tokens > 0) {
    OutputPair g(&arena, md.num_decode_tokens,
                 static_cast<int32_t>(host_topk.decode_local.cols) + 2,
                 host_topk.decode_local.cols + 5);
    a = compressed_topk_to_global(md, 0, host_topk.decode_local, host_topk.cache, g.host());
    b = compressed_topk_to_global(dev.md, 0, dev_topk.decode_local, dev_topk.cache, g.device());
    if (!a.ok() || !b.ok()) return "global: " + a.to_string() + " / " + b.to_string();
    if (auto d = g.compare(); !d.empty()) return "global " + d;
  }
  if (host_topk.decode_global.width > 0 && md.num_decode_tokens > 0) {
    OutputPair g(&arena, md.num_decode_tokens, host_topk.decode_global.width + 1,
                 host_topk.decode_global.width + 3);
    a = copy_global_topk(md, 0, host_topk.decode_global, g.host());
    b = copy_global_topk(dev.md, 0, dev_topk.decode_global, g.device());
    if (!a.ok() || !b.ok()) return "copy: " + a.to_string() + " / " + b.to_string();
    if (auto d = g.compare(); !d.empty()) return "copy " + d;
  }

  // Combined prefill rows of every chunk.
  auto plan = prefill_chunk_plan(md, in.ratio, gen.uniform(1, 4));
  if (!plan.ok()) return "plan: " + plan.status().to_string();
  const auto host_local = in.ratio > 1 ? host_topk.prefill_local : MatrixView<const int32_t>{};
  const auto dev_local = in.ratio > 1 ? dev_topk.prefill_local : MatrixView<const int32_t>{};
  for (const ChunkPlanEntry& chunk : plan.value()) {
    auto cs = combined_prefill_shape(md, chunk, static_cast<int32_t>(host_local.cols));
    if (!cs.ok()) return "combine shape: " + cs.status().to_string();
    OutputPair c(&arena, cs.value().rows, cs.value().width, cs.value().width + gen.uniform(0, 3));
    a = build_combined_prefill(host_step, chunk, in.ratio, host_local, c.host());
    b = build_combined_prefill(dev_step, chunk, in.ratio, dev_local, c.device());
    if (!a.ok() || !b.ok()) return "combine: " + a.to_string() + " / " + b.to_string();
    if (auto d = c.compare(); !d.empty()) return "combine " + d;
  }

  // Ragged of both SWA views.
  for (const auto& [hv, dv] : {std::pair{md.decode_swa, dev.md.decode_swa},
                               std::pair{md.prefill_swa, dev.md.prefill_swa}}) {
    const int64_t cap = ragged_capacity(hv);
    Row hi(hv.rows + 1, kPoison), hvals(std::max<int64_t>(cap, 1), kPoison);
    int32_t* di = arena.alloc<int32_t>(hv.rows + 1);
    int32_t* dvals = arena.alloc<int32_t>(cap);
    a = to_ragged(hv, {hi.data(), hv.rows + 1, hvals.data(), cap});
    b = to_ragged(dv, {di, hv.rows + 1, dvals, cap, MemorySpace::kDevice});
    if (!a.ok() || !b.ok()) return "ragged: " + a.to_string() + " / " + b.to_string();
    if (download(di, hi.size()) != hi) return "ragged indptr differs";
    if (download(dvals, hvals.size()) != hvals) return "ragged values differ";
  }
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return std::string("cuda: ") + cudaGetErrorString(e);
  return "";
}

// A third of the batches replay (pages below the replay start freed): the recomputed prefill
// windows of both backends start at the metadata's replay_start.
TEST(ConsumersCuda, MatchCpuBitwiseOnRandomBatches) {
  SKIP_WITHOUT_GPU();
  const int cases = env_int("SPARSE_SWA_CONSUMER_CASES", 3000);
  RandomBatch gen(4242, testing::builder_test_options());
  int64_t compared = 0;
  for (int i = 0; i < cases; ++i) {
    testing::RandomCase c = gen.next();
    SCOPED_TRACE(c.describe());
    auto builder = testing::cpu_builder(c.config);
    const BatchInput input = c.batch.input();
    SwaMetadata md;
    SPARSE_SWA_ASSERT_OK(builder->build(input, &md));
    ASSERT_EQ(compare_step(gen, md, input, c.config.block_size, &compared), "");
  }
  std::printf("compared %d batches, %lld mixed rows\n", cases, static_cast<long long>(compared));
}

// Garbage that the CPU reports (bad token mapping, windows past the block table, replay starts
// outside the prefix) gives rows of -1 and lens 0 on the GPU, never a fault.
TEST(ConsumersCuda, InconsistentMetadataIsMaskedNotFaulting) {
  SKIP_WITHOUT_GPU();
  RandomBatch gen(99, testing::builder_test_options());
  for (int i = 0; i < 50; ++i) {
    testing::RandomCase c = gen.next();
    auto builder = testing::cpu_builder(c.config);
    const BatchInput input = c.batch.input();
    SwaMetadata md;
    SPARSE_SWA_ASSERT_OK(builder->build(input, &md));
    Row t2r(md.token_to_req_indices.begin(), md.token_to_req_indices.end());
    for (auto& r : t2r) r = gen.chance(0.3) ? gen.uniform(-5, 1000) : r;
    Row replay(md.replay_start.begin(), md.replay_start.end());
    for (auto& r : replay) r = gen.chance(0.2) ? gen.uniform(-3, 1000) : r;
    SwaMetadata bad = md;
    bad.token_to_req_indices = t2r;
    bad.replay_start = replay;
    Arena arena;
    DeviceStep dev(&arena, bad, input);
    dev.batch.block_table.cols = gen.uniform(0, 1);  // most windows now fall off the table
    const ConsumerStep step{dev.md, dev.batch, c.config.block_size};
    const MixedMatrixShape shape = mixed_matrix_shape(bad, {});
    OutputPair mixed(&arena, md.num_tokens, shape.row_width, shape.row_width);
    SPARSE_SWA_ASSERT_OK(build_mixed_matrix(step, {}, mixed.device()));
    auto plan = prefill_chunk_plan(md, 1, 4);
    SPARSE_SWA_ASSERT_OK(plan.status());
    for (const ChunkPlanEntry& chunk : plan.value()) {
      auto cs = combined_prefill_shape(md, chunk, 0);
      SPARSE_SWA_ASSERT_OK(cs.status());
      OutputPair comb(&arena, cs.value().rows, cs.value().width, cs.value().width);
      SPARSE_SWA_ASSERT_OK(build_combined_prefill(step, chunk, 1, {}, comb.device()));
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const Row lens = download(mixed.dev_lens, md.num_tokens);
    const Row data = download(mixed.dev_data, md.num_tokens * int64_t{shape.row_width});
    for (int32_t t = 0; t < md.num_tokens; ++t) {
      ASSERT_GE(lens[t], 0);
      if (lens[t] == 0) {
        for (int32_t j = 0; j < shape.row_width; ++j) ASSERT_EQ(data[t * shape.row_width + j], -1);
      }
    }
  }
}

// A non-causal block whose SM100 relayout needs more columns than the row has (the CPU's
// error, tests/consumers/mixed_relayout_test.cc), or whose row is not the builder's, gives a row
// of -1 and lens 0 on the GPU; the block's other tokens are re-laid as on the CPU. W = 8,
// identity pages, prefix 2, ql 3 in a 9-wide view: token 0 needs W + 2 = 10 columns, tokens 1
// and 2 need 9 and 8.
TEST(ConsumersCuda, RelayoutPastTheRowIsMasked) {
  SKIP_WITHOUT_GPU();
  const int32_t width = 9;
  Row rows(3 * width, -1), lens = {5, 5, 5};
  for (int t = 0; t < 3; ++t) {
    for (int j = 0; j < 5; ++j) rows[t * width + j] = j;
  }
  const Row qsl = {0, 3}, seq = {5}, bt = {0, 1}, t2r = {0, 0, 0};
  const std::vector<uint8_t> valid = {1, 1, 1};
  SwaMetadata md;
  md.causal = false;
  md.num_reqs = 1;
  md.num_tokens = 3;
  md.num_decodes = 1;
  md.num_decode_tokens = 3;
  md.max_decode_query_len = 1;  // understates the block: the host check W + 1 <= 9 passes
  md.token_to_req_indices = t2r;
  md.is_valid_token = valid;
  md.decode_swa = {rows.data(), lens.data(), 3, width, width, 8, MemorySpace::kHost};
  md.prefill_swa = {nullptr, nullptr, 0, 8, 8, 8, MemorySpace::kHost};
  md.window_size = 8;
  const BatchInput batch{qsl, seq, {bt.data(), 1, 2, 2, MemorySpace::kHost}, {}, false, {}};
  Arena arena;
  DeviceStep dev(&arena, md, batch);
  const MixedMatrixShape shape = mixed_matrix_shape(md, {});
  ASSERT_EQ(shape.row_width, 12);
  OutputPair mixed(&arena, 3, shape.row_width, shape.row_width);
  EXPECT_FALSE(build_mixed_matrix({md, batch, 4}, {}, mixed.host()).ok());
  SPARSE_SWA_ASSERT_OK(build_mixed_matrix({dev.md, dev.batch, 4}, {}, mixed.device()));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const Row got = download(mixed.dev_data, 3 * 12);
  EXPECT_EQ(download(mixed.dev_lens, 3), Row({0, 9, 8}));
  EXPECT_EQ(Row(got.begin(), got.begin() + 12), Row(12, -1));
  EXPECT_EQ(Row(got.begin() + 12, got.begin() + 24),
            Row({0, 1, 2, 3, -1, -1, -1, -1, 4, -1, -1, -1}));
  EXPECT_EQ(Row(got.begin() + 24, got.end()), Row({0, 1, 2, 3, 4, -1, -1, -1, -1, -1, -1, -1}));
  // Lens that are not the non-causal row's (min(prefix, W) + ql = 5): every token masked.
  const Row wrong_lens = {3, 4, 6};
  dev.md.decode_swa.lens = arena.upload(wrong_lens.data(), wrong_lens.size());
  SPARSE_SWA_ASSERT_OK(build_mixed_matrix({dev.md, dev.batch, 4}, {}, mixed.device()));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(download(mixed.dev_lens, 3), Row({0, 0, 0}));
  EXPECT_EQ(download(mixed.dev_data, 3 * 12), Row(3 * 12, -1));
}

// Docs Example 6 (docs/semantics.md#example-6-bounded-replay): the GPU's mixed matrix and
// combined prefill equal the CPU's hand-checked rows (tests/consumers/replay_consumers_test.cc);
// a replay_start past request 1's prefix (8), an error on the CPU, masks that request's rows
// (-1, lens 0) and leaves the others as they were.
TEST(ConsumersCuda, ReplayStartClampsAndMasksLikeTheCpu) {
  SKIP_WITHOUT_GPU();
  BuilderConfig c;
  c.window_size = 8;
  c.block_size = 4;
  c.max_num_batched_tokens = 64;
  c.max_num_seqs = 8;
  c.max_model_len = 64;
  testing::TestBatch batch(4);
  batch.add_request(11, 1, {7, 3, 9, 2, 0})
      .add_request(14, 6, {-1, -1, 11, 6, 0})
      .add_request(20, 4, {-1, -1, -1, 1, 4});
  batch.replay_start = {0, 8, 12};
  const BatchInput input = batch.input();
  auto builder = testing::cpu_builder(c);
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(input, &md));
  Arena arena;
  DeviceStep dev(&arena, md, input);
  const ChunkPlanEntry chunk{0, 2, 0, 13};
  OutputPair mixed(&arena, 11, 8, 8), comb(&arena, 10, 128, 128);
  SPARSE_SWA_ASSERT_OK(build_mixed_matrix({md, input, 4}, {}, mixed.host()));
  SPARSE_SWA_ASSERT_OK(build_mixed_matrix({dev.md, dev.batch, 4}, {}, mixed.device()));
  SPARSE_SWA_ASSERT_OK(build_combined_prefill({md, input, 4}, chunk, 1, {}, comb.host()));
  SPARSE_SWA_ASSERT_OK(build_combined_prefill({dev.md, dev.batch, 4}, chunk, 1, {}, comb.device()));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(mixed.compare(), "");
  EXPECT_EQ(comb.compare(), "");
  EXPECT_EQ(mixed.host_lens, Row(11, 8));
  EXPECT_EQ(comb.host_lens, Row({1, 2, 3, 4, 5, 6, 5, 6, 7, 8}));

  const Row past = {0, 9, 12};
  SwaMetadata bad = md;
  bad.replay_start = past;
  EXPECT_FALSE(build_mixed_matrix({bad, input, 4}, {}, mixed.host()).ok());
  dev.md.replay_start = arena.upload(std::span<const int32_t>(past));
  SPARSE_SWA_ASSERT_OK(build_mixed_matrix({dev.md, dev.batch, 4}, {}, mixed.device()));
  SPARSE_SWA_ASSERT_OK(build_combined_prefill({dev.md, dev.batch, 4}, chunk, 1, {}, comb.device()));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const Row mixed_rows = download(mixed.dev_data, 11 * 8),
            comb_rows = download(comb.dev_data, 10 * 128);
  for (int t = 1; t < 7; ++t) {  // request 1's tokens: masked
    EXPECT_EQ(Row(mixed_rows.begin() + t * 8, mixed_rows.begin() + (t + 1) * 8), Row(8, -1)) << t;
    EXPECT_EQ(Row(comb_rows.begin() + (t - 1) * 128, comb_rows.begin() + t * 128), Row(128, -1));
  }
  EXPECT_EQ(download(mixed.dev_lens, 11), Row({8, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8}));
  EXPECT_EQ(download(comb.dev_lens, 10), Row({0, 0, 0, 0, 0, 0, 5, 6, 7, 8}));
  for (int t : {0, 7, 10}) {  // the other requests' rows: as before
    EXPECT_EQ(Row(mixed_rows.begin() + t * 8, mixed_rows.begin() + (t + 1) * 8),
              Row(mixed.host_data.begin() + t * 8, mixed.host_data.begin() + (t + 1) * 8))
        << t;
  }
}

// The launchers enqueue on the caller's stream without synchronising: a CUDA graph captured at
// one step replays correctly after the step's arrays changed in place.
TEST(ConsumersCuda, CapturedInACudaGraph) {
  SKIP_WITHOUT_GPU();
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  RandomBatch gen(5);
  testing::RandomCase c = gen.next(testing::BatchMode::kMixed);
  auto builder = testing::cpu_builder(c.config);
  const BatchInput input = c.batch.input();
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(input, &md));
  Arena arena;
  DeviceStep dev(&arena, md, input);
  const ConsumerStep step{dev.md, dev.batch, c.config.block_size};
  const MixedMatrixShape shape = mixed_matrix_shape(md, {});
  OutputPair mixed(&arena, md.num_tokens, shape.row_width, shape.row_width);
  const ConstIndexView dv = dev.md.decode_swa;
  const int64_t cap = std::max<int64_t>(ragged_capacity(dv), 1);
  int32_t* indptr = arena.alloc<int32_t>(dv.rows + 1);
  int32_t* values = arena.alloc<int32_t>(cap);

  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the arena's poison memsets are done
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status s1 = build_mixed_matrix(step, {}, mixed.device(), {}, stream);
  const Status s2 = to_ragged(dv, {indptr, dv.rows + 1, values, cap, MemorySpace::kDevice}, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  SPARSE_SWA_ASSERT_OK(s1);
  SPARSE_SWA_ASSERT_OK(s2);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  // Replay after invalidating every token in place: rows must become -1, lens 0.
  ASSERT_EQ(
      cudaMemsetAsync(const_cast<uint8_t*>(dev.md.is_valid_token.data()), 0, md.num_tokens, stream),
      cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(download(mixed.dev_lens, md.num_tokens), Row(md.num_tokens, 0));
  EXPECT_EQ(download(mixed.dev_data, md.num_tokens * int64_t{shape.row_width}),
            Row(md.num_tokens * int64_t{shape.row_width}, -1));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace sparse_swa
