// SPDX-License-Identifier: Apache-2.0
// sparse_swa_attention_bench: the CUDA sparse attention on the DeepSeek-V4 decode and prefill
// shapes.
//
// Method (bench/README.md#attention): fp8_ds_mla caches (bf16 where a prefill shape says so),
// attention sink on; decode: random slots that no two tokens share (except where a shape says so);
// prefill: every token's keys distinct random slots of one shared pool. Every output is checked
// against the CPU reference on sampled tokens first; then the call is captured into a CUDA graph
// and replayed: 30 timed replays, each after a 256 MiB write that flushes the L2, with CUDA events
// around the replay alone (median and min), and 30 warm back-to-back replays beside them. `host`
// is the median host time of one eager call (checks, plan, launch), `host_dev` the same with the
// pointers' device given (SparseAttentionParams::pointers_device: no per-pointer queries). Floor:
// the larger of the memory floor (every key's bytes + 4 index bytes -- a prefill pool's keys once
// --, Q and O in bf16, at 4.4 TB/s) and the compute floor (2 x heads x keys x 1024 FLOPs at 790
// TFLOP/s). Prints a table; --json FILE writes the numbers.
//
//   sparse_swa_attention_bench [--json FILE] [--runs N] [--only NAME] [--filter SUBSTRING]
//                              [--no-split] [--no-query-groups] [--kernel
//                              auto|sm90_tile32|sm90_pairs]
//                              [--sweep] [--cache fp8_ds_mla|bf16] [--sorted-rows] [--list]
//                              [--help]
// --cache sets the decode shapes' cache dtype (the prefill shapes keep theirs). --sorted-rows
// sorts each segment's valid entries of a row by slot (a diagnosis of how the order of the reads
// matters; the method's rows stay in their random order). --list prints the shapes
// (bench/attention_shapes.json, compiled in) and exits.
// Shapes whose tokens come in groups of one request (MTP) pass query_group_size unless
// --no-query-groups.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cuda_check.h"
#include "sparse_swa/attention.h"
#include "testing/attention_compare.h"

extern const char kAttentionShapesJson[];  // bench/attention_shapes.json

