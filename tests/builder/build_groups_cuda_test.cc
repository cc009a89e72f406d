// SPDX-License-Identifier: Apache-2.0
// MetadataBuilder::build_groups on the CUDA backend (one kernel launch for every group) against
// each group's own CPU build, bit for bit; captured in a graph and replayed; device errors
// recorded by the group that has them; streams, devices and backends checked.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "backend.h"
#include "sparse_swa/device_copies.h"
#include "sparse_swa/metadata_builder.h"
#include "support/device_array.h"
#include "support/metadata_snapshot.h"
#include "support/status_matchers.h"
#include "testing/random_batch.h"

namespace sparse_swa {
namespace {

using testing::first_difference;
using testing::MetadataSnapshot;
using testing::RandomBatch;
using testing::RandomCase;

MetadataSnapshot device_snapshot(const SwaMetadata& md) {
  return testing::snapshot(md, [](void* d, const void* s, size_t n) {
    ASSERT_EQ(cudaMemcpy(d, s, n, cudaMemcpyDeviceToHost), cudaSuccess);
  });
}

std::unique_ptr<MetadataBuilder> make(const BuilderConfig& c, Backend backend,
                                      cudaStream_t stream = nullptr) {
  auto b = MetadataBuilder::create(c, backend, stream);
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  return b.ok() ? std::move(b).value() : nullptr;
}

// A step of n groups: the CPU builders, the CUDA builders (on `stream`) and the device batches.
struct GroupStep {
  std::vector<RandomCase> cases;
  std::vector<std::unique_ptr<MetadataBuilder>> cpu, gpu;
  std::vector<std::unique_ptr<DeviceBatch>> device;
  std::vector<MetadataBuilder*> gpu_builders;
  std::vector<BatchInput> device_batches;

  GroupStep(RandomBatch& gen, int n, cudaStream_t stream) {
    cases.push_back(gen.next());
    while (static_cast<int>(cases.size()) < n) cases.push_back(gen.other_group(cases[0]));
    for (const RandomCase& c : cases) {
      cpu.push_back(make(c.config, Backend::kCpu));
      gpu.push_back(make(c.config, Backend::kCuda, stream));
      auto d = DeviceBatch::upload(c.batch.input());
      EXPECT_TRUE(d.ok()) << d.status().to_string();
      device.push_back(std::move(d).value());
      gpu_builders.push_back(gpu.back().get());
      device_batches.push_back(device.back()->input());
    }
  }
  // Every group's CPU build against `out`, the CUDA group build's metadata.
  std::string compare(const std::vector<SwaMetadata>& out) {
    for (size_t g = 0; g < cases.size(); ++g) {
      SwaMetadata want;
      const Status st = cpu[g]->build(cases[g].batch.input(), &want);
      if (!st.ok()) return st.to_string();
      const std::string diff = first_difference(testing::snapshot(want), device_snapshot(out[g]));
      if (!diff.empty()) return "group " + std::to_string(g) + ": " + diff;
    }
    return "";
  }
};

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : fallback;
}

TEST(CudaBuildGroups, MatchesEachGroupsCpuBuildOnRandomSteps) {
  SKIP_WITHOUT_GPU();
  const int cases = env_int("SPARSE_SWA_DIFF_CASES", 3000) / 3;
  RandomBatch gen(20261208, testing::builder_test_options());
  for (int i = 0; i < cases; ++i) {
    GroupStep step(gen, gen.uniform(1, 4), nullptr);
    SCOPED_TRACE(step.cases[0].describe());
    for (auto& b : step.gpu) ASSERT_TRUE(detail::poison_cuda_builder_outputs(b.get(), 0xab).ok());
    std::vector<SwaMetadata> out(step.cases.size());
    const Status st = MetadataBuilder::build_groups(step.gpu_builders, step.device_batches, out);
    ASSERT_TRUE(st.ok()) << st.to_string();
    for (auto& b : step.gpu) ASSERT_TRUE(b->take_device_error().ok());
    ASSERT_EQ(step.compare(out), "") << "case " << i;
  }
}

TEST(CudaBuildGroups, CapturedAndReplayedMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  RandomBatch gen(31, testing::builder_test_options());
  for (int rep = 0; rep < 10; ++rep) {
    GroupStep step(gen, 3, stream);
    SCOPED_TRACE(step.cases[0].describe());
    std::vector<SwaMetadata> out(3);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const Status st = MetadataBuilder::build_groups(step.gpu_builders, step.device_batches, out);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (auto& b : step.gpu) ASSERT_TRUE(detail::poison_cuda_builder_outputs(b.get(), 0xcd).ok());
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (auto& b : step.gpu) ASSERT_TRUE(b->take_device_error().ok());
    ASSERT_EQ(step.compare(out), "");
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST(CudaBuildGroups, DeviceErrorsStayWithTheirGroup) {
  SKIP_WITHOUT_GPU();
  RandomBatch gen(41);
  GroupStep step(gen, 2, nullptr);
  // Group 1's device seq_lens[0] far past its block table; the host copies still agree.
  int32_t huge = 1 << 30;
  BatchInput& in = step.device_batches[1];
  ASSERT_GT(in.seq_lens.size(), 0u);
  ASSERT_EQ(cudaMemcpy(const_cast<int32_t*>(in.seq_lens.data()), &huge, sizeof(huge),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  std::vector<SwaMetadata> out(2);
  ASSERT_TRUE(MetadataBuilder::build_groups(step.gpu_builders, step.device_batches, out).ok());
  EXPECT_TRUE(step.gpu[0]->take_device_error().ok());
  const testing::TestBatch& b1 = step.cases[1].batch;
  bool reads_request0 = false;  // a valid token of request 0 has a row to write
  for (int32_t t = b1.query_start_loc[0]; t < b1.query_start_loc[1]; ++t)
    reads_request0 = reads_request0 || b1.slot_mapping[t] >= 0;
  if (reads_request0) {
    EXPECT_EQ(step.gpu[1]->take_device_error().code(), StatusCode::kInvalidArgument);
  }
  SwaMetadata want;
  ASSERT_TRUE(step.cpu[0]->build(step.cases[0].batch.input(), &want).ok());
  EXPECT_EQ(first_difference(testing::snapshot(want), device_snapshot(out[0])), "");
}

TEST(CudaBuildGroups, OneBackendOneStream) {
  SKIP_WITHOUT_GPU();
  RandomBatch gen(43);
  GroupStep step(gen, 2, nullptr);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  step.gpu[1]->set_cuda_stream(stream);
  std::vector<SwaMetadata> out(2);
  EXPECT_TRUE(testing::IsInvalidArgument(
      MetadataBuilder::build_groups(step.gpu_builders, step.device_batches, out),
      {"builders[1]: expected the CUDA stream of builders[0]"}));
  step.gpu[1]->set_cuda_stream(nullptr);
  std::vector<MetadataBuilder*> mixed = {step.gpu[0].get(), step.cpu[1].get()};
  EXPECT_TRUE(testing::IsInvalidArgument(
      MetadataBuilder::build_groups(mixed, step.device_batches, out),
      {"builders[1]: expected the cuda backend of builders[0], got cpu"}));
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

}  // namespace
}  // namespace sparse_swa
