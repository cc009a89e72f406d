// SPDX-License-Identifier: Apache-2.0
// The thread-safety contract on the GPU (docs/design.md#thread-safety), exercised as an engine
// may use it:
//   * several threads, each with its own CUDA builder on its own stream, build random steps of
//     every mode at once from device batches they all read, and run the consumers and the
//     attention (over one shared KV cache, each thread with its own outputs and workspace) on
//     their streams; each also captures a build into a graph (thread-local capture mode) while
//     the others run, and replays it. Every value equals the same work done serially.
//   * one finished build read by several threads on other streams: each reader's stream waits on
//     an event recorded after the build, and the builder's next build waits on events the
//     readers recorded, with no host synchronisation in between. Every reader's output equals
//     the CPU backend's.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/fp8_e4m3.h"
#include "sparse_swa/attention.h"
#include "sparse_swa/consumers.h"
#include "sparse_swa/device_copies.h"
#include "sparse_swa/kv_cache.h"
#include "sparse_swa/metadata_builder.h"
#include "support/device_array.h"
#include "support/metadata_snapshot.h"
#include "support/step_result.h"
#include "testing/random_batch.h"

namespace sparse_swa {
namespace {

using testing::StepResult;

using testing::DeviceArray;

constexpr int kThreads = 4;
constexpr int32_t kHeads = 16;
constexpr int32_t kCacheBlockSize = 64;
constexpr int64_t kCacheBlocks = 64;

// Steps per thread: 10, or SPARSE_SWA_CONCURRENT_STEPS (the sanitizer runs use fewer).
int num_steps() {
  const char* v = std::getenv("SPARSE_SWA_CONCURRENT_STEPS");
  return v != nullptr ? std::max(kThreads, std::atoi(v)) : 10;
}

// An fp8_ds_mla cache on the device, read by every attention call of every thread.
struct SharedCache {
  int64_t stride = 0;
  std::unique_ptr<DeviceArray<uint8_t>> bytes;
  ConstKvCacheView view;
  int64_t num_slots() const { return kCacheBlocks * kCacheBlockSize; }
  SharedCache() {
    const auto layout =
        page_layout(kCacheBlockSize, CacheDtype::kFp8DsMla, CacheConsumer::kFlashMla);
    stride = layout.value().page_bytes;
    std::vector<uint8_t> host(kCacheBlocks * stride, 0);
    const int64_t n = num_slots();
    std::vector<float> rows(n * kHeadDim);
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : rows) v = normal(rng);
    std::vector<int64_t> slots(n);
    for (int64_t s = 0; s < n; ++s) slots[s] = s;
    const Status st = encode_kv_rows({rows.data(), n, kHeadDim, kHeadDim}, slots,
                                     KvCacheView{host.data(), kCacheBlocks, kCacheBlockSize, stride,
                                                 CacheDtype::kFp8DsMla, MemorySpace::kHost});
    EXPECT_TRUE(st.ok()) << st.to_string();
    bytes = std::make_unique<DeviceArray<uint8_t>>(host);
    view = {bytes->get(), kCacheBlocks,          kCacheBlockSize,
            stride,       CacheDtype::kFp8DsMla, MemorySpace::kDevice};
  }
};

// One step's inputs, on the device, shared read-only by every thread: the batch, and the
// attention's query and indices (the CPU build's decode rows, slots folded into the cache).
struct Step {
  testing::RandomCase c;
  std::unique_ptr<DeviceBatch> dev;
  int64_t decode_rows = 0;
  int32_t decode_width = 0;
  std::unique_ptr<DeviceArray<int32_t>> idx, lens;
  std::unique_ptr<DeviceArray<uint16_t>> q;
};

std::vector<Step> make_steps(const BuilderConfig& config, uint64_t seed, const SharedCache& cache) {
  testing::RandomBatch gen(seed, testing::builder_test_options());
  auto cpu = MetadataBuilder::create(config, Backend::kCpu);
  EXPECT_TRUE(cpu.ok()) << cpu.status().to_string();
  std::vector<Step> steps(num_steps());
  for (int s = 0; s < num_steps(); ++s) {
    Step& st = steps[s];
    const auto mode = static_cast<testing::BatchMode>(s % testing::kNumBatchModes);
    st.c.config = config;
    st.c.mode = mode;
    const bool causal = config.speculative_method != SpeculativeMethod::kDspark || s % 2;
    st.c.batch = gen.batch_for(
        config, mode == testing::BatchMode::kDsparkNonCausal ? testing::BatchMode::kMixed : mode,
        causal);
    auto dev = DeviceBatch::upload(st.c.batch.input());
    EXPECT_TRUE(dev.ok()) << dev.status().to_string();
    st.dev = std::move(dev).value();
    SwaMetadata md;
    const Status built = (*cpu)->build(st.c.batch.input(), &md);
    EXPECT_TRUE(built.ok()) << built.to_string();
    st.decode_rows = md.decode_swa.rows;
    st.decode_width = md.decode_swa.width;
    std::vector<int32_t> idx(std::max<int64_t>(1, st.decode_rows * st.decode_width), -1);
    std::vector<int32_t> lens(std::max<int64_t>(1, st.decode_rows), 0);
    for (int64_t i = 0; i < st.decode_rows; ++i) {
      lens[i] = md.decode_swa.lens[i];
      for (int32_t j = 0; j < st.decode_width; ++j) {
        const int32_t v = md.decode_swa.row(i)[j];
        idx[i * st.decode_width + j] = v < 0 ? -1 : static_cast<int32_t>(v % cache.num_slots());
      }
    }
    st.idx = std::make_unique<DeviceArray<int32_t>>(idx);
    st.lens = std::make_unique<DeviceArray<int32_t>>(lens);
    std::vector<uint16_t> q(std::max<int64_t>(1, st.decode_rows) * kHeads * kHeadDim);
    for (size_t i = 0; i < q.size(); ++i)
      q[i] = fp8::float_to_bf16(0.01f * ((i * 37) % 101) - 0.5f);
    st.q = std::make_unique<DeviceArray<uint16_t>>(q);
  }
  return steps;
}

// The device outputs of one step's readers (consumers and attention), for one stream: a
// capacity-strided mixed matrix, the ragged decode rows, the attention output and its workspace.
class ReaderOutputs {
 public:
  ReaderOutputs(const BuilderConfig& config, int64_t workspace_bytes)
      : config_(config), workspace_bytes_(workspace_bytes) {
    const DerivedConfig d = derive_config(config);
    const size_t t = config.max_num_batched_tokens;
    const int32_t decode_width = std::max(config.window_size, d.noncausal_index_width);
    width_capacity_ = std::max(decode_width, d.prefill_index_width) + 8;
    mixed_ = std::make_unique<DeviceArray<int32_t>>(t * width_capacity_);
    mixed_lens_ = std::make_unique<DeviceArray<int32_t>>(t);
    indptr_ = std::make_unique<DeviceArray<int32_t>>(t + 1);
    values_ = std::make_unique<DeviceArray<int32_t>>(t * decode_width);
    out_ = std::make_unique<DeviceArray<uint16_t>>(t * kHeads * kHeadDim);
    lse_ = std::make_unique<DeviceArray<float>>(t * kHeads);
    workspace_ = std::make_unique<DeviceArray<uint8_t>>(workspace_bytes);
  }

