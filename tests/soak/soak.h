// SPDX-License-Identifier: Apache-2.0
// The soak (sparse_swa_soak): the CUDA builder replayed from CUDA graphs and the CUDA attention
// called over and over, sampled results compared with the CPU backend, memory checked before and
// after. Options, the result of a phase, and the two phases (builder_soak.cc, attention_soak.cc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "sparse_swa/status.h"

namespace sparse_swa::soak {

struct SoakOptions {
  int64_t builder_steps = 1000000;   // graph replays after the warm-up
  int64_t attention_calls = 100000;  // sparse_attention calls after the warm-up
  int64_t sample_every = 10000;      // one replay (call) in this many is compared with the CPU
  int64_t sync_every = 4096;         // replays (calls) enqueued between synchronisations
  int32_t cases_per_mode = 2;        // captured graphs per batch mode
  int32_t variants = 32;             // same-shape batches written into each graph's inputs
  int32_t max_growth = 64;           // how far a variant's seq_lens grow past the captured batch
  int64_t rss_tolerance_kib = 4096;  // allowed host RSS change (allocator noise)
  uint64_t seed = 1;
  std::string json_path;  // empty: no JSON file
};

// A phase stops after this many failures (a sticky CUDA error would fail every step).
inline constexpr int64_t kMaxFailures = 100;

// What one phase did. Failures are counted; the first few are kept with their step.
class PhaseResult {
 public:
  explicit PhaseResult(std::string name) : name_(std::move(name)) {}
  void fail(int64_t step, const std::string& what);
  bool ok() const { return failures_ == 0; }
  int64_t failures() const { return failures_; }
  const std::vector<std::string>& messages() const { return messages_; }

  int64_t steps = 0;    // replays (calls) run after the warm-up
  double seconds = 0;   // their wall time
  int64_t samples = 0;  // replays (calls) compared with the CPU, warm-up included
  nlohmann::ordered_json details = nlohmann::ordered_json::object();

  nlohmann::ordered_json to_json() const;

 private:
  std::string name_;
  int64_t failures_ = 0;
  std::vector<std::string> messages_;
};

// The builder phase: one CUDA builder per case (RandomBatch, cases_per_mode of every mode), its
// build() captured into a graph on `stream`; each step writes one of the case's same-shape
// variants into the captured input buffers (a pinned-to-device copy on the stream) and replays.
class BuilderSoak {
 public:
  BuilderSoak(const SoakOptions& options, cudaStream_t stream);
  ~BuilderSoak();
  Status setup();
  // Every graph sampled once, then every (graph, variant) pair replayed once.
  void warm_up(PhaseResult* result);
  // `steps` replays, cycling over the graphs; sampled every options.sample_every steps (the
  // graphs in turn). Synchronises every options.sync_every steps and reads the error words.
  void run(int64_t steps, PhaseResult* result);
  nlohmann::ordered_json describe() const;

 private:
  struct Graph;
  void replay(Graph& g, int32_t variant, int64_t step, PhaseResult* result);
  void sample(Graph& g, int32_t variant, int64_t step, PhaseResult* result);
  void check_error_words(int64_t step, PhaseResult* result);

  SoakOptions options_;
  cudaStream_t stream_;
  std::vector<std::unique_ptr<Graph>> graphs_;
  int64_t step_ = 0;  // replays so far, warm-up included: picks graph and variant
};

// The attention phase: a list of small shapes (heads, widths, page sizes, dtypes, one or both
// segments, with or without sinks and a split workspace), each with a few index variants on the
// device; calls cycle over shapes and variants on `stream`.
class AttentionSoak {
 public:
  AttentionSoak(const SoakOptions& options, cudaStream_t stream);
  ~AttentionSoak();
  Status setup();
  void warm_up(PhaseResult* result);  // every shape and variant once, every shape sampled
  void run(int64_t calls, PhaseResult* result);
  nlohmann::ordered_json describe() const;

 private:
  struct Problem;
  void call(Problem& p, int32_t variant, int64_t step, PhaseResult* result);
  void sample(Problem& p, int32_t variant, int64_t step, PhaseResult* result);
  void check_bad_counts(int64_t step, PhaseResult* result);

  SoakOptions options_;
  cudaStream_t stream_;
  std::vector<std::unique_ptr<Problem>> problems_;
  int64_t step_ = 0;
};

}  // namespace sparse_swa::soak
