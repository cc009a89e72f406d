// SPDX-License-Identifier: Apache-2.0
// TestBatch: owned storage for one step's BatchInput, described request by request.
//
//   TestBatch b(/*block_size=*/4);
//   b.add_request(/*seq_len=*/11, /*query_len=*/1, {7, 3, 9, 2})  // decode at position 10
//       .add_request(10, 4, {1, 4, 8, 0})                        // chunked prefill, positions 6..9
//       .pad_tokens(2);                                          // CUDA-graph padding
//   builder->build(b.input(), &md);
//
// Slots of the query tokens are computed from the pages (block_table[r][p / B] * B + p % B);
// tests that need other values edit the public arrays directly. Misuse of the helper itself
// (too few pages for a request's tokens) throws std::invalid_argument, which gtest reports.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sparse_swa/batch.h"

namespace sparse_swa::testing {

class TestBatch {
 public:
  explicit TestBatch(int32_t block_size) : block_size_(block_size) {}

  // A request whose `query_len` new tokens are positions [seq_len - query_len, seq_len), reading
  // physical pages `blocks` (page i holds positions [i * B, (i + 1) * B)).
  TestBatch& add_request(int32_t seq_len, int32_t query_len, std::vector<int32_t> blocks);
  // Same with identity pages 0, 1, 2, ... so that slot == position (hand-computed tables).
  TestBatch& add_identity_request(int32_t seq_len, int32_t query_len);
  // A CUDA-graph padding request: query_len 0, seq_len 0, no pages.
  TestBatch& add_padding_request();
  // `count` trailing padding tokens past query_start_loc[R] (slot -1, request 0).
  TestBatch& pad_tokens(int32_t count);
  // Marks token t invalid (slot -1) while it stays inside its request.
  TestBatch& invalidate(int32_t token);
  // An inclusive image span [start, end] of request `request`.
  TestBatch& add_image_span(int32_t request, int32_t start, int32_t end);
  TestBatch& set_causal(bool causal);

  // A view of the arrays (host memory). Valid until the next change to this object.
  BatchInput input() const;

  int32_t block_size() const { return block_size_; }
  int32_t num_reqs() const { return static_cast<int32_t>(seq_lens.size()); }
  int32_t num_tokens() const { return static_cast<int32_t>(slot_mapping.size()); }
  int32_t query_len(int32_t r) const { return query_start_loc[r + 1] - query_start_loc[r]; }
  int32_t prefix_len(int32_t r) const { return seq_lens[r] - query_len(r); }
  // The page table entry of request r's page i, or -1 past the row.
  int32_t page(int32_t r, int64_t i) const;
  // KV slot of position p of request r from its pages (64-bit, no range check on the id).
  int64_t slot(int32_t r, int64_t p) const;
  // The block-table width input() uses: the longest row, or `min_block_table_cols` if larger.
  int32_t block_table_cols() const;
  // "R=3 T=7 qsl=[0,1,3,7] seq=[11,6,10] ..." for failure messages.
  std::string describe() const;

  // The arrays, editable by tests that need malformed or unusual batches.
  std::vector<int32_t> query_start_loc{0};  // [R + 1]
  std::vector<int32_t> seq_lens;            // [R]
  std::vector<std::vector<int32_t>> pages;  // [R][*]; short rows padded with `pad_page`
  std::vector<int64_t> slot_mapping;        // [T], -1 = padding / invalid
  std::vector<ImageSpan> image_spans;       // any order
  std::vector<int32_t> replay_start;        // [R] or empty (no replay)
  bool causal = true;
  int32_t pad_page = -1;              // page id of block-table entries past a row
  int32_t min_block_table_cols = 0;   // forces a wider (or, if smaller, no) table
  int32_t max_block_table_cols = -1;  // >= 0: truncates the table (error tests)

 private:
  int32_t block_size_;
  // input() materialises the row-major block table here: [R, block_table_cols()].
  mutable std::vector<int32_t> block_table_storage_;
};

}  // namespace sparse_swa::testing
