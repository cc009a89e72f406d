// SPDX-License-Identifier: Apache-2.0
// sparse-swa attend [--backend cpu|cuda] [--heads H] [--decode-requests D] ...
// End to end on random data: fill a paged KV cache with the codec, build one step's SWA
// metadata with MetadataBuilder, run the sparse attention over its decode and prefill rows
// (plus an optional compressed-cache segment) on the chosen backend, and print a summary with
// the error against the double-precision CPU reference.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "commands.h"
#include "sparse_swa/attention.h"
#include "sparse_swa/kv_cache.h"
#include "testing/step_builder.h"

namespace sparse_swa::cli {

namespace {

struct AttendOptions {
  std::string backend = "cpu";
  int32_t heads = 16;
  int32_t decode_requests = 4;
  int32_t prefill_requests = 1;
  int32_t prefill_len = 16;  // query tokens of each prefill request
  int32_t max_context = 400;
  int32_t window = 128;
  int32_t block_size = 64;
  std::string cache = "fp8_ds_mla";
  int32_t extra_topk = 0;  // compressed-cache entries per token; 0 = an SWA-only layer
  int32_t extra_block_size = 2;
  uint32_t seed = 1;
};

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

uint16_t float_to_bf16(float x) {  // round to nearest even; the inputs here are finite
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// A host paged cache with a random key in every slot.
struct FilledCache {
  std::vector<uint8_t> bytes;
  KvCacheView view;
};

Status fill_cache(CacheDtype dtype, int32_t block_size, int64_t num_blocks, int64_t page_bytes,
                  std::mt19937* rng, FilledCache* c) {
  c->bytes.assign(num_blocks * page_bytes, 0);
  c->view = {c->bytes.data(), num_blocks, block_size, page_bytes, dtype, MemorySpace::kHost};
  const int64_t n = num_blocks * block_size;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> rows(n * kHeadDim);
  for (float& x : rows) x = normal(*rng);
  std::vector<int64_t> slots(n);
  std::iota(slots.begin(), slots.end(), 0);
  return encode_kv_rows({rows.data(), n, kHeadDim, kHeadDim, MemorySpace::kHost}, slots, c->view);
}

// One step: decode requests (query 1) then prefill requests, random contexts, shuffled pages.
struct Step {
  std::vector<int32_t> query_start_loc{0}, seq_lens, block_table;
  std::vector<int64_t> slot_mapping;
  int32_t max_blocks = 0;

  BatchInput input() const {
    BatchInput b;
    b.query_start_loc = query_start_loc;
    b.seq_lens = seq_lens;
    b.block_table = {block_table.data(), static_cast<int64_t>(seq_lens.size()), max_blocks,
                     max_blocks, MemorySpace::kHost};
    b.slot_mapping = slot_mapping;
    return b;
  }
  int32_t num_pages() const { return num_read_pages; }
  int32_t num_read_pages = 1;  // distinct pages of the blocks the step reads (>= 1: page 0)
};

// Only the blocks the step reads get pages of their own: those holding a query token or one of
// the W - 1 positions before it. Earlier blocks (no row reaches them) all name page 0, so the
// cache grows with the window, not with --max-context.
Step make_step(const AttendOptions& o, std::mt19937* rng) {
  Step s;
  std::uniform_int_distribution<int32_t> context(0, o.max_context);
  const int32_t requests = o.decode_requests + o.prefill_requests;
  for (int32_t r = 0; r < requests; ++r) {
    const int32_t ql = r < o.decode_requests ? 1 : o.prefill_len;
    s.seq_lens.push_back(context(*rng) + ql);
    s.query_start_loc.push_back(s.query_start_loc.back() + ql);
  }
  s.max_blocks = static_cast<int32_t>(
      round_up(o.max_context + std::max(1, o.prefill_len), o.block_size) / o.block_size);
  s.block_table.assign(static_cast<size_t>(s.max_blocks) * requests, 0);
  std::vector<int32_t*> read;  // the entries of the blocks the step reads
  for (int32_t r = 0; r < requests; ++r) {
    const int32_t ql = s.query_start_loc[r + 1] - s.query_start_loc[r];
    const int32_t first = std::max(0, s.seq_lens[r] - ql - (o.window - 1)) / o.block_size;
    const int32_t last = (s.seq_lens[r] - 1) / o.block_size;
    for (int32_t b = first; b <= last; ++b) {
      read.push_back(&s.block_table[static_cast<size_t>(r) * s.max_blocks + b]);
    }
  }
  std::vector<int32_t> pages(read.size());
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), *rng);
  for (size_t i = 0; i < read.size(); ++i) *read[i] = pages[i];
  s.num_read_pages = std::max<int32_t>(1, static_cast<int32_t>(pages.size()));
  for (int32_t r = 0; r < requests; ++r) {
    const int32_t ql = s.query_start_loc[r + 1] - s.query_start_loc[r];
    for (int32_t p = s.seq_lens[r] - ql; p < s.seq_lens[r]; ++p) {
      const int64_t page = s.block_table[static_cast<size_t>(r) * s.max_blocks + p / o.block_size];
      s.slot_mapping.push_back(page * o.block_size + p % o.block_size);
    }
  }
  return s;
}

struct Summary {
  double max_out_err = 0, max_lse_err = 0, seconds = 0;
  int64_t keys = 0, empty_rows = 0;
  int32_t min_keys = -1, max_keys = 0;
};

// Attention for tokens [first, first + rows.rows) of the step; adds to the summary.
Status attend_rows(const AttendOptions& o, const SparseAttentionParams& base, int64_t first,
                   const ConstIndexView& rows, const ConstIndexView& extra, Summary* sum) {
  if (rows.rows == 0) return Status::Ok();
  SparseAttentionParams p = base;
  p.num_tokens = rows.rows;
  p.q = base.q + first * o.heads * kHeadDim;
  p.out = base.out + first * o.heads * kHeadDim;
  p.lse = base.lse + first * o.heads;
  p.swa_indices = rows;
  if (extra.rows != 0) {
    p.extra_indices = extra;
    p.extra_indices.data = extra.row(first);
    p.extra_indices.lens = extra.lens + first;
    p.extra_indices.rows = rows.rows;
  }
  const auto start = std::chrono::steady_clock::now();
  if (o.backend == "cuda") {
    SPARSE_SWA_RETURN_IF_ERROR(sparse_attention_cuda_from_host(p));
  } else {
    SPARSE_SWA_RETURN_IF_ERROR(sparse_attention(p));
  }
  sum->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const int64_t n = p.num_tokens * o.heads;
  std::vector<double> ref(n * kHeadDim), ref_lse(n);
  SPARSE_SWA_RETURN_IF_ERROR(sparse_attention_reference(p, ref.data(), ref_lse.data()));
  for (int64_t i = 0; i < n * kHeadDim; ++i) {
    const double err = std::abs(bf16_to_float(p.out[i]) - ref[i]);
    sum->max_out_err = std::max(sum->max_out_err, std::isnan(err) ? INFINITY : err);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (std::isinf(ref_lse[i])) {
      if (!std::isinf(p.lse[i])) sum->max_lse_err = INFINITY;
      continue;
    }
    const double err = std::abs(p.lse[i] - ref_lse[i]);
    sum->max_lse_err = std::max(sum->max_lse_err, std::isnan(err) ? INFINITY : err);
  }
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    int32_t keys = 0;
    for (const ConstIndexView* v : {&p.swa_indices, &p.extra_indices}) {
      if (v->rows == 0) continue;
      for (int32_t j = 0; j < v->lens[t]; ++j) keys += v->row(t)[j] >= 0;
    }
    sum->keys += keys;
    sum->empty_rows += keys == 0;
    sum->min_keys = sum->min_keys < 0 ? keys : std::min(sum->min_keys, keys);
    sum->max_keys = std::max(sum->max_keys, keys);
  }
  return Status::Ok();
}

