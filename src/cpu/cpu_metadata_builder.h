// The CPU reference backend of MetadataBuilder: plain loops over the shared formulas.
#pragma once

#include <memory>
#include <vector>

#include "batch_checks.h"
#include "common/swa_formulas.h"
#include "sparse_swa/metadata_builder.h"

namespace sparse_swa::detail {

class CpuMetadataBuilder final : public MetadataBuilder {
 public:
  CpuMetadataBuilder(const BuilderConfig& config, const DerivedConfig& derived);

  Backend backend() const override { return Backend::kCpu; }
  Status build(const BatchInput& batch, SwaMetadata* out) override;
  Status update_draft_decode_rows(const BatchInput& batch, SwaMetadata* md) override;

 private:
  enum class RowKind { kCausal, kNonCausal };
  // Window of token t of request r (a valid token of a real request), widened by (left, right).
  struct TokenWindow {
    int32_t request;
    formulas::Window window;
  };
  TokenWindow token_window(const BatchInput& b, int32_t t, int32_t r, RowKind kind, int32_t left,
                           int32_t right) const;
  // Every valid token's window must lie in [0, seq_len) and the block table's columns and read
  // non-negative block ids whose slots fit int32.
  Status check_windows(const BatchInput& b, const StepSplit& split, bool with_image) const;
  Status check_window_blocks(const BatchInput& b, int32_t t, const TokenWindow& tw) const;
  // Rows of tokens [first_token, first_token + num_rows): token t belongs to request
  // token_to_req[t] and is valid where is_valid[t].
  void write_rows(const BatchInput& b, const int32_t* token_to_req, const uint8_t* is_valid,
                  int32_t first_token, int32_t num_rows, RowKind kind, bool with_image,
                  int32_t* rows, int32_t row_width, int32_t* lens) const;

  // Persistent buffers, sized at construction. Index buffers: [max_tokens, width] int32.
  std::vector<int32_t> token_to_req_;           // [max_tokens]
  std::vector<uint8_t> is_valid_;               // [max_tokens]
  std::vector<int32_t> decode_rows_;            // [max_tokens, W]
  std::vector<int32_t> decode_rows_noncausal_;  // [max_tokens, Wn] (DSpark only)
  std::vector<int32_t> decode_lens_;            // [max_tokens], tail zeroed after each build
  std::vector<int32_t> prefill_rows_;           // [max_tokens, W + Mi]
  std::vector<int32_t> prefill_lens_;           // [max_tokens]
  std::vector<int32_t> left_visible_;           // [max_tokens] (vision only)
  std::vector<int32_t> right_visible_;          // [max_tokens] (vision only)
  std::vector<int32_t> span_indptr_;            // [max_num_seqs + 1]
  std::vector<int32_t> span_starts_;            // [max_tokens]
  std::vector<int32_t> span_ends_;              // [max_tokens]
  std::vector<int32_t> gather_lens_;            // [max_num_seqs]
  std::vector<int32_t> prefill_seq_lens_;       // [max_num_seqs]
  std::vector<int32_t> prefill_query_lens_;     // [max_num_seqs]
  SpanCsr spans_;
  OwnedBuffers owned_;  // the buffers above that the metadata exports
  // The last build's spans and decode tokens' mapping and validity for update_draft_decode_rows,
  // kept where the caller cannot write them (token_to_req_ and is_valid_ are exported).
  DraftUpdateRecord last_build_;
  std::vector<int32_t> build_query_start_loc_;  // [max_num_seqs + 1]
  std::vector<int32_t> build_token_to_req_;     // [max_tokens], the first Td entries
  std::vector<uint8_t> build_is_valid_;         // [max_tokens], the first Td entries
};

}  // namespace sparse_swa::detail
