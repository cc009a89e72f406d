// sparse-swa bench [--backend cuda|cpu] [--iters N] [--json FILE]
// Times build() on the scenarios of the reference script's `bench` (W = 128, block 256):
// synchronised wall time, host time until build() returns, and device time per build from a
// replayed CUDA graph of back-to-back builds; plus the card's copy bandwidth, to put the device
// time next to the time it takes just to write the output bytes.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend.h"  // the builder's own launch with no rows, for the launch floor
#include "commands.h"
#include "sparse_swa/device_copies.h"

#if SPARSE_SWA_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace sparse_swa::cli {

namespace {

struct BenchOptions {
  std::string backend = "cuda";
  int iters = 200;
  std::string json_path;
};

struct Scenario {
  int decodes, prefills, prefill_len;
  bool dspark;
};

// The reference script's scenarios, in its order.
constexpr Scenario kScenarios[] = {{1, 0, 0, false},    {64, 0, 0, false},  {256, 0, 0, false},
                                   {1024, 0, 0, false}, {64, 0, 0, true},   {256, 0, 0, true},
                                   {32, 4, 512, false}, {0, 8, 1024, false}};

// Owned host batch of one scenario, built as the reference script builds its batches.
struct ScenarioBatch {
  BuilderConfig config;
  std::vector<int32_t> qsl{0}, seq, bt;
  std::vector<int64_t> slots;
  int64_t cols = 0;
  bool causal = true;