Status check_range(const char* flag, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi) {
    return invalid_argument(flag, ": expected ", lo, "..", hi, ", got ", value);
  }
  return Status::Ok();
}

// Every out-of-range value is invalid input (exit 1) named by its flag.
Status check_options(const AttendOptions& o) {
  SPARSE_SWA_RETURN_IF_ERROR(check_range("--heads", o.heads, 1, kMaxAttentionHeads));
  SPARSE_SWA_RETURN_IF_ERROR(check_range("--decode-requests", o.decode_requests, 0, 4096));
  SPARSE_SWA_RETURN_IF_ERROR(check_range("--prefill-requests", o.prefill_requests, 0, 4096));
  if (o.decode_requests + o.prefill_requests == 0) {
    return invalid_argument(
        "--decode-requests, --prefill-requests: expected at least one request, got 0 and 0");
  }
  SPARSE_SWA_RETURN_IF_ERROR(check_range("--prefill-len", o.prefill_len, 2, 4096));
  SPARSE_SWA_RETURN_IF_ERROR(check_range("--max-context", o.max_context, 0, 1 << 20));
  SPARSE_SWA_RETURN_IF_ERROR(check_range("--window", o.window, 1, 1 << 16));
  if (o.block_size <= 0 || o.block_size % 32 != 0 || o.block_size > 4096) {
    return invalid_argument("--block-size: expected a multiple of 32 in 32..4096, got ",
                            o.block_size);
  }
  if (!parse_cache_dtype(o.cache).ok()) {
    return invalid_argument("--cache: expected fp8_ds_mla, bf16 or fp8_e4m3, got '",
                            printable_excerpt(o.cache), "'");
  }
  SPARSE_SWA_RETURN_IF_ERROR(check_range("--extra-topk", o.extra_topk, 0, 4096));
  return check_range("--extra-block-size", o.extra_block_size, 1, 1024);
}