  // The consumers and the attention of `step` over the finished build `md`, on `stream`.
  void enqueue(const SwaMetadata& md, const Step& step, const SharedCache& cache,
               cudaStream_t stream, StepResult* r) {
    const BatchInput in = step.dev->input();
    const ConsumerStep cs{md, in, config_.block_size};
    row_width_ = mixed_matrix_shape(md, {}).row_width;
    if (row_width_ > width_capacity_) {
      r->error = "mixed width " + std::to_string(row_width_);
      return;
    }
    const IndexView mixed{mixed_->get(),       mixed_lens_->get(), md.num_tokens,
                          row_width_,          row_width_,         0,
                          MemorySpace::kDevice};
    if (Status s = build_mixed_matrix(cs, {}, mixed, {}, stream); !s.ok()) {
      r->error = "mixed: " + s.to_string();
    }
    const RaggedView ragged{indptr_->get(), md.decode_swa.rows + 1, values_->get(),
                            ragged_capacity(md.decode_swa), MemorySpace::kDevice};
    if (Status s = to_ragged(md.decode_swa, ragged, stream); !s.ok()) {
      r->error = "ragged: " + s.to_string();
    }
    if (step.decode_rows == 0) return;
    SparseAttentionParams p;
    p.num_tokens = step.decode_rows;
    p.num_heads = kHeads;
    p.q = step.q->get();
    p.swa_cache = cache.view;
    p.swa_indices = {step.idx->get(),     step.lens->get(),  step.decode_rows,
                     step.decode_width,   step.decode_width, 0,
                     MemorySpace::kDevice};
    p.out = out_->get();
    p.lse = lse_->get();
    p.workspace = workspace_bytes_ > 0 ? workspace_->get() : nullptr;
    p.workspace_bytes = workspace_bytes_;
    if (Status s = sparse_attention(p, stream); !s.ok()) r->error = "attention: " + s.to_string();
  }

