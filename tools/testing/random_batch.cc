// SPDX-License-Identifier: Apache-2.0
#include "testing/random_batch.h"

#include <algorithm>
#include <limits>
#include <sstream>
#include <vector>

namespace sparse_swa::testing {

namespace {

constexpr int32_t kWindows[] = {1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 32, 33, 64, 100, 123, 128, 130};
constexpr int32_t kBlockSizes[] = {1, 2, 3, 4, 8, 16, 32, 64, 128, 256};
constexpr int32_t kRatios[] = {1, 2, 4, 128};

template <typename T, size_t N>
T pick(std::mt19937_64& rng, const T (&values)[N]) {
  return values[std::uniform_int_distribution<size_t>(0, N - 1)(rng)];
}

int32_t decode_threshold(const BuilderConfig& c) {
  return static_cast<int32_t>(decode_threshold_of(c));
}

}  // namespace

const char* batch_mode_name(BatchMode mode) {
  switch (mode) {
    case BatchMode::kPlainDecode:
      return "plain_decode";
    case BatchMode::kMtp:
      return "mtp";
    case BatchMode::kParallelDrafting:
      return "parallel_drafting";
    case BatchMode::kDsparkNonCausal:
      return "dspark_noncausal";
    case BatchMode::kChunkedPrefill:
      return "chunked_prefill";
    case BatchMode::kImage:
      return "image";
    case BatchMode::kPaddedDecode:
      return "padded_decode";
    case BatchMode::kMixed:
      return "mixed";
  }
  return "unknown";
}

std::string RandomCase::describe() const {
  std::ostringstream os;
  os << "mode=" << batch_mode_name(mode) << " W=" << config.window_size
     << " B=" << config.block_size << " k=" << config.num_speculative_tokens
     << " method=" << speculative_method_name(config.speculative_method)
     << " pd=" << config.parallel_drafting << " v2=" << config.model_runner_v2
     << " Mi=" << config.max_image_tokens << " widen=" << config.widen_image_spans
     << " fi=" << config.flashinfer_decode_lens << " mnbt=" << config.max_num_batched_tokens
     << " seqs=" << config.max_num_seqs << " ratios=[";
  for (size_t i = 0; i < config.compress_ratios.size(); ++i)
    os << (i ? "," : "") << config.compress_ratios[i];
  os << "] " << batch.describe();
  return os.str();
}

void reserve_growth(RandomCase* c, int32_t max_growth) {
  c->config.max_model_len += max_growth;
  const int32_t b = c->batch.block_size();
  int32_t cols = c->batch.block_table_cols();
  for (int32_t r = 0; r < c->batch.num_reqs(); ++r) {
    const int32_t seq = c->batch.seq_lens[r], needed = (seq + b - 1) / b;
    const int32_t spare = static_cast<int32_t>(c->batch.pages[r].size()) - needed;
    cols = std::max(cols, (seq + max_growth + b - 1) / b + std::max(0, spare));
  }
  c->batch.min_block_table_cols = cols;
}

RandomBatchOptions builder_test_options() {
  RandomBatchOptions o;
  o.replay_start_prob = 0.35;
  o.draw_newer_switches = true;
  return o;
}

RandomBatch::RandomBatch(uint64_t seed, RandomBatchOptions options)
    : rng_(seed), options_(options) {}

int32_t RandomBatch::uniform(int32_t lo, int32_t hi) {
  return std::uniform_int_distribution<int32_t>(lo, hi)(rng_);
}

bool RandomBatch::chance(double p) { return std::bernoulli_distribution(p)(rng_); }

RandomCase RandomBatch::next() {
  return next(static_cast<BatchMode>(uniform(0, kNumBatchModes - 1)));
}

RandomCase RandomBatch::next(BatchMode mode) {
  RandomCase c;
  c.mode = mode;
  c.config = config_for(mode);
  // batch_for needs capacities; give it room, then shrink them to the batch plus slack.
  c.config.max_num_batched_tokens = std::numeric_limits<int32_t>::max() / 4;
  c.config.max_num_seqs = std::numeric_limits<int32_t>::max() / 4;
  c.config.max_model_len = std::numeric_limits<int32_t>::max();
  const bool causal = mode != BatchMode::kDsparkNonCausal;
  c.batch = batch_for(c.config, mode, causal);
  int32_t max_seq = 1;
  for (int32_t s : c.batch.seq_lens) max_seq = std::max(max_seq, s);
  c.config.max_num_batched_tokens = std::max(1, c.batch.num_tokens() + uniform(0, 16));
  c.config.max_num_seqs = std::max(1, c.batch.num_reqs() + uniform(0, 4));
  c.config.max_model_len = max_seq + uniform(0, 4096);
  return c;
}

BuilderConfig RandomBatch::config_for(BatchMode mode) {
  BuilderConfig c;
  c.window_size = pick(rng_, kWindows);
  c.block_size = pick(rng_, kBlockSizes);
  const int choose_method = uniform(0, 2);
  switch (mode) {
    case BatchMode::kPlainDecode:
      break;
    case BatchMode::kMtp:
      c.speculative_method = SpeculativeMethod::kMtp;
      c.num_speculative_tokens = uniform(1, 4);
      break;
    case BatchMode::kParallelDrafting:
      c.speculative_method = chance(0.5) ? SpeculativeMethod::kDspark : SpeculativeMethod::kMtp;
      c.num_speculative_tokens = uniform(1, 5);
      c.parallel_drafting = true;
      break;
    case BatchMode::kDsparkNonCausal:
      c.speculative_method = SpeculativeMethod::kDspark;
      c.num_speculative_tokens = uniform(1, 7);
      c.parallel_drafting = chance(0.5);
      if (chance(0.3)) c.max_image_tokens = uniform(1, 64);  // drafts beside an image prefill
      break;
    case BatchMode::kImage:
      c.max_image_tokens = chance(0.2) ? uniform(1, 4) : uniform(1, 96);
      [[fallthrough]];
    case BatchMode::kChunkedPrefill:
    case BatchMode::kPaddedDecode:
    case BatchMode::kMixed:
      if (choose_method == 1) {
        c.speculative_method = SpeculativeMethod::kMtp;
        c.num_speculative_tokens = uniform(1, 4);
      } else if (choose_method == 2) {
        c.speculative_method = SpeculativeMethod::kDspark;
        c.num_speculative_tokens = uniform(0, 7);
        c.parallel_drafting = chance(0.5);
      }
      if (mode == BatchMode::kMixed && chance(0.5)) c.max_image_tokens = uniform(1, 64);
      break;
  }
  // The newer switches: theta without the V1 mask slots, V4.1 vision (no widening), the
  // FlashInfer decode lens.
  if (options_.draw_newer_switches) {
    if (c.parallel_drafting && chance(0.3)) c.model_runner_v2 = true;
    if (c.max_image_tokens > 0 && chance(0.25)) c.widen_image_spans = false;
    if (c.speculative_method == SpeculativeMethod::kDspark && chance(0.4)) {
      c.flashinfer_decode_lens = true;
    }
  }
  // Compress ratios: empty (= {1}) or a random non-empty subset of {1, 2, 4, 128}.
  if (!chance(0.2)) {
    for (int32_t r : kRatios)
      if (chance(0.5)) c.compress_ratios.push_back(r);
    if (c.compress_ratios.empty()) c.compress_ratios.push_back(pick(rng_, kRatios));
  }
  return c;
}

int32_t RandomBatch::random_page(int32_t block_size) {
  // Page ids whose slots fit int32; now and then the largest such id (64-bit slot math).
  const int32_t max_page = static_cast<int32_t>(
      (int64_t{std::numeric_limits<int32_t>::max()} - (block_size - 1)) / block_size);
  return chance(0.03) ? max_page : uniform(0, std::min(max_page, 100000));
}

int32_t RandomBatch::pick_prefix(const BuilderConfig& config, bool prefill, bool chunked) {
  const int32_t w = config.window_size, b = config.block_size;
  if (prefill && !chunked) return 0;
  switch (uniform(0, 5)) {
    case 0:  // window longer than the sequence
      return uniform(0, w + 1);
    case 1:  // around the window length
      return std::max(0, w - 2 + uniform(0, 3));
    case 2: {  // around a block boundary
      const int32_t blocks = uniform(0, std::max(1, options_.max_context_len / b));
      return std::max(0, blocks * b + uniform(-2, 2));
    }
    default:
      return uniform(prefill ? 1 : 0, options_.max_context_len);
  }
}

TestBatch RandomBatch::batch_for(const BuilderConfig& config, BatchMode mode, bool causal) {
  const int32_t theta = decode_threshold(config);
  const int32_t w = config.window_size, b = config.block_size, mi = config.max_image_tokens;
  TestBatch batch(b);
  batch.set_causal(causal);

  int32_t num_decodes = uniform(0, options_.max_decode_reqs);
  int32_t num_prefills = 0;
  bool chunked = chance(0.3);
  int32_t padding_reqs = chance(0.15) ? uniform(1, 2) : 0;
  int32_t padding_tokens = chance(0.3) ? uniform(1, 6) : 0;
  bool invalid_tokens = chance(0.3);
  switch (mode) {
    case BatchMode::kPaddedDecode:
      num_decodes = uniform(1, options_.max_decode_reqs);
      padding_reqs = uniform(1, 4);
      padding_tokens = uniform(0, 8);
      invalid_tokens = chance(0.5);
      break;
    case BatchMode::kDsparkNonCausal:
      num_decodes = uniform(1, options_.max_decode_reqs);
      num_prefills = chance(0.3) ? uniform(1, options_.max_prefill_reqs) : 0;
      break;
    case BatchMode::kChunkedPrefill:
      num_prefills = uniform(1, options_.max_prefill_reqs);
      chunked = true;
      break;
    case BatchMode::kImage:
      num_decodes = uniform(0, 3);
      num_prefills = uniform(1, options_.max_prefill_reqs);
      chunked = chance(0.5);
      break;
    default:
      num_prefills = chance(0.5) ? uniform(1, options_.max_prefill_reqs) : 0;
      break;
  }
  if (num_decodes + num_prefills + padding_reqs == 0) num_decodes = 1;

  struct Req {
    int32_t seq_len, query_len;
    bool prefill;
  };
  std::vector<Req> reqs;
  // DSpark drafts usually share one query length (k + 1); then and now they differ.
  const bool shared_q = mode == BatchMode::kDsparkNonCausal && chance(0.5);
  const int32_t draft_q = chance(0.5) ? theta : uniform(1, theta);
  for (int32_t i = 0; i < num_decodes; ++i) {
    int32_t ql = 1;
    if (shared_q) {
      ql = draft_q;
    } else if (mode != BatchMode::kPlainDecode && theta > 1) {
      ql = chance(0.3) ? theta : uniform(1, theta);
    }
    reqs.push_back({0, ql, false});
  }
  for (int32_t i = 0; i < padding_reqs; ++i) reqs.push_back({0, 0, false});
  for (int32_t i = 0; i < num_prefills; ++i) {
    int32_t ql;
    if (i == 0) {  // the first prefill decides the split: q > theta
      ql = chance(0.3) ? theta + 1 : theta + 1 + uniform(0, options_.max_prefill_query_len);
    } else {  // later requests are prefills whatever their length (short extends included)
      ql = uniform(1, theta + 1 + options_.max_prefill_query_len);
    }
    reqs.push_back({0, ql, true});
  }
  for (Req& r : reqs) {
    if (r.query_len > 0) r.seq_len = r.query_len + pick_prefix(config, r.prefill, chunked);
  }
  // SWA bounded replay in about a third of the batches: a prefill resuming right after a prefix
  // hit (replay_start = prefix) or a later chunk (below it); decodes mostly replay nothing.
  std::vector<int32_t> replay(reqs.size(), 0);
  const bool with_replay = options_.replay_start_prob > 0 && chance(options_.replay_start_prob);
  for (size_t i = 0; with_replay && i < reqs.size(); ++i) {
    const int32_t prefix = reqs[i].seq_len - reqs[i].query_len;
    if (prefix <= 0 || !chance(reqs[i].prefill ? 0.8 : 0.3)) continue;
    switch (uniform(0, 3)) {
      case 0:
        replay[i] = prefix;
        break;
      case 1:
        replay[i] = std::max(0, prefix - w + uniform(-2, 2));
        break;
      default:
        replay[i] = uniform(0, prefix);
        break;
    }
    replay[i] = std::clamp(replay[i], 0, prefix);
  }

  for (size_t i = 0; i < reqs.size(); ++i) {
    const Req& r = reqs[i];
    const int32_t needed = (r.seq_len + b - 1) / b;
    std::vector<int32_t> pages(needed + uniform(0, 2));
    for (int32_t& p : pages) p = random_page(b);
    // Pages wholly before the earliest position any window of this request can read: causal
    // windows start at replay_start or later, DSpark non-causal decode rows ignore it.
    const int32_t prefix = r.seq_len - r.query_len;
    const bool noncausal_rows = !causal && !r.prefill;
    const int32_t lowest = std::max(prefix - std::max(w, mi) - 1, noncausal_rows ? 0 : replay[i]);
    if (options_.free_unread_pages && r.query_len > 0 && chance(0.5)) {
      for (int32_t i = 0; i < needed && int64_t{i + 1} * b <= lowest; ++i) pages[i] = -1;
    }
    batch.add_request(r.seq_len, r.query_len, std::move(pages));
  }
  batch.pad_tokens(padding_tokens);
  if (with_replay) batch.replay_start = replay;

  if (invalid_tokens) {
    for (int32_t t = 0; t < batch.query_start_loc.back(); ++t)
      if (chance(options_.invalid_token_prob)) batch.invalidate(t);
  }

  // Image spans: mostly on prefill requests, sometimes on decode requests (never widened).
  const bool with_spans = mi > 0 && (mode == BatchMode::kImage || chance(0.5));
  for (int32_t r = 0; with_spans && r < batch.num_reqs(); ++r) {
    const int32_t seq = batch.seq_lens[r];
    if (seq == 0 || !chance(reqs[r].prefill ? 0.8 : 0.2)) continue;
    const int32_t prefix = batch.prefix_len(r);
    int32_t cursor = chance(0.5) ? uniform(std::max(0, prefix - mi), seq - 1) : uniform(0, seq - 1);
    for (int32_t n = uniform(1, 3); n > 0 && cursor < seq; --n) {
      const int32_t len = chance(0.3) ? mi : uniform(1, mi);
      const int32_t end = std::min(cursor + len - 1, seq - 1);
      batch.add_image_span(r, cursor, end);
      cursor = end + 1 + uniform(0, 3);
    }
  }
  // Spans in any order across requests.
  std::shuffle(batch.image_spans.begin(), batch.image_spans.end(), rng_);
  return batch;
}

RandomCase RandomBatch::other_group(const RandomCase& base) {
  RandomCase c = base;
  c.config.window_size = pick(rng_, kWindows);
  c.config.block_size = pick(rng_, kBlockSizes);
  c.config.noncausal_index_width = 0;  // derived from the new window
  const TestBatch& b = base.batch;
  const int32_t block = c.config.block_size;
  TestBatch g(block);
  g.set_causal(b.causal);
  for (int32_t r = 0; r < b.num_reqs(); ++r) {
    std::vector<int32_t> pages((b.seq_lens[r] + block - 1) / block + uniform(0, 2));
    for (int32_t& p : pages) p = random_page(block);
    g.add_request(b.seq_lens[r], b.query_len(r), std::move(pages));
  }
  g.pad_tokens(b.num_tokens() - b.query_start_loc.back());
  for (int32_t t = 0; t < b.query_start_loc.back(); ++t) {
    if (b.slot_mapping[t] < 0) g.invalidate(t);
  }
  g.image_spans = b.image_spans;
  g.replay_start = b.replay_start;
  c.batch = std::move(g);
  return c;
}

TestBatch RandomBatch::same_shape_variant(const TestBatch& base, int32_t max_growth) {
  const int32_t b = base.block_size();
  TestBatch v(b);
  v.set_causal(base.causal);
  v.min_block_table_cols = base.block_table_cols();
  v.max_block_table_cols = base.max_block_table_cols;
  v.pad_page = base.pad_page;
  for (int32_t r = 0; r < base.num_reqs(); ++r) {
    const int32_t ql = base.query_len(r), old_seq = base.seq_lens[r];
    const int32_t seq = old_seq == 0 ? 0 : old_seq + uniform(0, max_growth);
    const int32_t old_needed = (old_seq + b - 1) / b, needed = (seq + b - 1) / b;
    const std::vector<int32_t>& old_pages = base.pages[r];
    // As many spare pages past the last needed one as the base row had.
    const int32_t spare = std::max(0, static_cast<int32_t>(old_pages.size()) - old_needed);
    std::vector<int32_t> pages(needed + spare);
    for (size_t i = 0; i < pages.size(); ++i) {
      const bool freed =
          i < old_pages.size() && old_pages[i] == -1 && static_cast<int32_t>(i) < old_needed;
      pages[i] = freed ? -1 : random_page(b);
    }
    v.add_request(seq, ql, std::move(pages));
  }
  v.pad_tokens(base.num_tokens() - base.query_start_loc.back());
  if (chance(0.3)) {
    for (int32_t t = 0; t < v.query_start_loc.back(); ++t)
      if (chance(options_.invalid_token_prob)) v.invalidate(t);
  }
  v.image_spans = base.image_spans;
  v.replay_start = base.replay_start;  // prefixes only grow: still inside them
  return v;
}

}  // namespace sparse_swa::testing