Status run_attend(const AttendOptions& o) {
  SPARSE_SWA_RETURN_IF_ERROR(check_options(o));
  auto dtype = parse_cache_dtype(o.cache);
  SPARSE_SWA_RETURN_IF_ERROR(dtype.status());
  const CacheConsumer consumer = dtype.value() == CacheDtype::kFp8DsMla
                                     ? CacheConsumer::kFlashMla
                                     : CacheConsumer::kFlashInfer;
  auto layout = page_layout(o.block_size, dtype.value(), consumer);
  SPARSE_SWA_RETURN_IF_ERROR(layout.status());

  BuilderConfig config;
  config.window_size = o.window;
  config.block_size = o.block_size;
  config.max_num_seqs = o.decode_requests + o.prefill_requests;
  config.max_num_batched_tokens = o.decode_requests + o.prefill_requests * o.prefill_len;
  config.max_model_len = o.max_context + std::max(1, o.prefill_len);
  auto builder = testing::StepBuilder::create(config, backend_named(o.backend));
  if (builder.status().code() == StatusCode::kInvalidArgument) {
    return invalid_argument(
        "the step of --decode-requests, --prefill-requests, --prefill-len, --window and "
        "--max-context needs a builder the library rejects: ",
        builder.status().message());
  }
  SPARSE_SWA_RETURN_IF_ERROR(builder.status());

  std::mt19937 rng(o.seed);
  const Step step = make_step(o, &rng);
  SwaMetadata md;
  SPARSE_SWA_RETURN_IF_ERROR(builder.value()->build(step.input(), &md));

  FilledCache swa;
  SPARSE_SWA_RETURN_IF_ERROR(
      fill_cache(dtype.value(), o.block_size, step.num_pages(), layout->page_bytes, &rng, &swa));
  // The compressed cache: its own page size; a random top-k of its slots per token.
  const int64_t T = md.num_tokens;
  FilledCache extra;
  std::vector<int32_t> extra_data(std::max<int64_t>(1, T * o.extra_topk), -1);
  std::vector<int32_t> extra_lens(std::max<int64_t>(1, T), 0);
  ConstIndexView extra_rows;
  if (o.extra_topk > 0) {
    const int64_t blocks =
        round_up(4 * int64_t{o.extra_topk}, o.extra_block_size) / o.extra_block_size;
    const int64_t page =
        round_up(int64_t{o.extra_block_size} * cache_token_bytes(dtype.value()), layout->alignment);
    SPARSE_SWA_RETURN_IF_ERROR(
        fill_cache(dtype.value(), o.extra_block_size, blocks, page, &rng, &extra));
    std::uniform_int_distribution<int32_t> slot(
        0, static_cast<int32_t>(blocks * o.extra_block_size) - 1);
    std::uniform_int_distribution<int32_t> len(0, o.extra_topk);
    for (int64_t t = 0; t < T; ++t) {
      extra_lens[t] = len(rng);
      for (int32_t j = 0; j < extra_lens[t]; ++j) extra_data[t * o.extra_topk + j] = slot(rng);
    }
    extra_rows = {extra_data.data(), extra_lens.data(), T, o.extra_topk, o.extra_topk, 0,
                  MemorySpace::kHost};
  }

  std::vector<uint16_t> q(std::max<int64_t>(1, T * o.heads * kHeadDim));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (uint16_t& v : q) v = float_to_bf16(normal(rng));
  std::vector<uint16_t> out(q.size());
  std::vector<float> lse(std::max<int64_t>(1, T * o.heads));
  SparseAttentionParams base;
  base.num_heads = o.heads;
  base.q = q.data();
  base.out = out.data();
  base.lse = lse.data();
  base.swa_cache = swa.view;
  if (o.extra_topk > 0) base.extra_cache = extra.view;

  Summary sum;
  SPARSE_SWA_RETURN_IF_ERROR(attend_rows(o, base, 0, md.decode_swa, extra_rows, &sum));
  SPARSE_SWA_RETURN_IF_ERROR(
      attend_rows(o, base, md.num_decode_tokens, md.prefill_swa, extra_rows, &sum));

  std::printf("sparse-swa attend: backend %s, %d heads, cache %s\n", o.backend.c_str(), o.heads,
              o.cache.c_str());
  std::printf(
      "  step: %d decode + %d prefill requests, %d decode rows (width %d), %d prefill "
      "rows (width %d), window %d\n",
      md.num_decodes, md.num_prefills, md.num_decode_tokens, md.decode_swa.width,
      md.num_prefill_tokens, md.prefill_swa.width, o.window);
  std::printf("  swa cache: %d pages of %d tokens, %lld bytes per page\n", step.num_pages(),
              o.block_size, static_cast<long long>(layout->page_bytes));
  if (o.extra_topk > 0) {
    std::printf("  extra cache: %lld pages of %d tokens, top-k %d per token\n",
                static_cast<long long>(extra.view.num_blocks), o.extra_block_size, o.extra_topk);
  }
  std::printf("  keys per token: min %d, mean %.1f, max %d; tokens without keys: %lld\n",
              std::max(sum.min_keys, 0), T > 0 ? static_cast<double>(sum.keys) / T : 0.0,
              sum.max_keys, static_cast<long long>(sum.empty_rows));
  std::printf("  attention time: %.3f ms%s\n", sum.seconds * 1e3,
              o.backend == "cuda" ? " (including host-device copies)" : "");
  std::printf(
      "  max |out - cpu reference| = %.3g (bf16 output), max |lse - cpu reference| = %.3g\n",
      sum.max_out_err, sum.max_lse_err);
  return flush_stdout();
}

}  // namespace

