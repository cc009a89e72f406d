// SPDX-License-Identifier: Apache-2.0
#include "testing/test_batch.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace sparse_swa::testing {

namespace {

template <typename T>
void print_list(std::ostream& os, const std::vector<T>& v, size_t limit = 16) {
  os << "[";
  for (size_t i = 0; i < v.size() && i < limit; ++i) os << (i ? "," : "") << v[i];
  if (v.size() > limit) os << ",...(" << v.size() << ")";
  os << "]";
}

}  // namespace

TestBatch& TestBatch::add_request(int32_t seq_len, int32_t query_len, std::vector<int32_t> blocks) {
  if (query_len < 0 || seq_len < query_len) {
    throw std::invalid_argument("TestBatch::add_request: need 0 <= query_len <= seq_len");
  }
  const int32_t r = num_reqs();
  // Real tokens go before any trailing padding, which keeps its place at the end.
  const int32_t num_padding = num_tokens() - query_start_loc.back();
  slot_mapping.resize(query_start_loc.back());
  seq_lens.push_back(seq_len);
  pages.push_back(std::move(blocks));
  query_start_loc.push_back(query_start_loc.back() + query_len);
  for (int32_t i = 0; i < query_len; ++i) {
    const int32_t p = seq_len - query_len + i;
    if (p / block_size_ >= static_cast<int32_t>(pages[r].size())) {
      throw std::invalid_argument("TestBatch::add_request: too few pages for the query tokens");
    }
    slot_mapping.push_back(slot(r, p));
  }
  slot_mapping.resize(slot_mapping.size() + num_padding, -1);
  return *this;
}

TestBatch& TestBatch::add_identity_request(int32_t seq_len, int32_t query_len) {
  std::vector<int32_t> blocks((seq_len + block_size_ - 1) / block_size_);
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<int32_t>(i);
  return add_request(seq_len, query_len, std::move(blocks));
}

TestBatch& TestBatch::add_padding_request() { return add_request(0, 0, {}); }

TestBatch& TestBatch::pad_tokens(int32_t count) {
  slot_mapping.resize(slot_mapping.size() + count, -1);
  return *this;
}

TestBatch& TestBatch::invalidate(int32_t token) {
  slot_mapping.at(token) = -1;
  return *this;
}

TestBatch& TestBatch::add_image_span(int32_t request, int32_t start, int32_t end) {
  image_spans.push_back({request, start, end});
  return *this;
}

TestBatch& TestBatch::set_causal(bool c) {
  causal = c;
  return *this;
}

int32_t TestBatch::page(int32_t r, int64_t i) const {
  const auto& row = pages.at(r);
  return i >= 0 && i < static_cast<int64_t>(row.size()) ? row[i] : pad_page;
}

int64_t TestBatch::slot(int32_t r, int64_t p) const {
  return int64_t{page(r, p / block_size_)} * block_size_ + p % block_size_;
}

int32_t TestBatch::block_table_cols() const {
  int32_t cols = min_block_table_cols;
  for (const auto& row : pages) cols = std::max(cols, static_cast<int32_t>(row.size()));
  if (max_block_table_cols >= 0) cols = std::min(cols, max_block_table_cols);
  return cols;
}

BatchInput TestBatch::input() const {
  const int32_t cols = block_table_cols();
  const int64_t rows = static_cast<int64_t>(pages.size());
  block_table_storage_.assign(rows * cols, pad_page);
  for (int64_t r = 0; r < rows; ++r) {
    for (int32_t i = 0; i < cols && i < static_cast<int32_t>(pages[r].size()); ++i) {
      block_table_storage_[r * cols + i] = pages[r][i];
    }
  }
  // The builder rejects a null table for R > 0 even with 0 columns (as a JSON [[]] would give).
  static const int32_t kNoPages = -1;
  BatchInput in;
  in.query_start_loc = query_start_loc;
  in.seq_lens = seq_lens;
  in.block_table = {block_table_storage_.empty() ? &kNoPages : block_table_storage_.data(), rows,
                    cols, cols, MemorySpace::kHost};
  in.slot_mapping = slot_mapping;
  in.causal = causal;
  in.image_spans = image_spans;
  in.replay_start = replay_start;
  return in;
}

std::string TestBatch::describe() const {
  std::ostringstream os;
  os << "B=" << block_size_ << " R=" << num_reqs() << " T=" << num_tokens() << " causal=" << causal
     << " qsl=";
  print_list(os, query_start_loc);
  os << " seq=";
  print_list(os, seq_lens);
  os << " spans=" << image_spans.size();
  for (size_t i = 0; i < image_spans.size() && i < 8; ++i) {
    os << " (" << image_spans[i].request << ":" << image_spans[i].start << "," << image_spans[i].end
       << ")";
  }
  if (!replay_start.empty()) {
    os << " replay=";
    print_list(os, replay_start);
  }
  int invalid = 0;
  for (int32_t t = 0; t < query_start_loc.back() && t < num_tokens(); ++t)
    invalid += slot_mapping[t] < 0;
  os << " invalid_in_requests=" << invalid;
  return os.str();
}

}  // namespace sparse_swa::testing