  BatchInput input() const {
    BatchInput in;
    in.query_start_loc = qsl;
    in.seq_lens = seq;
    in.block_table = {bt.data(), static_cast<int64_t>(seq.size()), cols, cols, MemorySpace::kHost};
    in.slot_mapping = slots;
    in.causal = causal;
    return in;
  }
};

ScenarioBatch make_batch(const Scenario& s, std::mt19937& rng) {
  ScenarioBatch b;
  const int k = s.dspark ? 5 : 0;
  b.config.window_size = 128;
  b.config.block_size = 256;
  b.config.max_num_batched_tokens = 16384;
  b.config.max_num_seqs = 1024;
  b.config.max_model_len = 65536;
  b.config.num_speculative_tokens = k;
  b.config.speculative_method = s.dspark ? SpeculativeMethod::kDspark : SpeculativeMethod::kNone;
  b.config.compress_ratios = {1, 4, 128};
  b.causal = !s.dspark;
  std::vector<int> qlens(s.decodes, s.dspark ? k + 1 : 1);
  qlens.insert(qlens.end(), s.prefills, s.prefill_len);
  std::uniform_int_distribution<int> ctx(200, 8000), block(0, 100000);
  for (int q : qlens) {
    b.seq.push_back(ctx(rng) + q);
    b.qsl.push_back(b.qsl.back() + q);
  }
  for (int32_t v : b.seq) b.cols = std::max<int64_t>(b.cols, (v + 255) / 256);
  b.bt.resize(b.seq.size() * b.cols);
  for (int32_t& id : b.bt) id = block(rng);
  for (size_t r = 0; r < qlens.size(); ++r) {
    for (int i = 0; i < qlens[r]; ++i) {
      const int p = b.seq[r] - qlens[r] + i;
      b.slots.push_back(int64_t{b.bt[r * b.cols + p / 256]} * 256 + p % 256);
    }
  }
  return b;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

using Clock = std::chrono::steady_clock;
double micros_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// Bytes one build writes: mapping, validity, rows, lens, the zeroed lens tail, gather lens.
double output_bytes(const SwaMetadata& md, const BuilderConfig& c) {
  double bytes = md.num_tokens * (4.0 + 1.0) + 4.0 * md.num_tokens;
  bytes += 4.0 * md.decode_swa.rows * md.decode_swa.width;
  bytes += 4.0 * md.prefill_swa.rows * md.prefill_swa.width;
  if (md.num_decode_tokens > 0) bytes += 4.0 * (c.max_num_batched_tokens - md.num_decode_tokens);
  bytes += 4.0 * md.num_prefills;
  if (md.has_image()) bytes += 8.0 * md.num_tokens;
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

struct Floors {
  double memset_us = 0, memset_enqueue_us = 0;  // 4-byte cudaMemsetAsync
  double launch_us = 0, launch_enqueue_us = 0;  // the metadata kernel, no rows
  double launch_device_us = 0;  // the same, per launch of a replayed graph of back-to-back ones
};

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

StatusOr<Floors> measure_floors(cudaStream_t stream) {
  Floors f;
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

Status run_bench(const BenchOptions& opts) {
  const bool cuda = opts.backend == "cuda";
#if SPARSE_SWA_HAS_CUDA
  Floors floors;
#endif
#if !SPARSE_SWA_HAS_CUDA
  if (cuda) return unavailable("--backend cuda: this build of sparse-swa has no CUDA backend");
#else
  if (cuda && !cuda_backend_available())
    return unavailable("--backend cuda: no usable CUDA device");
  cudaStream_t stream = nullptr;
  double bandwidth = 0;
  if (cuda) {
    SPARSE_SWA_RETURN_IF_ERROR(
        cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"));
    auto bw = copy_bandwidth(stream);
    SPARSE_SWA_RETURN_IF_ERROR(bw.status());
    bandwidth = bw.value();
    std::cout << "device copy bandwidth: " << bandwidth / 1e9
              << " GB/s (1 GiB D2D, median of 10)\n";
    auto measured = measure_floors(stream);
    SPARSE_SWA_RETURN_IF_ERROR(measured.status());
    floors = measured.value();
    std::cout << "round-trip floor (enqueue + cudaStreamSynchronize, medians): 4-byte memset "
              << floors.memset_us << " us (enqueue " << floors.memset_enqueue_us
              << " us); the metadata kernel with no rows " << floors.launch_us << " us (enqueue "
              << floors.launch_enqueue_us
              << " us); device time of that launch, back to back: " << floors.launch_device_us
              << " us\n";
  }
#endif
  std::mt19937 rng(7);
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  std::cout << "decodes prefills prefill_len method tokens | wall_us host_us device_us | "
               "out_bytes write_floor_us\n";
  for (const Scenario& s : kScenarios) {
    ScenarioBatch host = make_batch(s, rng);
    auto builder = MetadataBuilder::create(host.config, cuda ? Backend::kCuda : Backend::kCpu,
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
    for (int i = 0; i < opts.iters; ++i) {
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
    double device_us = 0, floor_us = 0;
    const double bytes = output_bytes(md, host.config);
#if SPARSE_SWA_HAS_CUDA
    if (cuda) {
      // Device time: a graph of back-to-back builds, replayed; median per build.
      auto per_build = device_time_per_call(stream, [&] { return b.build(in, &md); });
      SPARSE_SWA_RETURN_IF_ERROR(per_build.status());
      device_us = per_build.value();
      SPARSE_SWA_RETURN_IF_ERROR(b.take_device_error());
      floor_us = bytes / bandwidth * 1e6;
    }
#endif
    const double w = median(wall), h = median(host_us);
    const char* method = s.dspark ? "dspark" : "none";
    std::cout << s.decodes << " " << s.prefills << " " << s.prefill_len << " " << method << " "
              << md.num_tokens << " | " << w << " " << h << " " << device_us << " | " << bytes
              << " " << floor_us << "\n";
    results.push_back({{"decodes", s.decodes},
                       {"prefills", s.prefills},
                       {"prefill_len", s.prefill_len},
                       {"method", method},
                       {"tokens", md.num_tokens},
                       {"backend", opts.backend},
                       {"build_wall_us_median", w},
                       {"build_host_us_median", h},
                       {"update_draft_host_us_median", median(update_us)},
                       {"device_us_per_build", device_us},
                       {"output_bytes", bytes},
                       {"write_floor_us", floor_us}});
#if SPARSE_SWA_HAS_CUDA
    if (cuda) {
      results.back()["round_trip_floor_us"] = floors.memset_us;
      results.back()["enqueue_floor_us"] = floors.memset_enqueue_us;
      results.back()["launch_round_trip_floor_us"] = floors.launch_us;
      results.back()["launch_enqueue_floor_us"] = floors.launch_enqueue_us;
      results.back()["launch_device_floor_us"] = floors.launch_device_us;
    }
#endif
  }
#if SPARSE_SWA_HAS_CUDA
  if (stream != nullptr) cudaStreamDestroy(stream);
#endif
  if (!opts.json_path.empty()) {
    std::ofstream out(opts.json_path);
    out << results.dump(1) << "\n";
    if (!out) return invalid_argument("--json ", opts.json_path, ": write failed");
  }
  return flush_stdout();
}

}  // namespace

void add_bench_command(CLI::App& app, int* exit_code) {
  auto opts = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Time build() on the reference script's bench scenarios (W = 128, block 256)");
  add_backend_option(*cmd, &opts->backend);  // default cuda (BenchOptions)
  cmd->add_option("--iters", opts->iters, "timed builds per scenario and measure")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--json", opts->json_path, "also write the results as JSON to this file");
  cmd->callback([opts, exit_code] {
    const Status status = run_bench(*opts);
    *exit_code = status.ok() ? kExitOk : report_error(status);
  });
}

}  // namespace sparse_swa::cli
