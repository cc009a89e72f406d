// SPDX-License-Identifier: Apache-2.0
// The two index forms the consumers give a prefill attend to the same keys (CPU reference,
// docs/semantics.md#combined-prefill-rows): per-token rows into the paged caches (the mixed
// matrix's SWA section and its compressed top-k, as two segments) and, per chunk of the chunk
// plan, the combined rows into a workspace gathered as an engine gathers it (each chunk request's
// compressed entries, then its SWA positions from gather_start, decoded from the paged caches and
// written in the workspace's dtype; rows nothing should read hold NaN). Both calls must give the
// same output and lse up to the order of the sums, on random batches of the builder's modes (with
// bounded replay in some).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/fp8_e4m3.h"
#include "sparse_swa/attention.h"
#include "sparse_swa/consumers.h"
#include "sparse_swa/kv_cache.h"
#include "sparse_swa/metadata_builder.h"
#include "support/status_matchers.h"
#include "testing/random_batch.h"

namespace sparse_swa {
namespace {

using testing::cpu_builder;

// A host paged cache whose slots all hold `rows` (random normal rows, scales varying by slot),
// or NaN rows when `rng` is null.
struct PagedCache {
  PagedCache(CacheDtype dtype, int32_t block_size, int64_t min_slots, std::mt19937* rng)
      : dtype(dtype),
        block_size(block_size),
        num_blocks(std::max<int64_t>(1, (min_slots + block_size - 1) / block_size)),
        stride((block_size * cache_token_bytes(dtype) + 15) / 16 * 16),
        bytes(num_blocks * stride, 0) {
    const int64_t n = num_slots();
    std::vector<float> rows(n * kHeadDim, std::nanf(""));
    if (rng != nullptr) {
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (int64_t s = 0; s < n; ++s) {
        const float scale = 0.5f + 0.25f * static_cast<float>(s % 5);
        for (int d = 0; d < kHeadDim; ++d) rows[s * kHeadDim + d] = normal(*rng) * scale;
      }
    }
    std::vector<int64_t> slots(n);
    std::iota(slots.begin(), slots.end(), 0);
    const Status st = encode_kv_rows({rows.data(), n, kHeadDim, kHeadDim}, slots, view());
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
  KvCacheView view() {
    return {bytes.data(), num_blocks, block_size, stride, dtype, MemorySpace::kHost};
  }
  ConstKvCacheView view() const {
    return {bytes.data(), num_blocks, block_size, stride, dtype, MemorySpace::kHost};
  }
  int64_t num_slots() const { return num_blocks * block_size; }

  CacheDtype dtype;
  int32_t block_size;
  int64_t num_blocks, stride;
  std::vector<uint8_t> bytes;
};

// Copies slot from[i] of `src` into slot to[i] of `dst` (decoded, then encoded in dst's dtype).
void gather_rows(const PagedCache& src, const std::vector<int64_t>& from, PagedCache* dst,
                 const std::vector<int64_t>& to) {
  const int64_t n = static_cast<int64_t>(from.size());
  if (n == 0) return;
  std::vector<float> rows(n * kHeadDim);
  SPARSE_SWA_ASSERT_OK(decode_kv_rows(src.view(), from, {rows.data(), n, kHeadDim, kHeadDim}));
  SPARSE_SWA_ASSERT_OK(encode_kv_rows({rows.data(), n, kHeadDim, kHeadDim}, to, dst->view()));
}

// The compressed cache of a C2A / C4A / C128A layer: request r's entries seq_len / ratio in
// blocks of `cbs` (block ids a shuffled range), the block table [R, max blocks] (-1 past them).
struct CompressedLayer {
  CompressedLayer(const BatchInput& in, int32_t num_reqs, int32_t ratio, int32_t cbs,
                  CacheDtype dtype, std::mt19937* rng)
      : cbs(cbs) {
    int64_t blocks = 0, widest = 1;
    for (int32_t r = 0; r < num_reqs; ++r) {
      const int64_t b = (in.seq_lens[r] / ratio + cbs - 1) / cbs;
      blocks += b;
      widest = std::max(widest, b);
    }
    cols = widest;
    table.assign(num_reqs * cols, -1);
    std::vector<int32_t> ids(blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), *rng);
    size_t next = 0;
    for (int32_t r = 0; r < num_reqs; ++r) {
      const int64_t b = (in.seq_lens[r] / ratio + cbs - 1) / cbs;
      for (int64_t j = 0; j < b; ++j) table[r * cols + j] = ids[next++];
    }
    cache = std::make_unique<PagedCache>(dtype, cbs, std::max<int64_t>(blocks, 1) * cbs, rng);
  }
  MatrixView<const int32_t> block_table(int32_t num_reqs) const {
    return {table.data(), num_reqs, cols, cols, MemorySpace::kHost};
  }
  int64_t slot(int32_t r, int32_t entry) const {
    return int64_t{table[r * cols + entry / cbs]} * cbs + entry % cbs;
  }