namespace {

using namespace sparse_swa;

constexpr double kReadBandwidth = 4.4e12;  // bytes/s, the H200's measured copy rate
constexpr double kPeakFlops = 790e12;      // bf16 FLOP/s of a large GEMM on the H200

struct Scenario {
  // Every field from bench/attention_shapes.json (its defaults where an entry leaves one out).
  std::string name;
  int32_t tokens = 0, heads = 0;
  int32_t swa_width = 0, extra_width = 0;  // row widths; lens are full unless extra_fill < 1
  int32_t extra_block = 0;                 // page size of the extra cache (0: no extra segment)
  double extra_fill = 0.0;                 // fraction of the extra row that is valid
  int32_t group = 0;                       // consecutive tokens of one request (MTP: 2)
  double flashmla_us = 0.0;                // its figure on the H200, same method (0: none)
  // Prefill shapes: every token draws swa_width + extra_width distinct slots of one shared pool
  // of `pool` slots (64-slot pages), both segments in that cache. 0: decode slots as above.
  int32_t pool = 0;
  CacheDtype dtype = CacheDtype::kFp8DsMla;
  // false: a workspace without room for a bf16 copy of the caches, so that a prefill call on
  // fp8_ds_mla caches reads and decodes every key per use (docs/design.md#decoded-keys).
  bool decoded_keys = false;
};

// The shapes, from bench/attention_shapes.json (compiled in as kAttentionShapesJson; the FlashMLA
// benchmark reads the same file): an entry over the file's defaults. A malformed entry throws (main
// reports it).
Scenario scenario_from(const nlohmann::json& defaults, const nlohmann::json& entry) {
  nlohmann::json j = defaults;
  j.update(entry);
  Scenario s;
  s.name = j.at("name").get<std::string>();
  s.tokens = j.at("tokens").get<int32_t>();
  s.heads = j.at("heads").get<int32_t>();
  s.swa_width = j.at("swa_width").get<int32_t>();
  s.extra_width = j.at("extra_width").get<int32_t>();
  s.extra_block = j.at("extra_page").get<int32_t>();
  s.extra_fill = j.at("extra_fill").get<double>();
  s.group = j.at("group").get<int32_t>();
  s.flashmla_us = j.at("flashmla_h200_us").get<double>();
  s.pool = j.at("pool").get<int32_t>();
  s.decoded_keys = j.at("decoded_keys").get<bool>();
  const auto dtype = parse_cache_dtype(j.at("cache").get<std::string>());
  if (!dtype.ok()) throw std::invalid_argument(s.name + ": " + dtype.status().to_string());
  s.dtype = dtype.value();
  return s;
}

// The fixed shapes, or with `sweep` the decode families over their batch sizes (a name is the
// family's prefix and the batch size).
std::vector<Scenario> load_scenarios(bool sweep) {
  const nlohmann::json all = nlohmann::json::parse(kAttentionShapesJson);
  const nlohmann::json& defaults = all.at("defaults");
  std::vector<Scenario> out;
  if (!sweep) {
    for (const nlohmann::json& j : all.at("shapes")) out.push_back(scenario_from(defaults, j));
    return out;
  }
  for (const nlohmann::json& family : all.at("sweep")) {
    for (const int32_t b : family.at("batches")) {
      nlohmann::json j = family;
      j["name"] = family.at("prefix").get<std::string>() + std::to_string(b);
      j["tokens"] = b;
      out.push_back(scenario_from(defaults, j));
    }
  }
  return out;
}

struct Problem {
  std::vector<uint8_t> swa_cache, extra_cache;
  int64_t swa_blocks = 0, extra_blocks = 0, swa_stride = 0, extra_stride = 0;
  std::vector<int32_t> swa_idx, swa_lens, extra_idx, extra_lens;
  std::vector<uint16_t> q;
  std::vector<float> sinks;
  int64_t keys = 0;  // valid keys over all tokens
};

uint16_t to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t b) {
  const uint32_t u = uint32_t{b} << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// A cache of n random rows (scales vary per slot), written with the library's CPU codec.
void make_cache(int64_t slots, int32_t block_size, CacheDtype dtype, std::mt19937* rng,
                std::vector<uint8_t>* bytes, int64_t* blocks, int64_t* stride) {
  *blocks = (slots + block_size - 1) / block_size;
  *stride = (block_size * cache_token_bytes(dtype) + 575) / 576 * 576;
  bytes->assign(*blocks * *stride, 0);
  const int64_t n = *blocks * block_size;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t chunk = 4096;
  std::vector<float> rows(chunk * kHeadDim);
  std::vector<int64_t> ids(chunk);
  KvCacheView view{bytes->data(), *blocks, block_size, *stride, dtype, MemorySpace::kHost};
  for (int64_t s0 = 0; s0 < n; s0 += chunk) {
    const int64_t m = std::min(chunk, n - s0);
    for (int64_t i = 0; i < m; ++i) {
      const float scale = 0.5f + 0.25f * ((s0 + i) % 7);
      for (int d = 0; d < kHeadDim; ++d) rows[i * kHeadDim + d] = normal(*rng) * scale;
      ids[i] = s0 + i;
    }
    const Status st = encode_kv_rows({rows.data(), m, kHeadDim, kHeadDim},
                                     std::span<const int64_t>(ids.data(), m), view);
    if (!st.ok()) {
      std::fprintf(stderr, "encode: %s\n", st.to_string().c_str());
      std::exit(1);
    }
  }
}

// Prefill: one pool cache, every token's two segments distinct random slots of it.
Problem make_pool_problem(const Scenario& s, std::mt19937* rng) {
  Problem p;
  const int32_t T = s.tokens;
  make_cache(s.pool, 64, s.dtype, rng, &p.swa_cache, &p.swa_blocks, &p.swa_stride);
  p.swa_idx.resize(int64_t{T} * s.swa_width);
  p.extra_idx.resize(int64_t{T} * s.extra_width);
  p.swa_lens.assign(T, s.swa_width);
  p.extra_lens.assign(T, s.extra_width);
  std::vector<int32_t> perm(s.pool);
  std::iota(perm.begin(), perm.end(), 0);
  const int32_t keys = s.swa_width + s.extra_width;
  for (int32_t t = 0; t < T; ++t) {
    for (int32_t j = 0; j < keys; ++j) {  // a partial shuffle: the first `keys` entries
      std::swap(perm[j], perm[j + (*rng)() % (s.pool - j)]);
      if (j < s.swa_width) {
        p.swa_idx[int64_t{t} * s.swa_width + j] = perm[j];
      } else {
        p.extra_idx[int64_t{t} * s.extra_width + j - s.swa_width] = perm[j];
      }
    }
  }
  p.keys = int64_t{T} * keys;
  return p;
}

// Decode: every token its own slots (tokens of one request share as the scenario says).
Problem make_decode_problem(const Scenario& s, std::mt19937* rng) {
  Problem p;
  const int32_t T = s.tokens;
  // SWA: 128-key windows; tokens of one request (group) share all but one key.
  const int64_t swa_slots = int64_t{T} * s.swa_width + 256;
  make_cache(swa_slots, 256, s.dtype, rng, &p.swa_cache, &p.swa_blocks, &p.swa_stride);
  std::vector<int32_t> perm(p.swa_blocks * 256);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), *rng);
  p.swa_idx.assign(int64_t{T} * s.swa_width, -1);
  p.swa_lens.assign(T, s.swa_width);
  int64_t next = 0;
  for (int32_t t = 0; t < T; ++t) {
    int32_t* row = p.swa_idx.data() + int64_t{t} * s.swa_width;
    if (t % s.group != 0) {  // next token of the request: the window moves by one
      const int32_t* prev = row - s.swa_width;
      for (int32_t j = 0; j + 1 < s.swa_width; ++j) row[j] = prev[j + 1];
      row[s.swa_width - 1] = perm[next++];
    } else {
      for (int32_t j = 0; j < s.swa_width; ++j) row[j] = perm[next++];
    }
  }
  p.keys = int64_t{T} * s.swa_width;
  if (s.extra_width > 0) {
    const int32_t valid = static_cast<int32_t>(s.extra_width * s.extra_fill);
    const int64_t slots = int64_t{T} * valid + 256;
    make_cache(slots, s.extra_block, s.dtype, rng, &p.extra_cache, &p.extra_blocks,
               &p.extra_stride);
    std::vector<int32_t> eperm(p.extra_blocks * s.extra_block);
    std::iota(eperm.begin(), eperm.end(), 0);
    std::shuffle(eperm.begin(), eperm.end(), *rng);
    p.extra_idx.assign(int64_t{T} * s.extra_width, -1);
    p.extra_lens.assign(T, valid);
    int64_t e = 0;
    for (int32_t t = 0; t < T; ++t) {
      int32_t* row = p.extra_idx.data() + int64_t{t} * s.extra_width;
      for (int32_t j = 0; j < valid; ++j) {
        // The second token of a request shares the first half of its top-k with the first.
        const bool shared = t % s.group != 0 && j < valid / 2;
        row[j] = shared ? row[j - s.extra_width] : eperm[e++];
      }
    }
    p.keys += int64_t{T} * valid;
  }
  return p;
}