  // After `stream` finished the readers: their outputs on the host (md's counts only are read).
  void download(const SwaMetadata& md, cudaStream_t stream, StepResult* r) const {
    auto copy = [&](void* dst, const void* src, size_t bytes) {
      if (bytes == 0) return;
      EXPECT_EQ(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream), cudaSuccess);
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    };
    r->mixed.resize(static_cast<size_t>(md.num_tokens) * row_width_);
    r->mixed_lens.resize(md.num_tokens);
    copy(r->mixed.data(), mixed_->get(), r->mixed.size() * sizeof(int32_t));
    copy(r->mixed_lens.data(), mixed_lens_->get(), r->mixed_lens.size() * sizeof(int32_t));
    r->indptr.resize(md.decode_swa.rows + 1);
    copy(r->indptr.data(), indptr_->get(), r->indptr.size() * sizeof(int32_t));
    r->values.resize(std::max(0, r->indptr.back()));
    copy(r->values.data(), values_->get(), r->values.size() * sizeof(int32_t));
    const size_t rows = static_cast<size_t>(md.decode_swa.rows) * kHeads;
    r->out.resize(rows * kHeadDim);
    r->lse.resize(rows);
    copy(r->out.data(), out_->get(), r->out.size() * sizeof(uint16_t));
    copy(r->lse.data(), lse_->get(), r->lse.size() * sizeof(float));
  }

 private:
  BuilderConfig config_;
  int64_t workspace_bytes_ = 0;
  int32_t width_capacity_ = 0, row_width_ = 0;
  std::unique_ptr<DeviceArray<int32_t>> mixed_, mixed_lens_, indptr_, values_;
  std::unique_ptr<DeviceArray<uint16_t>> out_;
  std::unique_ptr<DeviceArray<float>> lse_;
  std::unique_ptr<DeviceArray<uint8_t>> workspace_;
};

// One thread's (or the serial run's) CUDA builder, stream and reader outputs. Everything it
// enqueues goes on its own stream; it waits for its own stream only.
class Worker {
 public:
  Worker(const BuilderConfig& config, int64_t workspace_bytes) : outputs_(config, workspace_bytes) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    auto b = MetadataBuilder::create(config, Backend::kCuda, stream_);
    EXPECT_TRUE(b.ok()) << b.status().to_string();
    if (b.ok()) builder_ = std::move(b).value();
  }
  ~Worker() {
    builder_.reset();
    cudaStreamDestroy(stream_);
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  cudaStream_t stream() const { return stream_; }
  MetadataBuilder& builder() { return *builder_; }

  // Builds `step`, runs its readers, waits and downloads everything.
  StepResult run(const Step& step, const SharedCache& cache) {
    StepResult r;
    SwaMetadata md;
    if (Status s = builder_->build(step.dev->input(), &md); !s.ok()) {
      r.error = "build: " + s.to_string();
      return r;
    }
    outputs_.enqueue(md, step, cache, stream_, &r);
    finish(md, &r);
    return r;
  }

  // The same with the build and the readers captured into a graph on this stream (thread-local
  // mode: other threads' CUDA calls do not invalidate the capture) and replayed once.
  StepResult captured(const Step& step, const SharedCache& cache) {
    StepResult r;
    SwaMetadata md;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    EXPECT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const Status built = builder_->build(step.dev->input(), &md);
    if (built.ok()) outputs_.enqueue(md, step, cache, stream_, &r);
    EXPECT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
    if (!built.ok()) r.error = "build: " + built.to_string();
    EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    EXPECT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
    finish(md, &r);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return r;
  }

 private:
  void finish(const SwaMetadata& md, StepResult* r) {
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    r->md = testing::snapshot(md, [&](void* dst, const void* src, size_t bytes) {
      if (bytes == 0) return;
      EXPECT_EQ(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), cudaSuccess);
      EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    });
    outputs_.download(md, stream_, r);
    if (Status s = builder_->take_device_error(); !s.ok()) r->error += "device: " + s.to_string();
  }

  cudaStream_t stream_ = nullptr;
  std::unique_ptr<MetadataBuilder> builder_;
  ReaderOutputs outputs_;
};

