// SPDX-License-Identifier: Apache-2.0
#include <cstring>
#include <string>

#include "backend.h"
#include "cuda/cuda_utils.h"
#include "soak/soak.h"
#include "sparse_swa/metadata_builder.h"
#include "support/metadata_snapshot.h"
#include "testing/random_batch.h"

namespace sparse_swa::soak {

// One captured build. The captured input buffers are one device allocation,
//   slot_mapping int64 [T] | query_start_loc int32 [R + 1] | seq_lens [R] | block_table [R, cols]
// and `staged` holds every variant packed the same way (pinned, so the copy is asynchronous).
struct BuilderSoak::Graph {
  testing::RandomCase c;
  std::vector<testing::TestBatch> variants;  // variants[0] is the captured batch
  size_t qsl_offset = 0, seq_offset = 0, table_offset = 0, bytes = 0;
  detail::DeviceBuffer<uint8_t> input;
  detail::PinnedBuffer<uint8_t> staged;
  std::unique_ptr<MetadataBuilder> gpu, cpu;
  SwaMetadata md;  // the captured build's views (device)
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;

  ~Graph() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
  void pack(const testing::TestBatch& b, uint8_t* dst) const {
    const BatchInput in = b.input();
    std::memcpy(dst, in.slot_mapping.data(), in.slot_mapping.size_bytes());
    std::memcpy(dst + qsl_offset, in.query_start_loc.data(), in.query_start_loc.size_bytes());
    std::memcpy(dst + seq_offset, in.seq_lens.data(), in.seq_lens.size_bytes());
    std::memcpy(dst + table_offset, in.block_table.data,
                sizeof(int32_t) * in.block_table.rows * in.block_table.stride);
  }
  // The captured batch on the device, with the host copies the CUDA builder plans with.
  BatchInput device_input() const {
    const testing::TestBatch& b = variants[0];
    BatchInput in = b.input();
    uint8_t* base = input.get();
    in.slot_mapping = {reinterpret_cast<const int64_t*>(base), in.slot_mapping.size()};
    in.query_start_loc = {reinterpret_cast<const int32_t*>(base + qsl_offset),
                          in.query_start_loc.size()};
    in.seq_lens = {reinterpret_cast<const int32_t*>(base + seq_offset), in.seq_lens.size()};
    in.block_table.data = reinterpret_cast<const int32_t*>(base + table_offset);
    in.block_table.space = MemorySpace::kDevice;
    in.query_start_loc_host = b.query_start_loc;
    in.seq_lens_host = b.seq_lens;
    return in;
  }
};

namespace {

std::string cuda_error(cudaError_t err, const char* what) {
  return std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
}

// Decode lens [Td, capacity): zeroed by every build with Td > 0, for graph replays that read past
// Td (docs/semantics.md#step-scalars).
std::vector<int32_t> lens_tail(const SwaMetadata& md, int32_t capacity, bool device) {
  std::vector<int32_t> tail(capacity - md.num_decode_tokens);
  if (tail.empty()) return tail;
  const int32_t* src = md.decode_swa.lens + md.num_decode_tokens;
  if (device) {
    copy_to_host(tail.data(), src, tail.size() * sizeof(int32_t));
  } else {
    std::memcpy(tail.data(), src, tail.size() * sizeof(int32_t));
  }
  return tail;
}

}  // namespace

BuilderSoak::BuilderSoak(const SoakOptions& options, cudaStream_t stream)
    : options_(options), stream_(stream) {}

BuilderSoak::~BuilderSoak() = default;

Status BuilderSoak::setup() {
  testing::RandomBatch gen(options_.seed);
  for (int mode = 0; mode < testing::kNumBatchModes; ++mode) {
    for (int k = 0; k < options_.cases_per_mode; ++k) {
      auto g = std::make_unique<Graph>();
      g->c = gen.next(static_cast<testing::BatchMode>(mode));
      testing::reserve_growth(&g->c, options_.max_growth);
      const testing::TestBatch& base = g->c.batch;
      g->variants.push_back(base);
      for (int v = 1; v < options_.variants; ++v) {
        g->variants.push_back(gen.same_shape_variant(base, options_.max_growth));
        if (g->variants.back().block_table_cols() != base.block_table_cols()) {
          return internal_error("soak: a variant's block table is wider than the captured one (",
                                g->c.describe(), ")");
        }
      }
      const size_t t = base.num_tokens(), r = base.num_reqs();
      g->qsl_offset = sizeof(int64_t) * t;
      g->seq_offset = g->qsl_offset + sizeof(int32_t) * (r + 1);
      g->table_offset = g->seq_offset + sizeof(int32_t) * r;
      g->bytes = g->table_offset + sizeof(int32_t) * r * base.block_table_cols();
      SPARSE_SWA_RETURN_IF_ERROR(g->input.allocate(g->bytes));
      SPARSE_SWA_RETURN_IF_ERROR(g->staged.allocate(g->bytes * g->variants.size()));
      for (size_t v = 0; v < g->variants.size(); ++v) {
        g->pack(g->variants[v], g->staged.get() + v * g->bytes);
      }
      SPARSE_SWA_RETURN_IF_ERROR(detail::cuda_status(
          cudaMemcpy(g->input.get(), g->staged.get(), g->bytes, cudaMemcpyHostToDevice),
          "cudaMemcpy(captured inputs)"));
      auto gpu = MetadataBuilder::create(g->c.config, Backend::kCuda, stream_);
      SPARSE_SWA_RETURN_IF_ERROR(gpu.status());
      g->gpu = std::move(gpu).value();
      auto cpu = MetadataBuilder::create(g->c.config, Backend::kCpu);
      SPARSE_SWA_RETURN_IF_ERROR(cpu.status());
      g->cpu = std::move(cpu).value();

      const BatchInput in = g->device_input();
      SPARSE_SWA_RETURN_IF_ERROR(detail::cuda_status(
          cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "begin capture"));
      const Status built = g->gpu->build(in, &g->md);
      SPARSE_SWA_RETURN_IF_ERROR(
          detail::cuda_status(cudaStreamEndCapture(stream_, &g->graph), "end capture"));
      SPARSE_SWA_RETURN_IF_ERROR(built);
      SPARSE_SWA_RETURN_IF_ERROR(
          detail::cuda_status(cudaGraphInstantiate(&g->exec, g->graph, 0), "cudaGraphInstantiate"));
      graphs_.push_back(std::move(g));
    }
  }
  return Status::Ok();
}

void BuilderSoak::replay(Graph& g, int32_t variant, int64_t step, PhaseResult* result) {
  cudaError_t err = cudaMemcpyAsync(g.input.get(), g.staged.get() + variant * g.bytes, g.bytes,
                                    cudaMemcpyHostToDevice, stream_);
  if (err == cudaSuccess) {
    err = cudaGraphLaunch(g.exec, stream_);
    if (err != cudaSuccess) result->fail(step, cuda_error(err, "cudaGraphLaunch"));
  } else {
    result->fail(step, cuda_error(err, "cudaMemcpyAsync(inputs)"));
  }
}

void BuilderSoak::sample(Graph& g, int32_t variant, int64_t step, PhaseResult* result) {
  ++result->samples;
  // Poisoned first (after the pending replays), so stale rows cannot pass.
  if (Status s = detail::poison_cuda_builder_outputs(g.gpu.get(), 0xa5); !s.ok()) {
    result->fail(step, "poison: " + s.to_string());
    return;
  }
  replay(g, variant, step, result);
  if (const cudaError_t err = cudaStreamSynchronize(stream_); err != cudaSuccess) {
    result->fail(step, cuda_error(err, "cudaStreamSynchronize"));
    return;
  }
  if (Status s = g.gpu->take_device_error(); !s.ok()) {
    result->fail(step, "device error word: " + s.to_string());
  }
  const testing::TestBatch& batch = g.variants[variant];
  SwaMetadata md_cpu;
  if (Status s = g.cpu->build(batch.input(), &md_cpu); !s.ok()) {
    result->fail(step, "CPU build: " + s.to_string() + " (" + batch.describe() + ")");
    return;
  }
  const testing::MetadataSnapshot cpu = testing::snapshot(md_cpu);
  testing::MetadataSnapshot gpu = testing::snapshot(g.md, copy_to_host);
  // The host plan was fixed at capture time (docs/design.md#cuda-graph-capture).
  gpu.at("prefill_seq_lens_host") = cpu.at("prefill_seq_lens_host");
  std::string diff = testing::first_difference(cpu, gpu);
  const int32_t capacity = g.c.config.max_num_batched_tokens;
  if (diff.empty() && md_cpu.num_decode_tokens > 0 &&
      lens_tail(md_cpu, capacity, false) != lens_tail(g.md, capacity, true)) {
    diff = "decode lens past num_decode_tokens";
  }
  if (!diff.empty()) {
    result->fail(step, "metadata differs from the CPU: " + diff + " (" + g.c.describe() +
                           ", variant " + std::to_string(variant) + ")");
  }
}

void BuilderSoak::check_error_words(int64_t step, PhaseResult* result) {
  for (auto& g : graphs_) {
    if (Status s = g->gpu->take_device_error(); !s.ok()) {
      result->fail(step, "device error word (" + g->c.describe() + "): " + s.to_string());
    }
  }
}

void BuilderSoak::warm_up(PhaseResult* result) {
  for (auto& g : graphs_) sample(*g, 0, step_, result);
  const int64_t n = static_cast<int64_t>(graphs_.size()) * options_.variants;
  for (int64_t i = 0; i < n && result->failures() < kMaxFailures; ++i, ++step_) {
    replay(*graphs_[step_ % graphs_.size()], static_cast<int32_t>(i / graphs_.size()), step_,
           result);
  }
  check_error_words(step_, result);
}

void BuilderSoak::run(int64_t steps, PhaseResult* result) {
  const int64_t num_graphs = static_cast<int64_t>(graphs_.size());
  int64_t samples = 0;
  int64_t i = 0;
  for (; i < steps && result->failures() < kMaxFailures; ++i, ++step_) {
    const int64_t gi = step_ % num_graphs;
    Graph& g = *graphs_[gi];
    const auto variant = static_cast<int32_t>((step_ / num_graphs) % options_.variants);
    // Sample n is taken at the first step at or after n * sample_every on graph n mod G.
    if (i >= samples * options_.sample_every && gi == samples % num_graphs) {
      sample(g, variant, step_, result);
      ++samples;
    } else {
      replay(g, variant, step_, result);
    }
    if ((i + 1) % options_.sync_every == 0 || i + 1 == steps) {
      if (const cudaError_t err = cudaStreamSynchronize(stream_); err != cudaSuccess) {
        result->fail(step_, cuda_error(err, "cudaStreamSynchronize"));
      }
      check_error_words(step_, result);
    }
  }
  result->steps += i;
}

nlohmann::ordered_json BuilderSoak::describe() const {
  nlohmann::ordered_json cases = nlohmann::ordered_json::array();
  for (const auto& g : graphs_) cases.push_back(g->c.describe());
  return {{"graphs", graphs_.size()},
          {"variants_per_graph", options_.variants},
          {"max_growth", options_.max_growth},
          {"cases", cases}};
}

}  // namespace sparse_swa::soak
