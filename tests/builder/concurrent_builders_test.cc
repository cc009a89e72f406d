// SPDX-License-Identifier: Apache-2.0
// The CPU backend's thread-safety contract: a MetadataBuilder is one object with its own
// buffers, used by one thread at a time; different builders may run in different threads at
// once, reading the same (unchanging) batch and config; the consumers, the codec and the
// attention hold no state and may run concurrently on distinct outputs. Checked here: several
// threads, each with its own builders, build random steps of every mode and run the consumers
// and the attention on them, and every value equals the same work done serially.
// scripts/ci/sanitize.sh runs this file under ThreadSanitizer (build-tsan/).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "sparse_swa/attention.h"
#include "sparse_swa/consumers.h"
#include "sparse_swa/kv_cache.h"
#include "sparse_swa/metadata_builder.h"
#include "support/metadata_snapshot.h"
#include "support/step_result.h"
#include "testing/random_batch.h"

namespace sparse_swa {
namespace {

using testing::StepResult;

constexpr int kThreads = 4;
constexpr int kStepsPerThread = 12;

// One step's inputs, shared read-only by every run of it.
struct Step {
  testing::RandomCase c;
  BatchInput input;
};

// A small bf16 cache shared by every attention call (read only).
struct SharedCache {
  static constexpr int32_t kBlockSize = 16;
  static constexpr int64_t kBlocks = 512;
  std::vector<uint8_t> bytes;
  ConstKvCacheView view;
  SharedCache() : bytes(kBlocks * kBlockSize * 1024 + 64) {
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>((i * 7919) >> 3);
    for (size_t i = 1; i < bytes.size(); i += 2) bytes[i] &= 0x3f;  // bf16 exponents stay small
    uint8_t* base = bytes.data() + (64 - reinterpret_cast<uintptr_t>(bytes.data()) % 64) % 64;
    view = {base, kBlocks, kBlockSize, kBlockSize * 1024, CacheDtype::kBf16, MemorySpace::kHost};
  }
};

StepResult run_step(MetadataBuilder& builder, const Step& step, const SharedCache& cache) {
  StepResult r;
  SwaMetadata md;
  if (Status s = builder.build(step.input, &md); !s.ok()) {
    r.error = "build: " + s.to_string();
    return r;
  }
  r.md = testing::snapshot(md);
  const ConsumerStep cs{md, step.input, step.c.config.block_size};
  const MixedMatrixShape shape = mixed_matrix_shape(md, {});
  r.mixed.assign(static_cast<size_t>(md.num_tokens) * shape.row_width, 0);
  r.mixed_lens.assign(md.num_tokens, 0);
  const IndexView out{r.mixed.data(),    r.mixed_lens.data(), md.num_tokens,
                      shape.row_width,   shape.row_width,     0,
                      MemorySpace::kHost};
  if (Status s = build_mixed_matrix(cs, {}, out); !s.ok()) r.error = "mixed: " + s.to_string();
  const int64_t capacity = ragged_capacity(md.decode_swa);
  r.indptr.assign(md.decode_swa.rows + 1, 0);
  r.values.assign(capacity, 0);
  if (Status s = to_ragged(md.decode_swa, {r.indptr.data(), md.decode_swa.rows + 1, r.values.data(),
                                           capacity, MemorySpace::kHost});
      !s.ok()) {
    r.error = "ragged: " + s.to_string();
  }
  // Attention over the decode rows, slots folded into the shared cache's range.
  const int64_t t = md.decode_swa.rows, w = md.decode_swa.width;
  std::vector<int32_t> idx(t * w), lens(t);
  for (int64_t i = 0; i < t; ++i) {
    lens[i] = md.decode_swa.lens[i];
    for (int64_t j = 0; j < w; ++j) {
      const int32_t v = md.decode_swa.row(i)[j];
      idx[i * w + j] = v < 0 ? -1 : static_cast<int32_t>(v % cache.view.num_slots());
    }
  }
  SparseAttentionParams p;
  p.num_tokens = t;
  p.num_heads = 2;
  std::vector<uint16_t> q(t * 2 * kHeadDim);
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<uint16_t>(0x3c00 + (i * 37) % 512);
  r.out.assign(q.size(), 0);
  r.lse.assign(t * 2, 0.0f);
  p.q = q.data();
  p.swa_cache = cache.view;
  p.swa_indices = {idx.data(), lens.data(), t, static_cast<int32_t>(w), w, 0, MemorySpace::kHost};
  p.out = r.out.data();
  p.lse = r.lse.data();
  if (Status s = sparse_attention(p); !s.ok()) r.error = "attention: " + s.to_string();
  return r;
}

TEST(ConcurrentBuilders, ThreadsGiveTheSerialResults) {
  // Thread i runs steps[i % 2 ...]: threads 0 and 2 (1 and 3) share their steps' inputs.
  std::vector<std::vector<Step>> steps(2);
  std::vector<BuilderConfig> configs(2);
  for (int g = 0; g < 2; ++g) {
    testing::RandomBatch gen(1234 + g, testing::builder_test_options());
    testing::RandomCase first = gen.next(testing::BatchMode::kMixed);
    configs[g] = first.config;
    configs[g].max_num_batched_tokens = 2048;  // room for every mode's batches
    configs[g].max_num_seqs = 64;
    configs[g].max_model_len = 1 << 16;
    for (int s = 0; s < kStepsPerThread; ++s) {
      const auto mode = static_cast<testing::BatchMode>(s % testing::kNumBatchModes);
      testing::RandomCase c;
      c.config = configs[g];
      c.mode = mode;
      const bool causal = configs[g].speculative_method != SpeculativeMethod::kDspark || s % 2;
      c.batch = gen.batch_for(
          configs[g],
          mode == testing::BatchMode::kDsparkNonCausal ? testing::BatchMode::kMixed : mode, causal);
      steps[g].push_back({std::move(c), {}});
    }
    for (Step& st : steps[g]) st.input = st.c.batch.input();
  }
  const SharedCache cache;

  // Serial: one fresh builder per thread's list, the same order.
  std::vector<std::vector<StepResult>> serial(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    auto builder = MetadataBuilder::create(configs[i % 2], Backend::kCpu);
    ASSERT_TRUE(builder.ok()) << builder.status().to_string();
    for (const Step& st : steps[i % 2]) serial[i].push_back(run_step(**builder, st, cache));
  }
  for (const StepResult& r : serial[0]) ASSERT_EQ(r.error, "") << "the serial run failed";

  // Concurrent: every thread its own builder, all at once, several rounds.
  for (int round = 0; round < 2; ++round) {
    std::vector<std::vector<StepResult>> threaded(kThreads);
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&, i] {
        auto builder = MetadataBuilder::create(configs[i % 2], Backend::kCpu);
        if (!builder.ok()) return;
        for (const Step& st : steps[i % 2]) threaded[i].push_back(run_step(**builder, st, cache));
      });
    }
    for (std::thread& t : threads) t.join();
    for (int i = 0; i < kThreads; ++i) {
      ASSERT_EQ(threaded[i].size(), serial[i].size()) << "thread " << i;
      for (size_t s = 0; s < serial[i].size(); ++s) {
        EXPECT_EQ(testing::first_step_difference(serial[i][s], threaded[i][s]), "")
            << "round " << round << ", thread " << i << ", step " << s;
      }
    }
  }
}

}  // namespace
}  // namespace sparse_swa