// Two configs with room for every mode's batches: DSpark (parallel drafting, non-causal steps)
// and MTP, both with image spans (the CUDA builder's pinned span staging).
std::vector<BuilderConfig> make_configs() {
  std::vector<BuilderConfig> configs(2);
  for (int g = 0; g < 2; ++g) {
    testing::RandomBatch gen(777 + g);
    configs[g] = gen.next(testing::BatchMode::kMixed).config;
    configs[g].speculative_method = g == 0 ? SpeculativeMethod::kDspark : SpeculativeMethod::kMtp;
    configs[g].num_speculative_tokens = g == 0 ? 3 : 2;
    configs[g].parallel_drafting = g == 0;
    configs[g].max_image_tokens = g == 0 ? 24 : 40;
    configs[g].noncausal_index_width = 0;
    configs[g].max_num_batched_tokens = 512;  // the largest batch_for() step is about 390
    configs[g].max_num_seqs = 64;
    configs[g].max_model_len = 1 << 16;
  }
  return configs;
}

// The largest workspace any step's attention uses (the same for every stream: one split plan).
int64_t workspace_for(const std::vector<Step>& steps, const SharedCache& cache) {
  int64_t bytes = 0;
  for (const Step& st : steps) {
    if (st.decode_rows == 0) continue;
    SparseAttentionParams p;
    p.num_tokens = st.decode_rows;
    p.num_heads = kHeads;
    p.swa_cache = cache.view;
    p.swa_indices = {st.idx->get(),       st.lens->get(),  st.decode_rows,
                     st.decode_width,     st.decode_width, 0,
                     MemorySpace::kDevice};
    bytes = std::max(bytes, sparse_attention_workspace_bytes(p));
  }
  return bytes;
}

