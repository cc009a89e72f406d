// SPDX-License-Identifier: Apache-2.0
#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "common/fp8_e4m3.h"
#include "cuda/cuda_utils.h"
#include "soak/soak.h"
#include "sparse_swa/attention.h"
#include "testing/attention_compare.h"

namespace sparse_swa::soak {

namespace {

constexpr int32_t kVariants = 3;      // index variants per shape
constexpr int32_t kPoisonSlots = 16;  // slots [0, 16) hold NaN keys: never inside a row's lens

struct Shape {
  int32_t heads, width, extra_width, swa_block, extra_block, tokens;
  CacheDtype swa_dtype, extra_dtype;
  bool sinks, workspace;  // workspace: sized by sparse_attention_workspace_bytes()
};

constexpr CacheDtype kDs = CacheDtype::kFp8DsMla;
constexpr CacheDtype kBf = CacheDtype::kBf16;
constexpr CacheDtype kE4 = CacheDtype::kFp8E4m3;

// Small shapes (a sampled call's two CPU references stay well under a second): heads that are
// and are not multiples of the 16-head group, widths off multiples of 32, page sizes 2 to 256,
// both kernels (fp8_ds_mla only: tensor cores on sm_90a), one or two segments, sinks, a workspace
// (splits; the 16- and 24-head shapes: the pair kernels' 5 slices merged inside a cluster; the
// 270-token one: decoded keys, docs/design.md#decoded-keys, on devices of up to 135 SMs).
constexpr Shape kShapes[] = {
    {1, 1, 0, 64, 0, 8, kDs, kDs, false, false},
    {8, 63, 100, 64, 2, 16, kDs, kDs, true, false},
    {16, 128, 64, 256, 2, 8, kDs, kDs, false, true},
    {32, 133, 0, 16, 0, 8, kBf, kBf, true, false},
    {64, 256, 100, 64, 64, 4, kDs, kDs, false, true},
    {128, 128, 0, 256, 0, 2, kDs, kDs, true, false},
    {3, 640, 100, 256, 256, 4, kBf, kBf, false, false},
    {20, 256, 0, 64, 0, 6, kDs, kDs, true, true},
    {100, 63, 100, 64, 2, 4, kDs, kDs, false, false},
    {64, 64, 512, 64, 2, 2, kBf, kDs, false, false},
    {8, 128, 256, 256, 64, 16, kDs, kBf, true, false},
    {32, 256, 100, 256, 256, 1, kE4, kDs, false, false},
    {128, 64, 64, 2, 2, 1, kDs, kDs, true, true},
    {48, 200, 300, 64, 2, 3, kDs, kDs, false, true},
    {16, 1, 512, 64, 2, 8, kDs, kDs, true, false},
    {1, 2048, 0, 64, 0, 2, kE4, kE4, false, false},
    {16, 128, 512, 64, 64, 16, kDs, kDs, true, true},
    {24, 128, 512, 64, 64, 20, kBf, kBf, false, true},
    {8, 64, 100, 64, 2, 270, kDs, kDs, true, true},
};

std::string shape_name(const Shape& s) {
  return "H=" + std::to_string(s.heads) + " W=" + std::to_string(s.width) +
         " E=" + std::to_string(s.extra_width) + " B=" + std::to_string(s.swa_block) + "/" +
         std::to_string(s.extra_block) + " T=" + std::to_string(s.tokens) + " " +
         cache_dtype_name(s.swa_dtype) + "/" + cache_dtype_name(s.extra_dtype) +
         (s.sinks ? " sinks" : "") + (s.workspace ? " workspace" : "");
}

std::string cuda_error(cudaError_t err, const char* what) {
  return std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
}

// A device copy of a host vector.
template <typename T>
Status upload(const std::vector<T>& host, detail::DeviceBuffer<T>* dev) {
  SPARSE_SWA_RETURN_IF_ERROR(dev->allocate(std::max<size_t>(1, host.size())));
  return detail::cuda_status(
      cudaMemcpy(dev->get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
      "cudaMemcpy");
}

}  // namespace

// One shape: a cache per segment, kVariants index matrices per segment, q, sinks, outputs, a
// bad-index counter (stays 0: every entry inside a length is a slot or -1) and the workspace.
struct AttentionSoak::Problem {
  Shape shape{};
  struct Cache {
    int64_t num_blocks = 0, stride = 0;
    std::vector<uint8_t> bytes;
    detail::DeviceBuffer<uint8_t> dev;
  } swa, extra;
  struct Rows {
    std::vector<int32_t> data, lens;
    detail::DeviceBuffer<int32_t> dev_data, dev_lens;
  };
  Rows swa_rows[kVariants], extra_rows[kVariants];
  std::vector<uint16_t> q;
  std::vector<float> sinks;
  detail::DeviceBuffer<uint16_t> dev_q, dev_out;
  detail::DeviceBuffer<float> dev_sinks, dev_lse;
  detail::DeviceBuffer<int32_t> dev_bad;
  detail::DeviceBuffer<uint8_t> workspace;
  SparseAttentionParams host[kVariants], device[kVariants];
};

namespace {

// num_slots random keys with varying row scales, slots [0, 16) NaN and huge; pages padded by
// 48 bytes.
Status fill_cache(CacheDtype dtype, int32_t block_size, int64_t min_slots, uint32_t seed,
                  int64_t* num_blocks, int64_t* stride, std::vector<uint8_t>* bytes) {
  *num_blocks = (std::max<int64_t>(min_slots, 2 * kPoisonSlots) + block_size - 1) / block_size;
  *stride = (block_size * cache_token_bytes(dtype) + 15) / 16 * 16 + 48;
  bytes->assign(*num_blocks * *stride, 0x5c);
  const int64_t n = *num_blocks * block_size;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> rows(n * kHeadDim);
  std::vector<int64_t> slots(n);
  for (int64_t s = 0; s < n; ++s) {
    const float scale = 0.25f + 0.75f * (s % 5);
    for (int d = 0; d < kHeadDim; ++d) {
      const float poison = (s + d) % 2 ? std::nanf("") : 3e38f;
      rows[s * kHeadDim + d] = s < kPoisonSlots ? poison : normal(rng) * scale;
    }
    slots[s] = s;
  }
  return encode_kv_rows(
      {rows.data(), n, kHeadDim, kHeadDim}, slots,
      KvCacheView{bytes->data(), *num_blocks, block_size, *stride, dtype, MemorySpace::kHost});
}

// Rows [T, width] (stride = width): lens 0, full or uniform; 5% -1 holes inside the length;
// past it poison slots, ids past the cache and other negatives, which must never be read.
void fill_rows(int64_t tokens, int32_t width, int64_t num_slots, std::mt19937* rng,
               std::vector<int32_t>* data, std::vector<int32_t>* lens) {
  data->assign(std::max<int64_t>(1, tokens * width), -1);
  lens->assign(std::max<int64_t>(1, tokens), 0);
  std::uniform_int_distribution<int64_t> slot(kPoisonSlots, num_slots - 1);
  for (int64_t t = 0; t < tokens; ++t) {
    const uint32_t pick = (*rng)() % 10;
    const int32_t len =
        pick == 0 ? 0 : (pick < 4 ? width : static_cast<int32_t>((*rng)() % (width + 1)));
    (*lens)[t] = len;
    for (int32_t j = 0; j < width; ++j) {
      int32_t& e = (*data)[t * width + j];
      if (j < len) {
        e = (*rng)() % 20 == 0 ? -1 : static_cast<int32_t>(slot(*rng));
      } else {
        const int32_t garbage[] = {static_cast<int32_t>((*rng)() % kPoisonSlots),
                                   static_cast<int32_t>(num_slots + j), 2147483647, -5, -1};
        e = garbage[(*rng)() % 5];
      }
    }
  }
}

}  // namespace

AttentionSoak::AttentionSoak(const SoakOptions& options, cudaStream_t stream)
    : options_(options), stream_(stream) {}

AttentionSoak::~AttentionSoak() = default;

Status AttentionSoak::setup() {
  uint32_t seed = static_cast<uint32_t>(options_.seed * 7919);
  for (const Shape& s : kShapes) {
    auto p = std::make_unique<Problem>();
    p->shape = s;
    std::mt19937 rng(++seed);
    const bool has_extra = s.extra_width > 0;
    SPARSE_SWA_RETURN_IF_ERROR(fill_cache(s.swa_dtype, s.swa_block, 2 * s.width + 64, ++seed,
                                          &p->swa.num_blocks, &p->swa.stride, &p->swa.bytes));
    SPARSE_SWA_RETURN_IF_ERROR(upload(p->swa.bytes, &p->swa.dev));
    if (has_extra) {
      SPARSE_SWA_RETURN_IF_ERROR(fill_cache(s.extra_dtype, s.extra_block, 2 * s.extra_width + 64,
                                            ++seed, &p->extra.num_blocks, &p->extra.stride,
                                            &p->extra.bytes));
      SPARSE_SWA_RETURN_IF_ERROR(upload(p->extra.bytes, &p->extra.dev));
    }
    const int64_t t = s.tokens;
    const int64_t n = t * s.heads;
    p->q.resize(n * kHeadDim);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (uint16_t& v : p->q) {
      const float x = normal(rng);
      v = fp8::float_to_bf16(x == 0.0f ? 0.5f : x);
    }
    p->sinks.resize(s.heads);
    for (int h = 0; h < s.heads; ++h) p->sinks[h] = 0.5f * (h % 5) - 1.0f;
    SPARSE_SWA_RETURN_IF_ERROR(upload(p->q, &p->dev_q));
    SPARSE_SWA_RETURN_IF_ERROR(upload(p->sinks, &p->dev_sinks));
    SPARSE_SWA_RETURN_IF_ERROR(p->dev_out.allocate(n * kHeadDim));
    SPARSE_SWA_RETURN_IF_ERROR(p->dev_lse.allocate(n));
    SPARSE_SWA_RETURN_IF_ERROR(upload(std::vector<int32_t>{0}, &p->dev_bad));
    for (int v = 0; v < kVariants; ++v) {
      Problem::Rows& sr = p->swa_rows[v];
      fill_rows(t, s.width, p->swa.num_blocks * s.swa_block, &rng, &sr.data, &sr.lens);
      SPARSE_SWA_RETURN_IF_ERROR(upload(sr.data, &sr.dev_data));
      SPARSE_SWA_RETURN_IF_ERROR(upload(sr.lens, &sr.dev_lens));
      SparseAttentionParams& hp = p->host[v];
      hp.num_tokens = t;
      hp.num_heads = s.heads;
      hp.q = p->q.data();
      hp.swa_cache = {p->swa.bytes.data(), p->swa.num_blocks, s.swa_block,
                      p->swa.stride,       s.swa_dtype,       MemorySpace::kHost};
      hp.swa_indices = {sr.data.data(), sr.lens.data(),    t, s.width, s.width,
                        s.width,        MemorySpace::kHost};
      hp.sinks = s.sinks ? p->sinks.data() : nullptr;
      SparseAttentionParams dp = hp;
      dp.q = p->dev_q.get();
      dp.swa_cache.data = p->swa.dev.get();
      dp.swa_cache.space = MemorySpace::kDevice;
      dp.swa_indices = {sr.dev_data.get(), sr.dev_lens.get(),   t, s.width, s.width,
                        s.width,           MemorySpace::kDevice};
      if (has_extra) {
        Problem::Rows& er = p->extra_rows[v];
        fill_rows(t, s.extra_width, p->extra.num_blocks * s.extra_block, &rng, &er.data, &er.lens);
        SPARSE_SWA_RETURN_IF_ERROR(upload(er.data, &er.dev_data));
        SPARSE_SWA_RETURN_IF_ERROR(upload(er.lens, &er.dev_lens));
        hp.extra_cache = {p->extra.bytes.data(), p->extra.num_blocks, s.extra_block,
                          p->extra.stride,       s.extra_dtype,       MemorySpace::kHost};
        hp.extra_indices = {er.data.data(), er.lens.data(),    t, s.extra_width, s.extra_width,
                            s.extra_width,  MemorySpace::kHost};
        dp.extra_cache = {p->extra.dev.get(), p->extra.num_blocks, s.extra_block,
                          p->extra.stride,    s.extra_dtype,       MemorySpace::kDevice};
        dp.extra_indices = {er.dev_data.get(), er.dev_lens.get(),   t, s.extra_width, s.extra_width,
                            s.extra_width,     MemorySpace::kDevice};
      }
      dp.sinks = s.sinks ? p->dev_sinks.get() : nullptr;
      dp.out = p->dev_out.get();
      dp.lse = p->dev_lse.get();
      dp.bad_index_count = p->dev_bad.get();
      p->device[v] = dp;
    }
    if (s.workspace) {
      const int64_t bytes = sparse_attention_workspace_bytes(p->device[0]);
      SPARSE_SWA_RETURN_IF_ERROR(p->workspace.allocate(static_cast<size_t>(bytes)));
      for (SparseAttentionParams& dp : p->device) {
        dp.workspace = p->workspace.get();
        dp.workspace_bytes = bytes;
      }
    }
    problems_.push_back(std::move(p));
  }
  return Status::Ok();
}

void AttentionSoak::call(Problem& p, int32_t variant, int64_t step, PhaseResult* result) {
  if (Status s = sparse_attention(p.device[variant], stream_); !s.ok()) {
    result->fail(step, "sparse_attention (" + shape_name(p.shape) + "): " + s.to_string());
  }
}

void AttentionSoak::sample(Problem& p, int32_t variant, int64_t step, PhaseResult* result) {
  ++result->samples;
  const int64_t n = int64_t{p.shape.tokens} * p.shape.heads;
  // Poisoned first, so stale outputs cannot pass.
  cudaError_t err = cudaMemsetAsync(p.dev_out.get(), 0xff, p.dev_out.bytes(), stream_);
  if (err == cudaSuccess) err = cudaMemsetAsync(p.dev_lse.get(), 0xff, p.dev_lse.bytes(), stream_);
  if (err != cudaSuccess) {
    result->fail(step, cuda_error(err, "cudaMemsetAsync(poison)"));
    return;
  }
  call(p, variant, step, result);
  std::vector<uint16_t> out(n * kHeadDim);
  std::vector<float> lse(n);
  err = cudaStreamSynchronize(stream_);
  if (err == cudaSuccess) {
    err = cudaMemcpy(out.data(), p.dev_out.get(), out.size() * sizeof(uint16_t),
                     cudaMemcpyDeviceToHost);
  }
  if (err == cudaSuccess) {
    err =
        cudaMemcpy(lse.data(), p.dev_lse.get(), lse.size() * sizeof(float), cudaMemcpyDeviceToHost);
  }
  if (err != cudaSuccess) {
    result->fail(step, cuda_error(err, "sample download"));
    return;
  }
  const testing::AttentionComparison e = testing::compare_attention(
      p.host[variant], out, lse,
      sparse_attention_kernel(p.device[variant]) == AttentionKernel::kSm90Pairs);
  if (e.failures > 0) {
    result->fail(step, shape_name(p.shape) + ", variant " + std::to_string(variant) + ": " +
                           std::to_string(e.failures) +
                           " elements out of tolerance; first: " + e.first_failure);
  }
  double& max_err = result->details["max_abs_err"].get_ref<double&>();
  max_err = std::max(max_err, e.max_err);
  double& max_lse = result->details["max_lse_err"].get_ref<double&>();
  max_lse = std::max(max_lse, e.max_lse_err);
}

void AttentionSoak::check_bad_counts(int64_t step, PhaseResult* result) {
  if (const cudaError_t err = cudaStreamSynchronize(stream_); err != cudaSuccess) {
    result->fail(step, cuda_error(err, "cudaStreamSynchronize"));
    return;
  }
  for (const auto& p : problems_) {
    int32_t bad = -1;
    const cudaError_t err = cudaMemcpy(&bad, p->dev_bad.get(), sizeof(bad), cudaMemcpyDeviceToHost);
    if (err != cudaSuccess || bad != 0) {
      result->fail(step, shape_name(p->shape) + ": bad_index_count " + std::to_string(bad) +
                             " (expected 0)" +
                             (err != cudaSuccess ? cuda_error(err, "; read") : ""));
    }
  }
}

void AttentionSoak::warm_up(PhaseResult* result) {
  result->details["max_abs_err"] = 0.0;
  result->details["max_lse_err"] = 0.0;
  for (auto& p : problems_) {
    for (int32_t v = 0; v < kVariants; ++v) call(*p, v, step_++, result);
    sample(*p, 0, step_, result);
  }
  check_bad_counts(step_, result);
}

void AttentionSoak::run(int64_t calls, PhaseResult* result) {
  const int64_t num_problems = static_cast<int64_t>(problems_.size());
  int64_t samples = 0;
  int64_t i = 0;
  for (; i < calls && result->failures() < kMaxFailures; ++i, ++step_) {
    const int64_t pi = step_ % num_problems;
    const auto variant = static_cast<int32_t>((step_ / num_problems) % kVariants);
    if (i >= samples * options_.sample_every && pi == samples % num_problems) {
      sample(*problems_[pi], variant, step_, result);
      ++samples;
    } else {
      call(*problems_[pi], variant, step_, result);
    }
    if ((i + 1) % options_.sync_every == 0 || i + 1 == calls) check_bad_counts(step_, result);
  }
  result->steps += i;
}

nlohmann::ordered_json AttentionSoak::describe() const {
  nlohmann::ordered_json shapes = nlohmann::ordered_json::array();
  for (const auto& p : problems_) shapes.push_back(shape_name(p->shape));
  return {{"shapes", shapes}, {"index_variants_per_shape", kVariants}};
}

}  // namespace sparse_swa::soak
