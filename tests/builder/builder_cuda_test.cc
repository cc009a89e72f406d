// SPDX-License-Identifier: Apache-2.0
// CUDA metadata builder vs the CPU reference: bitwise equality on random batches of every mode,
// CUDA-graph capture and replay after in-place updates, stale host splits, device-side checks.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "cuda/cuda_utils.h"
#include "sparse_swa/metadata_builder.h"
#include "support/device_array.h"
#include "support/metadata_snapshot.h"
#include "support/status_matchers.h"
#include "testing/random_batch.h"
#include "testing/test_batch.h"

namespace sparse_swa {
namespace {

using testing::first_difference;
using testing::MetadataSnapshot;
using testing::RandomBatch;
using testing::TestBatch;

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

void copy_to_host(void* dst, const void* src, size_t bytes) {
  ASSERT_EQ(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
}

MetadataSnapshot device_snapshot(const SwaMetadata& md) {
  return testing::snapshot(md, [](void* d, const void* s, size_t n) { copy_to_host(d, s, n); });
}

// Device copies of a TestBatch's arrays; input() points the BatchInput at them, with the
// TestBatch's arrays as the host copies.
class DeviceBatch {
 public:
  explicit DeviceBatch(const TestBatch& b) : host_(b) { upload(); }

  // Re-uploads after the host TestBatch changed in place (same shape).
  void upload() {
    host_input_ = host_.input();
    auto put = [](auto* dst, const auto* src, size_t n) {
      using T = std::remove_const_t<std::remove_pointer_t<decltype(src)>>;
      if (dst->get() == nullptr) ASSERT_TRUE(dst->allocate(std::max<size_t>(1, n)).ok());
      if (n > 0) {
        ASSERT_EQ(cudaMemcpy(dst->get(), src, n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
      }
    };
    const auto& bt = host_input_.block_table;
    put(&qsl_, host_input_.query_start_loc.data(), host_input_.query_start_loc.size());
    put(&seq_, host_input_.seq_lens.data(), host_input_.seq_lens.size());
    put(&bt_, bt.data, static_cast<size_t>(bt.rows * bt.stride));
    put(&slots_, host_input_.slot_mapping.data(), host_input_.slot_mapping.size());
    if (!host_input_.replay_start.empty()) {
      put(&replay_, host_input_.replay_start.data(), host_input_.replay_start.size());
    }
  }

  BatchInput input() const {
    BatchInput in = host_input_;
    in.query_start_loc = {qsl_.get(), host_input_.query_start_loc.size()};
    in.seq_lens = {seq_.get(), host_input_.seq_lens.size()};
    in.block_table.data = bt_.get();
    in.block_table.space = MemorySpace::kDevice;
    in.slot_mapping = {slots_.get(), host_input_.slot_mapping.size()};
    if (!host_input_.replay_start.empty()) {
      in.replay_start = {replay_.get(), host_input_.replay_start.size()};
    }
    in.query_start_loc_host = host_input_.query_start_loc;
    in.seq_lens_host = host_input_.seq_lens;
    return in;
  }
  int32_t* device_qsl() { return qsl_.get(); }
  int32_t* device_seq_lens() { return seq_.get(); }
  int64_t* device_slots() { return slots_.get(); }
  int32_t* device_replay_start() { return replay_.get(); }

 private:
  const TestBatch& host_;
  BatchInput host_input_;
  detail::DeviceBuffer<int32_t> qsl_, seq_, bt_, replay_;
  detail::DeviceBuffer<int64_t> slots_;
};

std::unique_ptr<MetadataBuilder> make(const BuilderConfig& c, Backend backend,
                                      cudaStream_t stream = nullptr) {
  auto b = MetadataBuilder::create(c, backend, stream);
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  return b.ok() ? std::move(b).value() : nullptr;
}

// Decode lens past Td are part of the contract (zeroed for graph replays that read past Td).
std::vector<int32_t> lens_tail(const SwaMetadata& md, int32_t capacity, bool device) {
  const int32_t td = md.num_decode_tokens;
  std::vector<int32_t> tail(capacity - td);
  if (tail.empty()) return tail;
  const int32_t* src = md.decode_swa.lens + td;
  if (device) {
    copy_to_host(tail.data(), src, tail.size() * sizeof(int32_t));
  } else {
    std::memcpy(tail.data(), src, tail.size() * sizeof(int32_t));
  }
  return tail;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : fallback;
}

TEST(CudaBuilder, MatchesCpuBitwiseOnRandomBatches) {
  SKIP_WITHOUT_GPU();
  const int cases = env_int("SPARSE_SWA_DIFF_CASES", 10000);
  // Replay in about a third of the batches, the newer config switches drawn.
  RandomBatch gen(20261129, testing::builder_test_options());
  int compared_rows = 0, replayed = 0;
  for (int i = 0; i < cases; ++i) {
    testing::RandomCase c = gen.next();
    SCOPED_TRACE(c.describe());
    auto cpu = make(c.config, Backend::kCpu);
    auto gpu = make(c.config, Backend::kCuda);
    ASSERT_TRUE(cpu && gpu);
    ASSERT_TRUE(detail::poison_cuda_builder_outputs(gpu.get(), 0xab).ok());
    DeviceBatch dev(c.batch);
    SwaMetadata md_cpu, md_gpu;
    ASSERT_TRUE(cpu->build(c.batch.input(), &md_cpu).ok());
    const Status st = gpu->build(dev.input(), &md_gpu);
    ASSERT_TRUE(st.ok()) << st.to_string();
    const Status device_error = gpu->take_device_error();
    ASSERT_TRUE(device_error.ok()) << device_error.to_string();
    const MetadataSnapshot a = testing::snapshot(md_cpu), b = device_snapshot(md_gpu);
    ASSERT_EQ(first_difference(a, b), "");
    if (md_cpu.num_decode_tokens > 0) {
      ASSERT_EQ(lens_tail(md_cpu, c.config.max_num_batched_tokens, false),
                lens_tail(md_gpu, c.config.max_num_batched_tokens, true));
    }
    compared_rows += md_cpu.num_tokens;
    replayed += md_cpu.replay_start_given;
  }
  std::printf("compared %d batches (%d with replay_start), %d rows\n", cases, replayed,
              compared_rows);
  if (cases >= 100) EXPECT_GT(replayed, cases / 5);
}

// Advances every decode request by one token in place (the drafting loop): seq_len + 1, the
// new position's page valid, its slot in slot_mapping. The query split is unchanged.
void advance_decodes(TestBatch* b, int32_t num_decodes) {
  for (int32_t r = 0; r < num_decodes; ++r) {
    b->seq_lens[r] += 1;
    const int32_t needed = (b->seq_lens[r] + b->block_size() - 1) / b->block_size();
    while (static_cast<int32_t>(b->pages[r].size()) < needed) b->pages[r].push_back(1000 + r);
    for (int32_t t = b->query_start_loc[r]; t < b->query_start_loc[r + 1]; ++t) {
      if (b->slot_mapping[t] >= 0) {
        b->slot_mapping[t] = b->slot(r, b->prefix_len(r) + (t - b->query_start_loc[r]));
      }
    }
  }
  b->min_block_table_cols = std::max(b->min_block_table_cols, b->block_table_cols());
}

// The work `enqueue` puts on `stream`, captured once into a graph and replayable (the way an
// engine runs a decoding step). status() is what `enqueue` returned during the capture.
class CapturedGraph {
 public:
  CapturedGraph(cudaStream_t stream, const std::function<Status()>& enqueue) : stream_(stream) {
    EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    status_ = enqueue();
    EXPECT_EQ(cudaStreamEndCapture(stream, &graph_), cudaSuccess);
    EXPECT_EQ(cudaGraphInstantiate(&exec_, graph_, 0), cudaSuccess);
  }
  ~CapturedGraph() {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;

  const Status& status() const { return status_; }
  // Replays the graph and waits for it.
  cudaError_t replay() {
    const cudaError_t err = cudaGraphLaunch(exec_, stream_);
    return err != cudaSuccess ? err : cudaStreamSynchronize(stream_);
  }

 private:
  cudaStream_t stream_;
  Status status_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

TEST(CudaBuilder, GraphReplayAfterInPlaceUpdatesMatchesCpu) {
  SKIP_WITHOUT_GPU();
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  RandomBatch gen(7, testing::builder_test_options());
  for (testing::BatchMode mode : {testing::BatchMode::kMtp, testing::BatchMode::kDsparkNonCausal,
                                  testing::BatchMode::kImage, testing::BatchMode::kMixed}) {
    for (int rep = 0; rep < 5; ++rep) {
      testing::RandomCase c = gen.next(mode);
      SCOPED_TRACE(c.describe());
      c.config.max_num_batched_tokens += 8;
      c.config.max_model_len += 64;
      // Leave room in the table for the advanced positions; fixed shape across replays.
      c.batch.min_block_table_cols = c.batch.block_table_cols() + 4;
      auto gpu = make(c.config, Backend::kCuda, stream);
      auto cpu = make(c.config, Backend::kCpu);
      ASSERT_TRUE(gpu && cpu);
      DeviceBatch dev(c.batch);
      SwaMetadata md_gpu;
      CapturedGraph graph(stream, [&] { return gpu->build(dev.input(), &md_gpu); });
      ASSERT_TRUE(graph.status().ok()) << graph.status().to_string();
      SwaMetadata md_cpu;
      ASSERT_TRUE(cpu->build(c.batch.input(), &md_cpu).ok());
      for (int step = 0; step < 3; ++step) {
        // Draft step: the same shape, seq_lens / block_table / slot_mapping updated in place.
        advance_decodes(&c.batch, md_cpu.num_decodes);
        dev.upload();
        ASSERT_TRUE(detail::poison_cuda_builder_outputs(gpu.get(), 0xcd).ok());
        CUDA_OK(graph.replay());
        ASSERT_TRUE(gpu->take_device_error().ok());
        ASSERT_TRUE(cpu->build(c.batch.input(), &md_cpu).ok());
        MetadataSnapshot a = testing::snapshot(md_cpu), b = device_snapshot(md_gpu);
        // Host planning fields were fixed at capture time.
        b.at("prefill_seq_lens_host") = a.at("prefill_seq_lens_host");
        ASSERT_EQ(first_difference(a, b), "") << "step " << step;
      }
    }
  }
  CUDA_OK(cudaStreamDestroy(stream));
}

// set_cuda_stream moves later builds to another stream: a builder made on the default stream
// and pointed at a capturing stream records its build into the graph (on the default stream the
// capture would fail), and the replay writes what the CPU builder writes.
TEST(CudaBuilder, SetCudaStreamMovesLaterBuilds) {
  SKIP_WITHOUT_GPU();
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  RandomBatch gen(11);
  testing::RandomCase c = gen.next(testing::BatchMode::kMixed);
  SCOPED_TRACE(c.describe());
  auto gpu = make(c.config, Backend::kCuda, nullptr);
  auto cpu = make(c.config, Backend::kCpu);
  ASSERT_TRUE(gpu && cpu);
  DeviceBatch dev(c.batch);
  SwaMetadata md_gpu, md_cpu;
  ASSERT_TRUE(gpu->build(dev.input(), &md_gpu).ok());  // on the default stream
  CUDA_OK(cudaDeviceSynchronize());
  gpu->set_cuda_stream(stream);
  CapturedGraph graph(stream, [&] { return gpu->build(dev.input(), &md_gpu); });
  ASSERT_TRUE(graph.status().ok()) << graph.status().to_string();
  ASSERT_TRUE(detail::poison_cuda_builder_outputs(gpu.get(), 0xcd).ok());
  CUDA_OK(graph.replay());
  ASSERT_TRUE(gpu->take_device_error().ok());
  ASSERT_TRUE(cpu->build(c.batch.input(), &md_cpu).ok());
  ASSERT_EQ(first_difference(testing::snapshot(md_cpu), device_snapshot(md_gpu)), "");
  gpu.reset();
  CUDA_OK(cudaStreamDestroy(stream));
}

// The captured update replayed over advanced arrays writes what the CPU update writes: causal
// rows of W with the build's replay_start, non-causal rows, FlashInfer lens, mapping, validity.
TEST(CudaBuilder, CapturedDraftUpdateMatchesCpu) {
  SKIP_WITHOUT_GPU();
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  RandomBatch gen(11, testing::builder_test_options());
  for (int rep = 0; rep < 40; ++rep) {
    testing::RandomCase c =
        gen.next(rep % 2 ? testing::BatchMode::kDsparkNonCausal : testing::BatchMode::kMtp);
    SCOPED_TRACE(c.describe());
    c.config.max_model_len += 64;
    c.batch.min_block_table_cols = c.batch.block_table_cols() + 4;
    auto gpu = make(c.config, Backend::kCuda, stream);
    auto cpu = make(c.config, Backend::kCpu);
    ASSERT_TRUE(gpu && cpu);
    DeviceBatch dev(c.batch);
    SwaMetadata md_gpu, md_cpu;
    ASSERT_TRUE(gpu->build(dev.input(), &md_gpu).ok());
    ASSERT_TRUE(cpu->build(c.batch.input(), &md_cpu).ok());
    CapturedGraph graph(stream,
                        [&] { return gpu->update_draft_decode_rows(dev.input(), &md_gpu); });
    ASSERT_TRUE(graph.status().ok()) << graph.status().to_string();
    for (int step = 0; step < 3; ++step) {
      advance_decodes(&c.batch, md_cpu.num_decodes);
      dev.upload();
      CUDA_OK(graph.replay());
      ASSERT_TRUE(gpu->take_device_error().ok());
      ASSERT_TRUE(cpu->update_draft_decode_rows(c.batch.input(), &md_cpu).ok());
      ASSERT_EQ(first_difference(testing::snapshot(md_cpu), device_snapshot(md_gpu)), "")
          << "step " << step;
    }
  }
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST(CudaBuilder, TokenMappingFollowsDeviceSplitWhenHostSplitIsStale) {
  SKIP_WITHOUT_GPU();
  // Adaptive draft verification: the host copy has the right total only, the rows follow the
  // device array (docs/semantics.md#token-mapping-and-validity).
  BuilderConfig c;
  c.window_size = 8;
  c.block_size = 4;
  c.max_num_batched_tokens = 64;
  c.max_num_seqs = 8;
  c.max_model_len = 256;
  c.num_speculative_tokens = 3;
  c.speculative_method = SpeculativeMethod::kDspark;
  c.parallel_drafting = true;
  TestBatch b(4);
  for (int32_t q : {1, 7, 3, 5}) b.add_identity_request(20 + q, q);
  const std::vector<int32_t> stale_host_qsl = {0, 4, 8, 12, 16};
  auto gpu = make(c, Backend::kCuda);
  auto cpu = make(c, Backend::kCpu);
  ASSERT_TRUE(gpu && cpu);
  DeviceBatch dev(b);
  BatchInput in = dev.input();
  in.query_start_loc_host = stale_host_qsl;
  SwaMetadata md_gpu, md_cpu;
  ASSERT_TRUE(gpu->build(in, &md_gpu).ok());
  // The CPU backend reads both arrays and refuses a copy that differs from its array; built from
  // the array alone it gives the device split's rows. Only max_decode_query_len comes from the
  // host split (min(4, theta 7) on CUDA, min(7, 7) from the array).
  BatchInput host_in = b.input();
  host_in.query_start_loc_host = stale_host_qsl;
  EXPECT_TRUE(testing::IsInvalidArgument(cpu->build(host_in, &md_cpu),
                                         {"batch.query_start_loc_host[1]", "got 4"}));
  ASSERT_TRUE(cpu->build(b.input(), &md_cpu).ok());
  MetadataSnapshot a = testing::snapshot(md_cpu);
  const MetadataSnapshot g = device_snapshot(md_gpu);
  EXPECT_EQ(a.at("max_decode_query_len"), std::vector<int64_t>{7});
  EXPECT_EQ(g.at("max_decode_query_len"), std::vector<int64_t>{4});
  a.at("max_decode_query_len") = g.at("max_decode_query_len");
  EXPECT_EQ(first_difference(a, g), "");
  EXPECT_EQ(g.ints("token_to_req_indices"),
            (std::vector<int32_t>{0, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3}));
  EXPECT_TRUE(gpu->take_device_error().ok());
}

// ---------------------------------------------------------------- hostile inputs

BuilderConfig draft_config() {
  BuilderConfig c;
  c.window_size = 8;
  c.block_size = 4;
  c.max_num_batched_tokens = 16;
  c.max_num_seqs = 4;
  c.max_model_len = 64;
  c.speculative_method = SpeculativeMethod::kMtp;
  c.num_speculative_tokens = 4;  // theta 5
  return c;
}

// Decodes of query lengths 1, 1, 5, an invalid token and two CUDA-graph padding tokens.
TestBatch draft_batch() {
  TestBatch b(4);
  b.add_identity_request(5, 1).add_identity_request(9, 1).add_identity_request(12, 5);
  b.invalidate(4).pad_tokens(2);
  b.min_block_table_cols = 16;
  return b;
}

// docs/semantics.md#draft-update: the update reads the device arrays; stale host copies (as the
// build left them) or none at all are accepted, and moved spans are followed as on the CPU.
TEST(CudaBuilder, DraftUpdateFollowsMovedSpansLikeTheCpu) {
  SKIP_WITHOUT_GPU();
  auto gpu = make(draft_config(), Backend::kCuda);
  auto cpu = make(draft_config(), Backend::kCpu);
  ASSERT_TRUE(gpu && cpu);
  TestBatch b = draft_batch();
  DeviceBatch dev(b);
  SwaMetadata md_gpu, md_cpu;
  ASSERT_TRUE(gpu->build(dev.input(), &md_gpu).ok());
  ASSERT_TRUE(cpu->build(b.input(), &md_cpu).ok());
  TestBatch moved = b;
  moved.query_start_loc = {0, 2, 2, 7};  // request 0 takes token 1; request 1 empty
  DeviceBatch moved_dev(moved);
  BatchInput in = moved_dev.input();
  in.query_start_loc_host = b.query_start_loc;  // the build's: not read
  ASSERT_TRUE(gpu->update_draft_decode_rows(in, &md_gpu).ok());
  ASSERT_TRUE(cpu->update_draft_decode_rows(moved.input(), &md_cpu).ok());
  EXPECT_TRUE(gpu->take_device_error().ok());
  const MetadataSnapshot a = testing::snapshot(md_cpu);
  EXPECT_EQ(a.ints("token_to_req_indices"), (std::vector<int32_t>{0, 0, 2, 2, 2, 2, 2, 2, 2}));
  EXPECT_EQ(first_difference(a, device_snapshot(md_gpu)), "");
  // Without host copies too.
  in.query_start_loc_host = {};
  in.seq_lens_host = {};
  ASSERT_TRUE(gpu->update_draft_decode_rows(in, &md_gpu).ok());
  EXPECT_TRUE(gpu->take_device_error().ok());
  EXPECT_EQ(first_difference(a, device_snapshot(md_gpu)), "");
  // Metadata counts edited by the caller are refused as on the CPU.
  SwaMetadata edited = md_gpu;
  edited.num_decode_tokens = edited.decode_swa.rows = 16;
  EXPECT_TRUE(testing::IsInvalidArgument(gpu->update_draft_decode_rows(dev.input(), &edited),
                                         {"metadata.num_decode_tokens",
                                          "expected the last "
                                          "build's 9"}));
}

// A graph captured over a dummy batch's update and replayed over another padding: the padding
// tokens map to the last request, validity follows the device slot_mapping.
TEST(CudaBuilder, CapturedDraftUpdateReadsTheDeviceQueryStartLocAndSlots) {
  SKIP_WITHOUT_GPU();
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto gpu = make(draft_config(), Backend::kCuda, stream);
  auto cpu = make(draft_config(), Backend::kCpu);
  ASSERT_TRUE(gpu && cpu);
  TestBatch b = draft_batch();
  DeviceBatch dev(b);
  SwaMetadata md_gpu, md_cpu;
  ASSERT_TRUE(gpu->build(dev.input(), &md_gpu).ok());
  ASSERT_TRUE(cpu->build(b.input(), &md_cpu).ok());
  CapturedGraph graph(stream, [&] { return gpu->update_draft_decode_rows(dev.input(), &md_gpu); });
  ASSERT_TRUE(graph.status().ok()) << graph.status().to_string();
  // Request 2 shrinks to 3 tokens: tokens 5 and 6 turn padding (slot -1).
  b.query_start_loc = {0, 1, 2, 5};
  b.seq_lens = {5, 9, 10};
  b.slot_mapping[5] = b.slot_mapping[6] = -1;
  dev.upload();
  CUDA_OK(graph.replay());
  EXPECT_TRUE(gpu->take_device_error().ok());
  ASSERT_TRUE(cpu->update_draft_decode_rows(b.input(), &md_cpu).ok());
  const MetadataSnapshot a = testing::snapshot(md_cpu);
  EXPECT_EQ(a.ints("token_to_req_indices"), (std::vector<int32_t>{0, 1, 2, 2, 2, 2, 2, 2, 2}));
  EXPECT_EQ(a.ints("decode_swa.lens"), (std::vector<int32_t>{5, 8, 8, 8, 0, 0, 0, 0, 0}));
  EXPECT_EQ(first_difference(a, device_snapshot(md_gpu)), "");
  gpu.reset();
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST(CudaBuilder, DraftUpdateRecomputesTheExportedMappingAndValidity) {
  SKIP_WITHOUT_GPU();
  auto gpu = make(draft_config(), Backend::kCuda);
  auto cpu = make(draft_config(), Backend::kCpu);
  ASSERT_TRUE(gpu && cpu);
  TestBatch b = draft_batch();
  DeviceBatch dev(b);
  SwaMetadata md_gpu, md_cpu;
  ASSERT_TRUE(gpu->build(dev.input(), &md_gpu).ok());
  ASSERT_TRUE(cpu->build(b.input(), &md_cpu).ok());
  const MetadataSnapshot built = device_snapshot(md_gpu);
  const std::vector<int32_t> mapping(9, 1000000);
  const std::vector<uint8_t> valid(9, 1);
  CUDA_OK(cudaMemcpy(const_cast<int32_t*>(md_gpu.token_to_req_indices.data()), mapping.data(),
                     9 * sizeof(int32_t), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(const_cast<uint8_t*>(md_gpu.is_valid_token.data()), valid.data(), 9,
                     cudaMemcpyHostToDevice));
  advance_decodes(&b, md_cpu.num_decodes);
  dev.upload();
  ASSERT_TRUE(gpu->update_draft_decode_rows(dev.input(), &md_gpu).ok());
  ASSERT_TRUE(cpu->update_draft_decode_rows(b.input(), &md_cpu).ok());
  EXPECT_TRUE(gpu->take_device_error().ok());
  const MetadataSnapshot a = testing::snapshot(md_cpu), g = device_snapshot(md_gpu);
  EXPECT_EQ(a.ints("decode_swa.lens"), (std::vector<int32_t>{6, 8, 8, 8, 0, 8, 8, 0, 0}));
  EXPECT_EQ(a.ints("token_to_req_indices"), (std::vector<int32_t>{0, 1, 2, 2, 2, 2, 2, 2, 2}));
  EXPECT_EQ(first_difference(a, g), "");
  EXPECT_NE(first_difference(built, g), "");
}

// A device replay_start outside [0, prefix] (the host cannot see it): reported through the
// error word, and no row reads below it or past its token.
TEST(CudaBuilder, DeviceReplayStartPastThePrefixIsReportedNotFaulted) {
  SKIP_WITHOUT_GPU();
  auto gpu = make(draft_config(), Backend::kCuda);
  ASSERT_TRUE(gpu);
  TestBatch b = draft_batch();
  b.replay_start = {4, 0, 7};
  DeviceBatch dev(b);
  const int32_t bad = 9;  // request 2: prefix 7
  CUDA_OK(cudaMemcpy(dev.device_replay_start() + 2, &bad, sizeof(bad), cudaMemcpyHostToDevice));
  SwaMetadata md;
  ASSERT_TRUE(gpu->build(dev.input(), &md).ok());
  const Status st = gpu->take_device_error();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("a replay_start outside [0, seq_len - query_len]"), std::string::npos)
      << st.message();
  const MetadataSnapshot s = device_snapshot(md);
  // Request 2's tokens at positions 7, 8 are invalid (start 9 > pos); 9..11 start at 9.
  EXPECT_EQ(s.ints("decode_swa.lens"), (std::vector<int32_t>{1, 8, 0, 0, 0, 2, 3, 0, 0}));
  EXPECT_EQ(s.ints("replay_start"), (std::vector<int32_t>{4, 0, 9}));
  EXPECT_TRUE(gpu->take_device_error().ok());
}

TEST(CudaBuilder, InputsOverlappingTheBuildersBuffersAreRejected) {
  SKIP_WITHOUT_GPU();
  auto gpu = make(draft_config(), Backend::kCuda);
  ASSERT_TRUE(gpu);
  TestBatch b = draft_batch();
  DeviceBatch dev(b);
  SwaMetadata md;
  ASSERT_TRUE(gpu->build(dev.input(), &md).ok());
  BatchInput in = dev.input();
  in.seq_lens = {md.decode_swa.lens, 3};
  EXPECT_TRUE(testing::IsInvalidArgument(gpu->build(in, &md),
                                         {"batch.seq_lens", "overlapping its decode_swa.lens"}));
  EXPECT_TRUE(testing::IsInvalidArgument(gpu->update_draft_decode_rows(in, &md),
                                         {"batch.seq_lens", "overlapping its decode_swa.lens"}));
  in = dev.input();
  in.block_table.data = md.decode_swa.data;
  EXPECT_TRUE(testing::IsInvalidArgument(gpu->build(in, &md),
                                         {"batch.block_table", "overlapping its decode_swa.data"}));
  EXPECT_TRUE(gpu->take_device_error().ok());
}

TEST(CudaBuilder, DeviceInputsThatContradictTheHostCopiesAreReportedNotFaulted) {
  SKIP_WITHOUT_GPU();
  BuilderConfig c;
  c.window_size = 8;
  c.block_size = 4;
  c.max_num_batched_tokens = 16;
  c.max_num_seqs = 4;
  c.max_model_len = 64;
  TestBatch b(4);
  b.add_identity_request(12, 1).add_identity_request(9, 1);
  auto gpu = make(c, Backend::kCuda);
  ASSERT_TRUE(gpu);
  DeviceBatch dev(b);
  // The device seq_len of request 1 says 4000: its window would run far past the block table.
  const int32_t huge = 4000;
  CUDA_OK(cudaMemcpy(dev.device_seq_lens() + 1, &huge, sizeof(huge), cudaMemcpyHostToDevice));
  SwaMetadata md;
  ASSERT_TRUE(gpu->build(dev.input(), &md).ok());
  const Status st = gpu->take_device_error();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("block index past block_table"), std::string::npos) << st.message();
  const MetadataSnapshot s = device_snapshot(md);
  EXPECT_EQ(s.ints("decode_swa.lens"), (std::vector<int32_t>{8, 0}));
  const std::vector<int32_t> rows = s.ints("decode_swa.rows");
  EXPECT_EQ(std::vector<int32_t>(rows.begin() + 8, rows.end()), std::vector<int32_t>(8, -1));
  EXPECT_TRUE(gpu->take_device_error().ok()) << "the record is cleared once taken";
}

TEST(CudaBuilder, RequiresHostCopies) {
  SKIP_WITHOUT_GPU();
  BuilderConfig c;
  c.window_size = 8;
  c.block_size = 4;
  c.max_num_batched_tokens = 16;
  c.max_num_seqs = 4;
  c.max_model_len = 64;
  TestBatch b(4);
  b.add_identity_request(12, 1);
  auto gpu = make(c, Backend::kCuda);
  ASSERT_TRUE(gpu);
  DeviceBatch dev(b);
  BatchInput in = dev.input();
  in.query_start_loc_host = {};
  in.seq_lens_host = {};
  SwaMetadata md;
  const Status st = gpu->build(in, &md);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("host copies"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace sparse_swa
