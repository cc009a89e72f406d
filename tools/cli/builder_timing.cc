// SPDX-License-Identifier: Apache-2.0
#include "builder_timing.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>
#include <vector>

#include "backend.h"  // the builder's own launch with no rows, for the launch floor
#include "sparse_swa/device_copies.h"
#include "testing/presets.h"

#if SPARSE_SWA_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace sparse_swa::cli {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

using Clock = std::chrono::steady_clock;
double micros_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// Bytes one build writes: mapping, validity, rows, lens, the zeroed lens tail, gather lens.
int64_t output_bytes(const SwaMetadata& md, const BuilderConfig& c) {
  int64_t bytes = int64_t{md.num_tokens} * (4 + 1) + 4 * int64_t{md.num_tokens};
  bytes += 4 * md.decode_swa.rows * md.decode_swa.width;
  bytes += 4 * md.prefill_swa.rows * md.prefill_swa.width;
  if (md.num_decode_tokens > 0)
    bytes += 4 * int64_t{c.max_num_batched_tokens - md.num_decode_tokens};
  bytes += 4 * int64_t{md.num_prefills};
  if (md.has_image()) bytes += 8 * int64_t{md.num_tokens};
  return bytes;
}

#if SPARSE_SWA_HAS_CUDA
Status cuda_check(cudaError_t e, const char* what) {
  return e == cudaSuccess ? Status::Ok() : internal_error(what, ": ", cudaGetErrorString(e));
}

// Device-to-device copy bandwidth in bytes/s (bytes copied, i.e. written, per second).
StatusOr<double> copy_bandwidth(cudaStream_t stream) {
  const size_t bytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  SPARSE_SWA_RETURN_IF_ERROR(cuda_check(cudaMalloc(&a, bytes), "cudaMalloc"));
  SPARSE_SWA_RETURN_IF_ERROR(cuda_check(cudaMalloc(&b, bytes), "cudaMalloc"));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<double> times;
  for (int i = 0; i < 12; ++i) {
    cudaEventRecord(e0, stream);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream);
    cudaEventRecord(e1, stream);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i >= 2) times.push_back(ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  SPARSE_SWA_RETURN_IF_ERROR(cuda_check(cudaGetLastError(), "copy bandwidth"));
  return bytes / (median(times) * 1e-3);
}

// The least a synchronised GPU step costs: `enqueue` (one tiny memset node, or the builder's own
// kernel launched with no rows to write) and a stream sync; medians of 500. No build() that
// launches work and waits for it can have a lower wall time. *enqueue_us: the host time of the
// enqueue alone, the floor of any build()'s host time.
template <typename Enqueue>
StatusOr<double> round_trip_floor(cudaStream_t stream, Enqueue enqueue, double* enqueue_us) {
  std::vector<double> t, host;
  for (int i = 0; i < 520; ++i) {
    const auto t0 = Clock::now();
    enqueue();
    const double enqueued = micros_since(t0);
    cudaStreamSynchronize(stream);
    if (i >= 20) {
      t.push_back(micros_since(t0));
      host.push_back(enqueued);
    }
  }
  SPARSE_SWA_RETURN_IF_ERROR(cuda_check(cudaGetLastError(), "round-trip floor"));
  *enqueue_us = median(host);
  return median(t);
}

// Median device time per call of `enqueue` in a replayed CUDA graph of kCalls back-to-back calls
// (the bench's device time of a build, and of the no-row launch).
constexpr int kGraphCalls = 100;
template <typename Enqueue>
StatusOr<double> device_time_per_call(cudaStream_t stream, Enqueue enqueue) {
  cudaGraph_t graph;
  SPARSE_SWA_RETURN_IF_ERROR(
      cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "BeginCapture"));
  Status captured = Status::Ok();
  for (int i = 0; i < kGraphCalls && captured.ok(); ++i) captured = enqueue();
  SPARSE_SWA_RETURN_IF_ERROR(cuda_check(cudaStreamEndCapture(stream, &graph), "EndCapture"));
  SPARSE_SWA_RETURN_IF_ERROR(captured);
  cudaGraphExec_t exec;
  SPARSE_SWA_RETURN_IF_ERROR(
      cuda_check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate"));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<double> per_call;
  for (int rep = 0; rep < 21; ++rep) {
    cudaEventRecord(e0, stream);
    cudaGraphLaunch(exec, stream);
    cudaEventRecord(e1, stream);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (rep > 0) per_call.push_back(ms * 1e3 / kGraphCalls);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  SPARSE_SWA_RETURN_IF_ERROR(cuda_check(cudaGetLastError(), "device timing"));
  return median(per_call);
}

StatusOr<LaunchFloors> measure_floors(cudaStream_t stream) {
  LaunchFloors f;
  void* p = nullptr;
  SPARSE_SWA_RETURN_IF_ERROR(cuda_check(cudaMalloc(&p, 4), "cudaMalloc"));
  auto memset = round_trip_floor(
      stream, [&] { cudaMemsetAsync(p, 0, 4, stream); }, &f.memset_enqueue_us);
  cudaFree(p);
  SPARSE_SWA_RETURN_IF_ERROR(memset.status());
  f.memset_us = memset.value();
  detail::MetadataLaunchProbe launcher;
  SPARSE_SWA_RETURN_IF_ERROR(detail::cuda_init_metadata_launch_probe(&launcher));
  auto launch = round_trip_floor(
      stream,
      [&] { (void)detail::cuda_launch_metadata_kernel_without_rows(launcher, stream, true); },
      &f.launch_enqueue_us);
  SPARSE_SWA_RETURN_IF_ERROR(launch.status());
  f.launch_us = launch.value();
  auto per_launch = device_time_per_call(stream, [&] {
    return detail::cuda_launch_metadata_kernel_without_rows(launcher, stream, true);
  });
  SPARSE_SWA_RETURN_IF_ERROR(per_launch.status());
  f.launch_device_us = per_launch.value();
  return f;
}
#endif

}  // namespace