TEST(ConcurrentCudaBuilders, ThreadsOnTheirOwnStreamsGiveTheSerialResults) {
  SKIP_WITHOUT_GPU();
  const SharedCache cache;
  const std::vector<BuilderConfig> configs = make_configs();
  std::vector<std::vector<Step>> steps;
  for (int g = 0; g < 2; ++g) steps.push_back(make_steps(configs[g], 4321 + g, cache));
  const int64_t workspace =
      std::max(workspace_for(steps[0], cache), workspace_for(steps[1], cache));

  // Serial: thread i's work, one thread at a time, one stream at a time.
  std::vector<std::vector<StepResult>> serial(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    Worker w(configs[i % 2], workspace);
    for (const Step& st : steps[i % 2]) serial[i].push_back(w.run(st, cache));
    serial[i].push_back(w.captured(steps[i % 2][i], cache));
  }
  for (const StepResult& r : serial[0]) ASSERT_EQ(r.error, "") << "the serial run failed";

  // The metadata are the CPU backend's.
  for (int g = 0; g < 2; ++g) {
    auto cpu = MetadataBuilder::create(configs[g], Backend::kCpu);
    ASSERT_TRUE(cpu.ok());
    for (int s = 0; s < num_steps(); ++s) {
      SwaMetadata md;
      ASSERT_TRUE((*cpu)->build(steps[g][s].c.batch.input(), &md).ok());
      EXPECT_EQ(testing::first_difference(testing::snapshot(md), serial[g].at(s).md), "")
          << "step " << s << " of config " << g;
    }
  }

  // Concurrent: every thread its own builder (created in the thread) and stream, all at once,
  // the last step captured and replayed while the other threads run.
  for (int round = 0; round < 2; ++round) {
    std::vector<std::vector<StepResult>> threaded(kThreads);
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&, i] {
        Worker w(configs[i % 2], workspace);
        for (const Step& st : steps[i % 2]) threaded[i].push_back(w.run(st, cache));
        threaded[i].push_back(w.captured(steps[i % 2][i], cache));
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

TEST(ConcurrentCudaBuilders, AFinishedBuildIsReadByOtherStreamsOrderedByEvents) {
  SKIP_WITHOUT_GPU();
  constexpr int kReaders = 3;
  const SharedCache cache;
  const BuilderConfig config = make_configs()[0];
  const std::vector<Step> steps = make_steps(config, 99, cache);
  const int64_t workspace = workspace_for(steps, cache);

  // Expected: each step built on its own, then its readers (one worker, serial).
  std::vector<StepResult> expected;
  {
    Worker w(config, workspace);
    for (const Step& st : steps) expected.push_back(w.run(st, cache));
  }
  for (const StepResult& r : expected) ASSERT_EQ(r.error, "");

  Worker producer(config, workspace);
  cudaEvent_t built = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&built, cudaEventDisableTiming), cudaSuccess);
  std::vector<cudaEvent_t> read(kReaders, nullptr);
  for (cudaEvent_t& e : read) {
    ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  }

  // Per step: the producer's stream waits for the readers of the last step, builds and records
  // `built`; each reader's stream waits for `built`, reads the metadata into this step's outputs
  // and records `read`. The host only orders the enqueues (the barrier): no stream is
  // synchronised until every step is enqueued.
  std::vector<SwaMetadata> mds(num_steps());
  std::vector<std::vector<StepResult>> got(kReaders, std::vector<StepResult>(num_steps()));
  std::barrier sync(kReaders + 1);
  std::vector<std::thread> threads;
  for (int r = 0; r < kReaders; ++r) {
    threads.emplace_back([&, r] {
      cudaStream_t stream = nullptr;
      EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
      std::vector<std::unique_ptr<ReaderOutputs>> outputs;
      for (int s = 0; s < num_steps(); ++s) {
        outputs.push_back(std::make_unique<ReaderOutputs>(config, workspace));
      }
      for (int s = 0; s < num_steps(); ++s) {
        sync.arrive_and_wait();  // step s enqueued, `built` recorded after it
        EXPECT_EQ(cudaStreamWaitEvent(stream, built, 0), cudaSuccess);
        outputs[s]->enqueue(mds[s], steps[s], cache, stream, &got[r][s]);
        EXPECT_EQ(cudaEventRecord(read[r], stream), cudaSuccess);
        sync.arrive_and_wait();  // `read` recorded
      }
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      for (int s = 0; s < num_steps(); ++s) outputs[s]->download(mds[s], stream, &got[r][s]);
      cudaStreamDestroy(stream);
    });
  }
  for (int s = 0; s < num_steps(); ++s) {
    for (cudaEvent_t e : read) {
      EXPECT_EQ(cudaStreamWaitEvent(producer.stream(), e, 0), cudaSuccess);
    }
    const Status st = producer.builder().build(steps[s].dev->input(), &mds[s]);
    EXPECT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(cudaEventRecord(built, producer.stream()), cudaSuccess);
    sync.arrive_and_wait();
    sync.arrive_and_wait();
  }
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(producer.builder().take_device_error().ok());
  for (int r = 0; r < kReaders; ++r) {
    for (int s = 0; s < num_steps(); ++s) {
      got[r][s].md = expected[s].md;  // the readers' outputs are compared; their metadata was
                                      // the producer's, overwritten since
      EXPECT_EQ(testing::first_step_difference(expected[s], got[r][s]), "")
          << "reader " << r << ", step " << s;
    }
  }
  cudaEventDestroy(built);
  for (cudaEvent_t e : read) cudaEventDestroy(e);
}

}  // namespace
}  // namespace sparse_swa
