// SPDX-License-Identifier: Apache-2.0
// RandomBatch: seeded, deterministic generator of valid (config, batch) pairs covering every mode
// the builder supports, for property tests and CPU-vs-CUDA differential tests.
//
//   RandomBatch gen(/*seed=*/42);
//   for (int i = 0; i < 1000; ++i) {
//     RandomCase c = gen.next();                      // a mode drawn uniformly
//     SCOPED_TRACE(c.describe());
//     auto builder = MetadataBuilder::create(c.config).value();
//     builder->build(c.batch.input(), &md);           // always a valid batch
//   }
//
// Every generated batch builds without error: decode-first order, seq_len >= query_len, enough
// pages, non-overlapping image spans of at most max_image_tokens inside [0, seq_len), slot ids
// that fit int32. Pages that no window reads may be "freed" (page id -1), so a backend that
// dereferences outside the sliding window fails instead of reading a plausible slot.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "sparse_swa/config.h"
#include "testing/test_batch.h"

namespace sparse_swa::testing {

enum class BatchMode {
  kPlainDecode,       // speculative_method none: q = 1 decodes, some prefills
  kMtp,               // mtp, k >= 1: decodes with 1 <= q <= theta = 1 + k, some prefills
  kParallelDrafting,  // parallel_drafting: theta = 1 + 2k, q = theta and theta + 1 favoured
  kDsparkNonCausal,   // dspark, causal = false: non-causal draft rows (q up to theta)
  kChunkedPrefill,    // prefills with a cached prefix > 0 beside decodes
  kImage,             // vision config (max_image_tokens > 0) with image spans
  kPaddedDecode,      // CUDA-graph padded decode-only step: q = 0 requests + padding tokens
  kMixed,             // every feature at once, random config
};
inline constexpr int kNumBatchModes = 8;
const char* batch_mode_name(BatchMode mode);

struct RandomCase {
  BatchMode mode = BatchMode::kMixed;
  BuilderConfig config;
  TestBatch batch{1};
  // One line with the mode, the config and the batch shape, for SCOPED_TRACE.
  std::string describe() const;
};

struct RandomBatchOptions {
  int32_t max_decode_reqs = 8;
  int32_t max_prefill_reqs = 4;
  int32_t max_prefill_query_len = 48;  // beyond theta + 1
  int32_t max_context_len = 700;       // cached tokens before a request's query
  double invalid_token_prob = 0.08;    // per real token, in batches that have invalid tokens
  bool free_unread_pages = true;       // page id -1 where no window of the step reads
  // The share of batches with a replay_start (SWA bounded replay); 0 draws none and leaves the
  // random stream as it was without replay (builder_test_options() turns it on).
  double replay_start_prob = 0.0;
  // Draw model_runner_v2, widen_image_spans = false and flashinfer_decode_lens at random; false
  // leaves them at their defaults and the random stream as it was.
  bool draw_newer_switches = false;
};

// What the randomized tests of the builder, the consumers and the attention over the consumers'
// rows use: replay in about a third of the batches (pages below a replay start freed) and the
// newer config switches drawn.
RandomBatchOptions builder_test_options();

// Makes room in `c` for same_shape_variant(c->batch, max_growth): max_model_len raised by
// max_growth, and a block table wide enough for every variant (min_block_table_cols).
void reserve_growth(RandomCase* c, int32_t max_growth);

class RandomBatch {
 public:
  explicit RandomBatch(uint64_t seed, RandomBatchOptions options = {});

  // A random config of the mode's family and a valid batch for it. max_num_batched_tokens,
  // max_num_seqs and max_model_len are set just above what the batch needs (random slack).
  RandomCase next();
  RandomCase next(BatchMode mode);

  // A random config of the mode's family; its capacity fields are left for the caller.
  BuilderConfig config_for(BatchMode mode);
  // A valid batch for `config` (validated, capacities large enough) shaped by `mode`.
  // causal = false needs speculative_method dspark.
  TestBatch batch_for(const BuilderConfig& config, BatchMode mode, bool causal);

  // A new batch of `base`'s shape, as an engine writes one into the input buffers of a captured
  // CUDA graph between replays: the same requests, query_start_loc, tokens, image spans, causal
  // flag and block-table width; each request's seq_len grown by 0..max_growth (empty requests
  // stay empty), fresh page ids (pages `base` freed stay freed: the windows only move forward),
  // the slots recomputed and tokens invalidated at random. Valid for a config that accepted
  // `base` with max_model_len raised by max_growth, when base.min_block_table_cols covers
  // seq_len + max_growth plus the two spare pages batch_for() may add.
  TestBatch same_shape_variant(const TestBatch& base, int32_t max_growth);

  // Another KV-cache group of the same step (MetadataBuilder::build_groups): `base`'s config with
  // a random window and block size, and `base`'s batch with fresh pages of that block size (the
  // same requests, query_start_loc, seq_lens, invalid and padding tokens, image spans, causal
  // flag and replay_start; slots recomputed, no page freed).
  RandomCase other_group(const RandomCase& base);

  std::mt19937_64& rng() { return rng_; }
  int32_t uniform(int32_t lo, int32_t hi);  // inclusive
  bool chance(double p);

 private:
  int32_t pick_prefix(const BuilderConfig& config, bool prefill, bool chunked);
  int32_t random_page(int32_t block_size);

  std::mt19937_64 rng_;
  RandomBatchOptions options_;
};

}  // namespace sparse_swa::testing