StatusOr<BuilderTimings> time_builder(const BuilderTimingOptions& opts) {
  BuilderTimings out;
  const bool cuda = opts.backend == Backend::kCuda;
  out.cuda = cuda;
#if !SPARSE_SWA_HAS_CUDA
  if (cuda) return unavailable("--backend cuda: this build of sparse-swa has no CUDA backend");
#else
  if (cuda && !cuda_backend_available())
    return unavailable("--backend cuda: no usable CUDA device");
  cudaStream_t stream = nullptr;
  if (cuda) {
    SPARSE_SWA_RETURN_IF_ERROR(
        cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"));
    auto bw = copy_bandwidth(stream);
    SPARSE_SWA_RETURN_IF_ERROR(bw.status());
    auto measured = measure_floors(stream);
    SPARSE_SWA_RETURN_IF_ERROR(measured.status());
    out.floors = measured.value();
    out.floors.copy_bandwidth = bw.value();
  }
#endif
  std::mt19937_64 rng(kScenarioSeed);
  for (const testing::BenchScenario& s : testing::bench_scenarios()) {
    const BuilderConfig config = testing::bench_config(s.dspark);
    const testing::TestBatch host = testing::bench_batch(s, rng);
    auto builder = MetadataBuilder::create(config, opts.backend,
#if SPARSE_SWA_HAS_CUDA
                                           stream
#else
                                           nullptr
#endif
    );
    SPARSE_SWA_RETURN_IF_ERROR(builder.status());
    MetadataBuilder& b = *builder.value();
    std::unique_ptr<DeviceBatch> device;
    BatchInput in = host.input();
    if (cuda) {
      auto d = DeviceBatch::upload(in);
      SPARSE_SWA_RETURN_IF_ERROR(d.status());
      device = std::move(d).value();
      in = device->input();
    }
    SwaMetadata md;
    auto sync = [&]() -> Status {
#if SPARSE_SWA_HAS_CUDA
      if (cuda) return cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
#endif
      return Status::Ok();
    };
    for (int i = 0; i < 20; ++i) SPARSE_SWA_RETURN_IF_ERROR(b.build(in, &md));
    SPARSE_SWA_RETURN_IF_ERROR(sync());
    std::vector<double> wall, host_us;
    for (int i = 0; i < opts.iters; ++i) {
      const auto t0 = Clock::now();
      SPARSE_SWA_RETURN_IF_ERROR(b.build(in, &md));
      SPARSE_SWA_RETURN_IF_ERROR(sync());
      wall.push_back(micros_since(t0));
    }
    // The CPU backend's build() is synchronous: its host time is its wall time. Timing it a
    // second time only compared two runs of the same call, whose medians differ by whatever
    // else the machine did between them (host above wall by a fifth was seen).
    for (int i = 0; i < opts.iters && cuda; ++i) {
      const auto t0 = Clock::now();
      SPARSE_SWA_RETURN_IF_ERROR(b.build(in, &md));
      host_us.push_back(micros_since(t0));
      SPARSE_SWA_RETURN_IF_ERROR(sync());
    }
    // update_draft_decode_rows: the same launch behind fewer host checks, to show how much of
    // the host time is the launch itself.
    std::vector<double> update_us;
    for (int i = 0; i < opts.iters && md.num_decode_tokens > 0; ++i) {
      const auto t0 = Clock::now();
      SPARSE_SWA_RETURN_IF_ERROR(b.update_draft_decode_rows(in, &md));
      update_us.push_back(micros_since(t0));
      SPARSE_SWA_RETURN_IF_ERROR(sync());
    }
    SPARSE_SWA_RETURN_IF_ERROR(b.build(in, &md));  // leave the step's own rows for the graph
    ScenarioTiming t;
    t.scenario = s;
    t.tokens = md.num_tokens;
    t.output_bytes = output_bytes(md, config);
#if SPARSE_SWA_HAS_CUDA
    if (cuda) {
      // Device time: a graph of back-to-back builds, replayed; median per build.
      auto per_build = device_time_per_call(stream, [&] { return b.build(in, &md); });
      SPARSE_SWA_RETURN_IF_ERROR(per_build.status());
      t.device_us = per_build.value();
      SPARSE_SWA_RETURN_IF_ERROR(b.take_device_error());
      t.write_floor_us = static_cast<double>(t.output_bytes) / out.floors.copy_bandwidth * 1e6;
    }
#endif
    t.wall_us = median(wall);
    t.host_us = cuda ? median(host_us) : t.wall_us;
    t.update_host_us = median(update_us);
    out.scenarios.push_back(t);
  }
#if SPARSE_SWA_HAS_CUDA
  if (stream != nullptr) cudaStreamDestroy(stream);
#endif
  return out;
}

StatusOr<GroupTiming> time_build_groups(const BuilderTimingOptions& opts) {
  const bool cuda = opts.backend == Backend::kCuda;
#if !SPARSE_SWA_HAS_CUDA
  if (cuda) return unavailable("--backend cuda: this build of sparse-swa has no CUDA backend");
  void* stream = nullptr;
#else
  if (cuda && !cuda_backend_available())
    return unavailable("--backend cuda: no usable CUDA device");
  cudaStream_t stream = nullptr;
  if (cuda) {
    SPARSE_SWA_RETURN_IF_ERROR(
        cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  }
#endif
  // The groups' step: the same requests, each group its own pages and slots.
  BuilderConfig config = testing::bench_config(false);
  config.block_size = 32;
  std::mt19937_64 rng(kScenarioSeed);
  std::uniform_int_distribution<int32_t> context(200, 8000), page(0, 100000);
  std::vector<int32_t> seq_lens(kBenchGroupDecodes);
  for (int32_t& s : seq_lens) s = context(rng) + 1;
  const int32_t cols = (*std::max_element(seq_lens.begin(), seq_lens.end()) + 31) / 32;
  std::vector<testing::TestBatch> hosts;
  std::vector<std::unique_ptr<MetadataBuilder>> owned;
  std::vector<MetadataBuilder*> builders;
  std::vector<std::unique_ptr<DeviceBatch>> devices;
  std::vector<BatchInput> inputs;
  for (int g = 0; g < kBenchGroups; ++g) {
    testing::TestBatch& b = hosts.emplace_back(config.block_size);
    for (int32_t s : seq_lens) {
      std::vector<int32_t> pages(cols);
      for (int32_t& p : pages) p = page(rng);
      b.add_request(s, 1, std::move(pages));
    }
    auto created = MetadataBuilder::create(config, opts.backend, stream);
    SPARSE_SWA_RETURN_IF_ERROR(created.status());
    owned.push_back(std::move(created).value());
    builders.push_back(owned.back().get());
  }
  for (int g = 0; g < kBenchGroups; ++g) {
    inputs.push_back(hosts[g].input());
    if (cuda) {
      auto d = DeviceBatch::upload(inputs.back());
      SPARSE_SWA_RETURN_IF_ERROR(d.status());
      devices.push_back(std::move(d).value());
      inputs.back() = devices.back()->input();
    }
  }
  std::vector<SwaMetadata> mds(kBenchGroups);
  auto sync = [&]() -> Status {
#if SPARSE_SWA_HAS_CUDA
    if (cuda) return cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
#endif
    return Status::Ok();
  };
  auto grouped = [&] { return MetadataBuilder::build_groups(builders, inputs, mds); };
  auto separate = [&]() -> Status {
    for (int g = 0; g < kBenchGroups; ++g)
      SPARSE_SWA_RETURN_IF_ERROR(builders[g]->build(inputs[g], &mds[g]));
    return Status::Ok();
  };
  for (int i = 0; i < 20; ++i) SPARSE_SWA_RETURN_IF_ERROR(grouped());
  SPARSE_SWA_RETURN_IF_ERROR(sync());
  std::vector<double> wall, host, separate_host;
  for (int i = 0; i < opts.iters; ++i) {
    auto t0 = Clock::now();
    SPARSE_SWA_RETURN_IF_ERROR(grouped());
    host.push_back(micros_since(t0));
    SPARSE_SWA_RETURN_IF_ERROR(sync());
    wall.push_back(micros_since(t0));
    t0 = Clock::now();
    SPARSE_SWA_RETURN_IF_ERROR(separate());
    separate_host.push_back(micros_since(t0));
    SPARSE_SWA_RETURN_IF_ERROR(sync());
  }
  GroupTiming t;
  t.tokens = mds[0].num_tokens;
  t.wall_us = median(wall);
  t.host_us = cuda ? median(host) : t.wall_us;
  t.separate_host_us = median(separate_host);
#if SPARSE_SWA_HAS_CUDA
  if (cuda) {
    auto per_step = device_time_per_call(stream, grouped);
    SPARSE_SWA_RETURN_IF_ERROR(per_step.status());
    t.device_us = per_step.value();
    auto per_separate = device_time_per_call(stream, separate);
    SPARSE_SWA_RETURN_IF_ERROR(per_separate.status());
    t.separate_device_us = per_separate.value();
    for (MetadataBuilder* b : builders) SPARSE_SWA_RETURN_IF_ERROR(b->take_device_error());
    owned.clear();
    cudaStreamDestroy(stream);
  }
#endif
  return t;
}

}  // namespace sparse_swa::cli