void add_attend_command(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<AttendOptions>();
  CLI::App* cmd = app.add_subcommand(
      "attend",
      "Sparse MLA attention end to end on random data: codec-filled KV cache, metadata from "
      "the builder, attention on the chosen backend, error against the CPU reference");
  cmd->add_option("--backend", o->backend, "metadata and attention backend: cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  // check_options() checks the ranges: an out-of-range value is invalid input (exit 1).
  cmd->add_option("--heads", o->heads, "query heads (1..128, no padding)")->capture_default_str();
  cmd->add_option("--decode-requests", o->decode_requests,
                  "requests with one query token (0..4096)")
      ->capture_default_str();
  cmd->add_option("--prefill-requests", o->prefill_requests,
                  "requests with --prefill-len tokens (0..4096)")
      ->capture_default_str();
  cmd->add_option("--prefill-len", o->prefill_len, "query tokens of each prefill request (2..4096)")
      ->capture_default_str();
  cmd->add_option("--max-context", o->max_context,
                  "context tokens are drawn from 0..this (at most 1048576)")
      ->capture_default_str();
  cmd->add_option("--window", o->window, "sliding window W (1..65536)")->capture_default_str();
  cmd->add_option("--block-size", o->block_size,
                  "SWA cache tokens per page (a multiple of 32, at most 4096)")
      ->capture_default_str();
  cmd->add_option("--cache", o->cache, "cache dtype: fp8_ds_mla, bf16 or fp8_e4m3")
      ->capture_default_str();
  cmd->add_option("--extra-topk", o->extra_topk,
                  "compressed-cache entries per token (0 = none, at most 4096)")
      ->capture_default_str();
  cmd->add_option("--extra-block-size", o->extra_block_size,
                  "compressed cache entries per page (1..1024; C128A: 2)")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "random seed")->capture_default_str();
  cmd->callback([o, exit_code] {
    const Status status = run_attend(*o);
    *exit_code = status.ok() ? kExitOk : report_error(status);
  });
}

}  // namespace sparse_swa::cli