  int32_t cbs;
  int64_t cols = 0;
  std::vector<int32_t> table;
  std::unique_ptr<PagedCache> cache;
};

// Renumbers the batch's pages 0, 1, 2, ... in order of first use (freed pages stay -1) and
// recomputes the slots of its valid tokens, so that a host cache can hold every page.
void compact_pages(testing::TestBatch* b) {
  std::map<int32_t, int32_t> ids;
  for (auto& row : b->pages) {
    for (int32_t& page : row) {
      if (page >= 0) page = ids.emplace(page, static_cast<int32_t>(ids.size())).first->second;
    }
  }
  for (int32_t r = 0; r < b->num_reqs(); ++r) {
    for (int32_t t = b->query_start_loc[r]; t < b->query_start_loc[r + 1]; ++t) {
      if (b->slot_mapping[t] >= 0)
        b->slot_mapping[t] = b->slot(r, b->prefix_len(r) + t - b->query_start_loc[r]);
    }
  }
}

// Local top-k of the prefill tokens, [max(1, Tp * topk)]: distinct causal entries (5 % -1) up to
// min((pos + 1) / ratio, topk), garbage past it (neither consumer reads it).
std::vector<int32_t> random_prefill_topk(const SwaMetadata& md, const testing::TestBatch& batch,
                                         int32_t ratio, int32_t topk, std::mt19937* rng) {
  const int32_t td = md.num_decode_tokens, tp = md.num_prefill_tokens;
  std::vector<int32_t> local(std::max(1, tp * topk), -1);
  for (int32_t i = 0; i < tp && topk > 0; ++i) {
    const int32_t t = td + i;
    if (!md.is_valid_token[t]) continue;
    const int32_t r = md.token_to_req_indices[t];
    const int32_t pos = batch.prefix_len(r) + t - batch.query_start_loc[r];
    const int32_t causal = (pos + 1) / ratio;
    std::vector<int32_t> pick(causal);
    std::iota(pick.begin(), pick.end(), 0);
    std::shuffle(pick.begin(), pick.end(), *rng);
    for (int32_t j = 0; j < topk; ++j) {
      local[i * topk + j] = j < std::min(causal, topk)
                                ? ((*rng)() % 20 == 0 ? -1 : pick[j])
                                : static_cast<int32_t>((*rng)() % (batch.seq_lens[r] / ratio + 1));
    }
  }
  return local;
}

// The workspace of one chunk as an engine gathers it: request b of the chunk owns rows [b M,
// (b + 1) M), its compressed entries 0 .. seq_len / ratio - 1 from row b M, its SWA positions
// from gather_start at row b M + N; every other row NaN.
std::unique_ptr<PagedCache> gather_workspace(const SwaMetadata& md, const testing::TestBatch& batch,
                                             const ChunkPlanEntry& chunk, const PagedCache& swa,
                                             const CompressedLayer& layer, int32_t ratio,
                                             CacheDtype dtype) {
  const int64_t n = chunk.compressed_width, m = chunk.total_width;
  auto workspace = std::make_unique<PagedCache>(
      dtype, 64, std::max<int64_t>(1, (chunk.end - chunk.start) * m), nullptr);
  std::vector<int64_t> from, to, from_c, to_c;
  for (int32_t b = 0; b < chunk.end - chunk.start; ++b) {
    const int32_t r = md.num_decodes + chunk.start + b;
    for (int32_t j = 0; ratio > 1 && j < batch.seq_lens[r] / ratio; ++j) {
      from_c.push_back(layer.slot(r, j));
      to_c.push_back(b * m + j);
    }
    const int32_t gather = md.prefill_gather_lens[r - md.num_decodes];
    for (int32_t i = 0; i < gather; ++i) {
      const int64_t slot = batch.slot(r, batch.seq_lens[r] - gather + i);
      if (slot < 0) continue;  // a freed page: NaN in the workspace
      from.push_back(slot);
      to.push_back(b * m + n + i);
    }
  }
  gather_rows(swa, from, workspace.get(), to);
  if (ratio > 1) gather_rows(*layer.cache, from_c, workspace.get(), to_c);
  return workspace;
}

struct Forms {
  CacheDtype paged, workspace;
};

class AttentionIndexForms : public ::testing::TestWithParam<Forms> {};

TEST_P(AttentionIndexForms, CombinedPrefillRowsAttendAsThePerTokenSegments) {
  const Forms forms = GetParam();
  const uint64_t seed =
      20261202 + static_cast<int>(forms.paged) * 7 + static_cast<int>(forms.workspace);
  // 48 batches of the builder's modes, then 24 with bounded replay in most of them.
  testing::RandomBatchOptions replay_options = testing::builder_test_options();
  replay_options.replay_start_prob = 0.8;
  testing::RandomBatch gen(seed), replay_gen(seed, replay_options);
  std::mt19937 rng(7);
  const testing::BatchMode modes[] = {testing::BatchMode::kChunkedPrefill,
                                      testing::BatchMode::kPlainDecode, testing::BatchMode::kMtp};
  int64_t rows_with_both = 0, chunks = 0, later_requests = 0, later_chunks = 0, replayed = 0;
  for (int iter = 0; iter < 72; ++iter) {
    testing::RandomCase rc = (iter < 48 ? gen : replay_gen).next(modes[iter % 3]);
    compact_pages(&rc.batch);
    SCOPED_TRACE(rc.describe());
    auto builder = cpu_builder(rc.config);
    const BatchInput input = rc.batch.input();
    SwaMetadata md;
    SPARSE_SWA_ASSERT_OK(builder->build(input, &md));
    const int32_t td = md.num_decode_tokens, tp = md.num_prefill_tokens;
    if (tp == 0) continue;
    replayed += md.replay_start_given;
    const int32_t bs = rc.config.block_size, num_reqs = md.num_reqs;
    std::vector<int32_t> ratios;
    for (int32_t r : {1, 2, 4, 128}) {
      if (bs % r == 0) ratios.push_back(r);
    }
    const int32_t ratio = ratios[rng() % ratios.size()];
    const int32_t topk_width = ratio > 1 ? std::vector<int32_t>{4, 16, 64}[rng() % 3] : 0;
    SCOPED_TRACE("ratio " + std::to_string(ratio) + ", TOP_K " + std::to_string(topk_width));

    // The paged SWA cache (every page id of the block table), the compressed layer.
    int64_t swa_slots = bs;
    for (int32_t r = 0; r < num_reqs; ++r) {
      for (int32_t p = 0; p < input.seq_lens[r]; ++p) {
        swa_slots = std::max(swa_slots, rc.batch.slot(r, p) + 1);
      }
    }
    PagedCache swa(forms.paged, bs, swa_slots, &rng);
    const int32_t cbs = bs / ratio;
    CompressedLayer layer(input, num_reqs, ratio, cbs, forms.paged, &rng);
    const CompressedCache compressed{layer.block_table(num_reqs), cbs, ratio};

    const std::vector<int32_t> prefill_local =
        random_prefill_topk(md, rc.batch, ratio, topk_width, &rng);
    std::vector<int32_t> decode_local(std::max(1, td), -1);
    CompressedTopk topk;
    if (ratio > 1) {
      topk.cache = compressed;
      topk.prefill_local = {prefill_local.data(), tp, topk_width, topk_width, MemorySpace::kHost};
      topk.decode_local = {decode_local.data(), td, 1, 1, MemorySpace::kHost};
    } else {
      topk.cache.compress_ratio = 1;
    }
    const ConsumerStep step{md, input, bs};

    // Form 1: the mixed matrix's prefill rows as two segments into the paged caches.
    const MixedMatrixShape shape = mixed_matrix_shape(md, topk);
    const int32_t s_width = shape.swa_width, c_width = shape.compressed_width;
    const int64_t stride = shape.row_width;
    std::vector<int32_t> mixed(std::max<int64_t>(1, int64_t{md.num_tokens} * stride), -7);
    std::vector<int32_t> mixed_lens(std::max(1, md.num_tokens), -7);
    SPARSE_SWA_ASSERT_OK(build_mixed_matrix(step, topk,
                                            {mixed.data(), mixed_lens.data(), md.num_tokens,
                                             shape.row_width, stride, 0, MemorySpace::kHost}));
    std::vector<int32_t> swa_lens(tp), extra_lens(tp);
    for (int32_t i = 0; i < tp; ++i) {
      const int32_t len = mixed_lens[td + i];
      swa_lens[i] = std::min(len, s_width);
      extra_lens[i] = len - swa_lens[i];
      rows_with_both += swa_lens[i] > 0 && extra_lens[i] > 0;
    }
    const int32_t heads = 1 + static_cast<int32_t>(rng() % 4);
    std::vector<uint16_t> q(int64_t{tp} * heads * kHeadDim);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (uint16_t& v : q) v = fp8::float_to_bf16(normal(rng));
    std::vector<float> sinks(heads);
    for (int32_t h = 0; h < heads; ++h) sinks[h] = h % 2 ? 0.5f : -1.0f;

    SparseAttentionParams per_token;
    per_token.num_tokens = tp;
    per_token.num_heads = heads;
    per_token.q = q.data();
    per_token.sinks = sinks.data();
    per_token.swa_cache = swa.view();
    per_token.swa_indices = {mixed.data() + int64_t{td} * stride,
                             swa_lens.data(),
                             tp,
                             s_width,
                             stride,
                             s_width,
                             MemorySpace::kHost};
    if (ratio > 1) {
      per_token.extra_cache = layer.cache->view();
      per_token.extra_indices = {mixed.data() + int64_t{td} * stride + s_width,
                                 extra_lens.data(),
                                 tp,
                                 c_width,
                                 stride,
                                 c_width,
                                 MemorySpace::kHost};
    }
    std::vector<double> want_out(int64_t{tp} * heads * kHeadDim), want_lse(int64_t{tp} * heads);
    SPARSE_SWA_ASSERT_OK(sparse_attention_reference(per_token, want_out.data(), want_lse.data()));

    // Form 2: each chunk's combined rows into its gathered workspace.
    auto plan = prefill_chunk_plan(md, ratio, 1 + static_cast<int64_t>(rng() % 3));
    SPARSE_SWA_ASSERT_OK(plan.status());
    int32_t first = td;  // the chunk's first token
    for (const ChunkPlanEntry& chunk : plan.value()) {
      later_chunks += chunk.start > 0;
      later_requests += chunk.end - chunk.start - 1;
      ++chunks;
      auto cs = combined_prefill_shape(md, chunk, topk_width);
      SPARSE_SWA_ASSERT_OK(cs.status());
      const int32_t rows = cs.value().rows, width = cs.value().width;
      std::vector<int32_t> comb(std::max<int64_t>(1, int64_t{rows} * width), -7);
      std::vector<int32_t> comb_lens(std::max(1, rows), -7);
      SPARSE_SWA_ASSERT_OK(build_combined_prefill(
          step, chunk, ratio, topk.prefill_local,
          {comb.data(), comb_lens.data(), rows, width, width, 0, MemorySpace::kHost}));

      const std::unique_ptr<PagedCache> workspace =
          gather_workspace(md, rc.batch, chunk, swa, layer, ratio, forms.workspace);

      SparseAttentionParams combined;
      combined.num_tokens = rows;
      combined.num_heads = heads;
      combined.q = q.data() + int64_t{first - td} * heads * kHeadDim;
      combined.sinks = sinks.data();
      combined.swa_cache = workspace->view();
      combined.swa_indices = {comb.data(), comb_lens.data(),  rows, width, width,
                              width,       MemorySpace::kHost};
      std::vector<double> got_out(int64_t{rows} * heads * kHeadDim), got_lse(int64_t{rows} * heads);
      SPARSE_SWA_ASSERT_OK(sparse_attention_reference(combined, got_out.data(), got_lse.data()));
      for (int64_t e = 0; e < int64_t{rows} * heads; ++e) {
        const int64_t w = int64_t{first - td} * heads + e;
        const int32_t t = first + static_cast<int32_t>(e / heads);
        if (std::isinf(want_lse[w])) {
          ASSERT_EQ(got_lse[e], want_lse[w]) << "token " << t << " head " << e % heads;
        } else {
          ASSERT_NEAR(got_lse[e], want_lse[w], 1e-9) << "token " << t << " head " << e % heads;
        }
        for (int d = 0; d < kHeadDim; ++d) {
          ASSERT_NEAR(got_out[e * kHeadDim + d], want_out[w * kHeadDim + d], 1e-9)
              << "token " << t << " head " << e % heads << " dim " << d;
        }
      }
      first += rows;
    }
    int32_t real = td;  // the chunks cover every prefill token once (padding tokens excepted)
    for (int32_t p = 0; p < md.num_prefills; ++p) real += md.prefill_query_lens_host[p];
    ASSERT_EQ(first, real);
  }
  // What the batches reached: rows that read both caches, chunks, requests after a chunk's first
  // (workspace rows from b * M on), chunks after a step's first, and replaying steps.
  EXPECT_GT(rows_with_both, 500);
  EXPECT_GT(chunks, 30);
  EXPECT_GT(later_requests, 20);
  EXPECT_GT(later_chunks, 3);
  EXPECT_GT(replayed, 3);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AttentionIndexForms,
                         ::testing::Values(Forms{CacheDtype::kFp8DsMla, CacheDtype::kBf16},
                                           Forms{CacheDtype::kFp8DsMla, CacheDtype::kFp8DsMla},
                                           Forms{CacheDtype::kBf16, CacheDtype::kBf16}),
                         [](const ::testing::TestParamInfo<Forms>& info) {
                           return std::string(cache_dtype_name(info.param.paged)) + "_into_" +
                                  cache_dtype_name(info.param.workspace);
                         });

}  // namespace
}  // namespace sparse_swa