bool g_sorted_rows = false;  // --sorted-rows

Problem make_problem(const Scenario& s, uint32_t seed) {
  std::mt19937 rng(seed);
  Problem p = s.pool > 0 ? make_pool_problem(s, &rng) : make_decode_problem(s, &rng);
  const int32_t T = s.tokens;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  p.q.resize(int64_t{T} * s.heads * kHeadDim);
  for (uint16_t& v : p.q) v = to_bf16(normal(rng));
  p.sinks.resize(s.heads);
  for (int32_t h = 0; h < s.heads; ++h) p.sinks[h] = 0.25f * (h % 9) - 1.0f;
  if (g_sorted_rows) {
    const auto sort_rows = [T](std::vector<int32_t>& idx, const std::vector<int32_t>& lens) {
      if (idx.empty()) return;
      const int64_t width = static_cast<int64_t>(idx.size()) / T;
      for (int32_t t = 0; t < T; ++t) {
        std::sort(idx.begin() + t * width, idx.begin() + t * width + lens[t]);
      }
    };
    sort_rows(p.swa_idx, p.swa_lens);
    sort_rows(p.extra_idx, p.extra_lens);
  }
  return p;
}

template <typename T>
T* upload(const std::vector<T>& v) {
  T* d = nullptr;
  CUDA_OK(cudaMalloc(&d, std::max<size_t>(1, v.size()) * sizeof(T)));
  if (!v.empty()) CUDA_OK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

AttentionKernel g_kernel = AttentionKernel::kAuto;  // --kernel
bool g_query_groups = true;  // --no-query-groups: shapes with groups call without the hint

// The kernel family a call ran: "sm90_tile32", "sm90_pairs", or "general" (the SIMT kernel).
const char* kernel_name(AttentionKernel k) {
  return k == AttentionKernel::kAuto ? "general" : attention_kernel_name(k);
}

struct Result {
  double median_us = 0, min_us = 0, warm_us = 0, floor_us = 0, max_err = 0, host_us = 0, flops = 0;
  double host_known_us = 0;  // host_us with SparseAttentionParams::pointers_device set
  int32_t checked_tokens = 0;
  AttentionKernel kernel = AttentionKernel::kAuto;
  bool ok = true;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Result run(const Scenario& s, int runs, bool allow_split, void* flush, size_t flush_bytes) {
  const Problem p = make_problem(s, 1234u + s.tokens * 31u + s.heads);
  const int32_t T = s.tokens, H = s.heads;
  SparseAttentionParams hp;
  hp.num_tokens = T;
  hp.num_heads = H;
  hp.q = p.q.data();
  const int32_t swa_block = s.pool > 0 ? 64 : 256;
  hp.swa_cache = {p.swa_cache.data(), p.swa_blocks, swa_block,
                  p.swa_stride,       s.dtype,      MemorySpace::kHost};
  hp.swa_indices = {p.swa_idx.data(), p.swa_lens.data(), T, s.swa_width, s.swa_width,
                    s.swa_width,      MemorySpace::kHost};
  if (s.extra_width > 0) {
    hp.extra_cache =
        s.pool > 0 ? hp.swa_cache
                   : ConstKvCacheView{p.extra_cache.data(), p.extra_blocks, s.extra_block,
                                      p.extra_stride,       s.dtype,        MemorySpace::kHost};
    hp.extra_indices = {p.extra_idx.data(), p.extra_lens.data(), T, s.extra_width, s.extra_width,
                        s.extra_width,      MemorySpace::kHost};
  }
  hp.sinks = p.sinks.data();

  SparseAttentionParams dp = hp;
  dp.q = upload(p.q);
  dp.sinks = upload(p.sinks);
  dp.swa_cache.data = upload(p.swa_cache);
  dp.swa_cache.space = MemorySpace::kDevice;
  dp.swa_indices.data = upload(p.swa_idx);
  dp.swa_indices.lens = upload(p.swa_lens);
  dp.swa_indices.space = MemorySpace::kDevice;
  if (s.extra_width > 0) {
    // Prefill: both segments index the one pool.
    dp.extra_cache.data = s.pool > 0 ? dp.swa_cache.data : upload(p.extra_cache);
    dp.extra_cache.space = MemorySpace::kDevice;
    dp.extra_indices.data = upload(p.extra_idx);
    dp.extra_indices.lens = upload(p.extra_lens);
    dp.extra_indices.space = MemorySpace::kDevice;
  }
  uint16_t* out = nullptr;
  float* lse = nullptr;
  const size_t out_elems = size_t(T) * H * kHeadDim;
  CUDA_OK(cudaMalloc(&out, out_elems * 2));
  CUDA_OK(cudaMalloc(&lse, size_t(T) * H * 4));
  CUDA_OK(cudaMemset(out, 0xff, out_elems * 2));  // poison: every element must be written
  CUDA_OK(cudaMemset(lse, 0xff, size_t(T) * H * 4));
  dp.out = out;
  dp.lse = lse;
  dp.kernel = g_kernel;
  dp.query_group_size = g_query_groups ? s.group : 1;
  if (allow_split) {
    dp.workspace_bytes = sparse_attention_workspace_bytes(dp);
    // Without the copy's room the plan keeps its splits and reads the caches directly.
    if (!s.decoded_keys) {
      dp.workspace_bytes = std::min(dp.workspace_bytes, sparse_attention_max_workspace_bytes());
    }
    if (dp.workspace_bytes > 0) CUDA_OK(cudaMalloc(&dp.workspace, dp.workspace_bytes));
  }

  Result r;
  r.kernel = sparse_attention_kernel(dp);
  // The pair kernels round P to bf16 once: their bound adds 2^-9 x the weighted mean of |V|.
  const bool bf16_p = r.kernel == AttentionKernel::kSm90Pairs;
  Status st = sparse_attention(dp);
  if (!st.ok()) {
    std::fprintf(stderr, "%s: %s\n", s.name.c_str(), st.to_string().c_str());
    std::exit(1);
  }
  CUDA_OK(cudaDeviceSynchronize());

  // Check sampled tokens against the double-precision CPU reference.
  std::vector<uint16_t> got(out_elems);
  std::vector<float> got_lse(size_t(T) * H);
  CUDA_OK(cudaMemcpy(got.data(), out, out_elems * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(got_lse.data(), lse, got_lse.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<int32_t> sample;
  for (int32_t t = 0; t < T; t += std::max(1, T / 8)) sample.push_back(t);
  if (sample.back() != T - 1) sample.push_back(T - 1);
  std::vector<double> errs(sample.size(), 0.0);
  std::vector<char> bad(sample.size(), 0);
  std::vector<std::thread> workers;
  for (size_t k = 0; k < sample.size(); ++k) {
    workers.emplace_back([&, k] {
      const int32_t t = sample[k];
      SparseAttentionParams one = hp;
      one.num_tokens = 1;
      one.q = hp.q + int64_t{t} * H * kHeadDim;
      one.swa_indices.data = hp.swa_indices.row(t);
      one.swa_indices.lens = hp.swa_indices.lens + t;
      one.swa_indices.rows = 1;
      if (s.extra_width > 0) {
        one.extra_indices.data = hp.extra_indices.row(t);
        one.extra_indices.lens = hp.extra_indices.lens + t;
        one.extra_indices.rows = 1;
      }
      std::vector<double> ref(size_t(H) * kHeadDim), ref_lse(H);
      if (!sparse_attention_reference(one, ref.data(), ref_lse.data()).ok()) {
        bad[k] = 1;
        return;
      }
      std::vector<float> fref(size_t(H) * kHeadDim), fref_lse(H), fref_abs(size_t(H) * kHeadDim);
      if (bf16_p) {
        testing::float_attention_reference(one, fref.data(), fref_lse.data(), fref_abs.data());
      }
      for (int64_t i = 0; i < int64_t{H} * kHeadDim; ++i) {
        const double v = from_bf16(got[int64_t{t} * H * kHeadDim + i]);
        const double err = std::abs(v - ref[i]);
        // bf16 output rounding (half an ulp, 2^-9 relative) plus fp32 arithmetic, plus P's
        // rounding (allowed twice over, as in the tests).
        const double p_rounding = bf16_p ? 0x1p-8 * fref_abs[i] : 0.0;
        if (!(err <= std::abs(ref[i]) * 0x1p-8 + p_rounding + 1e-3)) bad[k] = 1;
        if (err == err) errs[k] = std::max(errs[k], err);
      }
      for (int32_t h = 0; h < H; ++h) {
        if (!(std::abs(got_lse[int64_t{t} * H + h] - ref_lse[h]) <= 1e-3)) bad[k] = 1;
      }
    });
  }
  for (auto& w : workers) w.join();
  for (size_t k = 0; k < sample.size(); ++k) {
    r.max_err = std::max(r.max_err, errs[k]);
    if (bad[k]) r.ok = false;
  }
  r.checked_tokens = static_cast<int32_t>(sample.size());

  // Timed as engines run it: the call captured once into a CUDA graph, then replayed (the
  // eager call's host-side checks would otherwise sit between the events).
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  st = sparse_attention(dp, stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  if (!st.ok()) {
    std::fprintf(stderr, "%s: capture: %s\n", s.name.c_str(), st.to_string().c_str());
    std::exit(1);
  }
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t e0, e1;
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  auto timed = [&](bool flush_first) {
    if (flush_first) CUDA_OK(cudaMemsetAsync(flush, 0x5a, flush_bytes, stream));
    CUDA_OK(cudaEventRecord(e0, stream));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaEventRecord(e1, stream));
    CUDA_OK(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
    return ms * 1000.0;
  };
  std::vector<double> cold, warm, host, host_known;
  timed(false);  // first replay uploads the graph
  for (int i = 0; i < runs; ++i) cold.push_back(timed(true));
  for (int i = 0; i < runs; ++i) warm.push_back(timed(false));
  // Host time of one eager call (checks, plan, launch), the stream synchronised in between;
  // alternately with the pointers' device given (no per-pointer driver queries).
  SparseAttentionParams known = dp;
  CUDA_OK(cudaGetDevice(&known.pointers_device));
  auto eager_us = [&](const SparseAttentionParams& params) {
    const auto t0 = std::chrono::steady_clock::now();
    st = sparse_attention(params, stream);
    const auto t1 = std::chrono::steady_clock::now();
    CUDA_OK(cudaStreamSynchronize(stream));
    return std::chrono::duration<double, std::micro>(t1 - t0).count();
  };
  for (int i = 0; i < runs; ++i) {
    host.push_back(eager_us(dp));
    host_known.push_back(eager_us(known));
  }
  r.host_us = median(host);
  r.host_known_us = median(host_known);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  r.median_us = median(cold);
  r.min_us = *std::min_element(cold.begin(), cold.end());
  r.warm_us = median(warm);
  // Prefill gathers from a pool that fits in the L2: its floor is the pool once, or the compute.
  const double key_bytes = double(cache_token_bytes(s.dtype)) + 4;
  const double bytes =
      (s.pool > 0 ? double(s.pool) * key_bytes + p.keys * 4.0 : p.keys * key_bytes) +
      2.0 * T * H * kHeadDim * 2;
  r.flops = 2.0 * H * double(p.keys) * 2 * kHeadDim;  // QK and PV
  r.floor_us = std::max(bytes / kReadBandwidth, r.flops / kPeakFlops) * 1e6;

  cudaFree(const_cast<uint16_t*>(dp.q));
  cudaFree(const_cast<float*>(dp.sinks));
  cudaFree(const_cast<void*>(dp.swa_cache.data));
  cudaFree(const_cast<int32_t*>(dp.swa_indices.data));
  cudaFree(const_cast<int32_t*>(dp.swa_indices.lens));
  if (s.extra_width > 0) {
    if (s.pool == 0) cudaFree(const_cast<void*>(dp.extra_cache.data));
    cudaFree(const_cast<int32_t*>(dp.extra_indices.data));
    cudaFree(const_cast<int32_t*>(dp.extra_indices.lens));
  }
  cudaFree(out);
  cudaFree(lse);
  cudaFree(dp.workspace);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return r;
}

// One result as a JSON object (the --json file's "results").
nlohmann::json result_json(const Scenario& s, const Result& r, double tflops) {
  return {{"shape", s.name},
          {"cache", cache_dtype_name(s.dtype)},
          {"tokens", s.tokens},
          {"heads", s.heads},
          {"swa_width", s.swa_width},
          {"extra_width", s.extra_width},
          {"tflops", tflops},
          {"median_us", r.median_us},
          {"min_us", r.min_us},
          {"warm_us", r.warm_us},
          {"floor_us", r.floor_us},
          {"flashmla_ref_us", s.flashmla_us},
          {"host_us", r.host_us},
          {"host_known_device_us", r.host_known_us},
          {"max_err", r.max_err},
          {"checked_tokens", r.checked_tokens},
          {"decoded_keys", s.decoded_keys},
          {"kernel", kernel_name(r.kernel)},
          {"ok", r.ok}};
}

// Writes {"device", "runs", "results"} to path; false if it cannot.
bool write_json(const std::string& path, const char* device, int runs,
                const nlohmann::json& results) {
  std::ofstream f(path);
  f << nlohmann::json{{"device", device}, {"runs", runs}, {"results", results}}.dump(1) << "\n";
  return static_cast<bool>(f);
}

}  // namespace

int main(int argc, char** argv) {
  std::string json;    // --json FILE
  std::string only;    // one shape by name
  std::string filter;  // the shapes whose name contains it
  std::string cache;   // the decode shapes' cache dtype (default: fp8_ds_mla)
  std::string kernel = "auto";
  int runs = 30;
  bool no_split = false, sweep = false, list = false, no_query_groups = false, sorted = false;
  CLI::App app{
      "sparse_swa_attention_bench: the CUDA sparse attention on the DeepSeek-V4 decode "
      "and prefill shapes (bench/README.md#attention)."};
  app.add_option("--json", json, "Write the results to this JSON file");
  app.add_option("--runs", runs, "Timed graph replays per shape")->check(CLI::Range(1, 100000));
  app.add_option("--only", only, "Run only the shape of this name");
  app.add_option("--filter", filter, "Run only the shapes whose name contains this");
  app.add_flag("--no-split", no_split, "Plan without split-KV");
  app.add_flag("--no-query-groups", no_query_groups,
               "Call the MTP shapes without query_group_size");
  app.add_option("--kernel", kernel,
                 "auto, sm90_tile32 or sm90_pairs: the tensor-core kernel family to force");
  app.add_flag("--sweep", sweep, "The batch-size sweep instead of the fixed shapes");
  app.add_option("--cache", cache, "fp8_ds_mla or bf16: the decode shapes' cache dtype");
  app.add_flag("--sorted-rows", sorted,
               "Sort each row's valid entries by slot (diagnosis: how the order of reads matters)");
  app.add_flag("--list", list, "Print the shapes and exit (no GPU needed)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // the help text, or the usage error on stderr
  }
  g_query_groups = !no_query_groups;
  g_sorted_rows = sorted;
  const bool allow_split = !no_split;
  if (const auto k = parse_attention_kernel(kernel); k.ok()) {
    g_kernel = k.value();
  } else {
    std::fprintf(stderr, "--%s\n", k.status().message().c_str());
    return 2;
  }
  CacheDtype decode_dtype = CacheDtype::kFp8DsMla;
  if (!cache.empty()) {
    const auto d = parse_cache_dtype(cache);
    if (!d.ok() || (d.value() != CacheDtype::kFp8DsMla && d.value() != CacheDtype::kBf16)) {
      std::fprintf(stderr, "--cache: expected fp8_ds_mla or bf16, got %s\n", cache.c_str());
      return 2;
    }
    decode_dtype = d.value();
  }
  std::vector<Scenario> scenarios;
  try {
    scenarios = load_scenarios(sweep);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench/attention_shapes.json: %s\n", e.what());
    return 1;
  }
  if (list) {
    for (const Scenario& s : scenarios) {
      std::printf(
          "%-30s tokens %5d heads %3d keys %4d + %4d page %3d fill %.2f group %d pool %5d %s%s\n",
          s.name.c_str(), s.tokens, s.heads, s.swa_width, s.extra_width, s.extra_block,
          s.extra_fill, s.group, s.pool, cache_dtype_name(s.dtype),
          s.decoded_keys ? "" : " direct");
    }
    return 0;
  }
  if (!cuda_backend_available()) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  const size_t flush_bytes = size_t{256} << 20;
  void* flush = nullptr;
  CUDA_OK(cudaMalloc(&flush, flush_bytes));
  std::printf("device: %s, %d SMs; %d runs per shape; split %s; query groups %s; decode cache %s\n",
              prop.name, prop.multiProcessorCount, runs, allow_split ? "on" : "off",
              g_query_groups ? "on" : "off", cache_dtype_name(decode_dtype));
  std::printf("%-30s %7s %8s %8s %8s %9s %9s %7s %8s %8s %9s %-11s %s\n", "shape", "tokens",
              "median", "min", "warm", "floor", "FlashMLA", "TFLOP/s", "host", "host_dev",
              "max_err", "kernel", "check");
  nlohmann::json results = nlohmann::json::array();
  bool all_ok = true;
  for (Scenario& s : scenarios) {
    if (s.pool > 0 || s.dtype == decode_dtype) continue;
    s.dtype = decode_dtype;
    s.flashmla_us = 0.0;  // the reference figures are FlashMLA's fp8_ds_mla decode
  }
  for (const Scenario& s : scenarios) {
    if (!only.empty() && s.name != only) continue;
    if (!filter.empty() && s.name.find(filter) == std::string::npos) continue;
    const Result r = run(s, runs, allow_split, flush, flush_bytes);
    all_ok = all_ok && r.ok;
    const double tflops = r.flops / (r.median_us * 1e-6) / 1e12;
    std::printf("%-30s %7d %8.1f %8.1f %8.1f %9.1f %9.1f %7.0f %8.1f %8.1f %9.2g %-11s %s\n",
                s.name.c_str(), s.tokens, r.median_us, r.min_us, r.warm_us, r.floor_us,
                s.flashmla_us, tflops, r.host_us, r.host_known_us, r.max_err, kernel_name(r.kernel),
                r.ok ? "ok" : "FAIL");
    std::fflush(stdout);
    results.push_back(result_json(s, r, tflops));
    // Rewritten after every shape, so that a run cut short leaves the shapes it finished.
    if (!json.empty() && !write_json(json, prop.name, runs, results)) {
      std::fprintf(stderr, "--json: cannot write %s\n", json.c_str());
      all_ok = false;
    }
  }
  cudaFree(flush);
  return all_ok ? 0 : 1;
}
