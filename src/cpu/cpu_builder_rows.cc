// SPDX-License-Identifier: Apache-2.0
// The CPU reference backend of MetadataBuilder: plain loops over the shared formulas.
#include <algorithm>
#include <memory>
#include <new>
#include <vector>

#include "backend.h"
#include "common/int_limits.h"
#include "common/swa_formulas.h"

namespace sparse_swa::detail {

namespace {

class CpuBuilderRows final : public BuilderRows {
 public:
  CpuBuilderRows(const BuilderConfig& config, const DerivedConfig& derived);

  void add_owned_buffers(OwnedBuffers* owned) const override;
  Status write_rows(const BatchInput& batch, const RowsPlan& plan, SwaMetadata* md) override;
  Status write_rows_groups(std::span<BuilderRows* const> rows, std::span<const BatchInput> batches,
                           std::span<const RowsPlan> plans, std::span<SwaMetadata> mds) override;
  Status update_decode_rows(const BatchInput& batch, const DraftUpdateRecord& last) override;
  Status take_device_error() override { return Status::Ok(); }
  void set_stream(void*) override {}
  void* stream() const override { return nullptr; }
  Status poison(uint8_t) override { return Status::Ok(); }

 private:
  enum class RowKind { kCausal, kNonCausal };
  // Window of token t of request r (a valid token of a real request), widened by (left, right)
  // and, for causal rows, clamped to the request's replay start.
  struct TokenWindow {
    int32_t request;
    formulas::Window window;
  };
  TokenWindow token_window(const BatchInput& b, int32_t t, int32_t r, RowKind kind, int32_t left,
                           int32_t right, const int32_t* replay) const;
  // Every valid token's window must lie in [0, seq_len), fit its row and the block table's
  // columns, and read non-negative block ids whose slots fit int32.
  Status check_windows(const BatchInput& b, const RowsPlan& plan) const;
  Status check_window_blocks(const BatchInput& b, int32_t t, const TokenWindow& tw,
                             int32_t row_width) const;
  // Rows of tokens [first_token, first_token + num_rows): token t belongs to request
  // token_to_req[t] and is valid where is_valid[t]; replay (nullptr: none) clamps causal rows.
  void write_rows(const BatchInput& b, const int32_t* token_to_req, const uint8_t* is_valid,
                  int32_t first_token, int32_t num_rows, RowKind kind, bool with_image,
                  const int32_t* replay, int32_t* rows, int32_t row_width, int32_t* lens) const;
  // flashinfer_decode_topk_lens / _seq_lens of the first td tokens from the decode lens and the
  // mapping (docs/semantics.md#flashinfer-decode-lens).
  void write_flashinfer_lens(const BatchInput& b, int32_t td);

  const BuilderConfig config_;
  const DerivedConfig derived_;
  // Persistent buffers, sized at construction. Index buffers: [max_tokens, width] int32.
  std::vector<int32_t> token_to_req_;           // [max_tokens]
  std::vector<uint8_t> is_valid_;               // [max_tokens]
  std::vector<int32_t> decode_rows_;            // [max_tokens, W]
  std::vector<int32_t> decode_rows_noncausal_;  // [max_tokens, Wn] (DSpark only)
  std::vector<int32_t> decode_lens_;            // [max_tokens], tail zeroed after each build
  std::vector<int32_t> prefill_rows_;           // [max_tokens, W + Mi]
  std::vector<int32_t> prefill_lens_;           // [max_tokens]
  std::vector<int32_t> left_visible_;           // [max_tokens] (widening vision only)
  std::vector<int32_t> right_visible_;          // [max_tokens] (widening vision only)
  std::vector<int32_t> gather_lens_;            // [max_num_seqs]
  std::vector<int32_t> replay_start_;           // [max_num_seqs], exported
  std::vector<int32_t> fi_topk_lens_;           // [max_tokens] (config.flashinfer_decode_lens)
  std::vector<int32_t> fi_seq_lens_;            // [max_tokens] (config.flashinfer_decode_lens)
  // The last build as a draft update needs it, where the caller cannot write it: its decode
  // rows, its replay_start and whether it wrote the FlashInfer lens.
  int32_t* build_decode_rows_ = nullptr;
  std::vector<int32_t> build_replay_start_;  // [max_num_seqs]
  bool build_replay_given_ = false;
  bool build_flashinfer_lens_ = false;
};

CpuBuilderRows::CpuBuilderRows(const BuilderConfig& config, const DerivedConfig& derived)
    : config_(config), derived_(derived) {
  const size_t max_tokens = static_cast<size_t>(config.max_num_batched_tokens);
  const size_t max_seqs = static_cast<size_t>(config.max_num_seqs);
  token_to_req_.assign(max_tokens, 0);
  is_valid_.assign(max_tokens, 0);
  decode_rows_.assign(max_tokens * config.window_size, -1);
  if (derived.is_dspark)
    decode_rows_noncausal_.assign(max_tokens * derived.noncausal_index_width, -1);
  decode_lens_.assign(max_tokens, 0);
  prefill_rows_.assign(max_tokens * derived.prefill_index_width, -1);
  prefill_lens_.assign(max_tokens, 0);
  if (derived.widens_images) {
    left_visible_.assign(max_tokens, 0);
    right_visible_.assign(max_tokens, 0);
  }
  gather_lens_.assign(max_seqs, 0);
  replay_start_.assign(max_seqs, 0);
  if (config.flashinfer_decode_lens) {
    fi_topk_lens_.assign(max_tokens, 0);
    fi_seq_lens_.assign(max_tokens, 0);
  }
  build_replay_start_.assign(max_seqs, 0);
}

void CpuBuilderRows::add_owned_buffers(OwnedBuffers* owned) const {
  auto own = [&](const auto& v, const char* name) {
    owned->add(v.data(), v.size() * sizeof(v[0]), name);
  };
  own(token_to_req_, "token_to_req_indices");
  own(is_valid_, "is_valid_token");
  own(decode_rows_, "decode_swa.data");
  own(decode_rows_noncausal_, "decode_swa.data");
  own(decode_lens_, "decode_swa.lens");
  own(prefill_rows_, "prefill_swa.data");
  own(prefill_lens_, "prefill_swa.lens");
  own(left_visible_, "left_visible");
  own(right_visible_, "right_visible");
  own(gather_lens_, "prefill_gather_lens");
  own(replay_start_, "replay_start");
  own(fi_topk_lens_, "flashinfer_decode_topk_lens");
  own(fi_seq_lens_, "flashinfer_decode_seq_lens");
}

CpuBuilderRows::TokenWindow CpuBuilderRows::token_window(const BatchInput& b, int32_t t, int32_t r,
                                                         RowKind kind, int32_t left, int32_t right,
                                                         const int32_t* replay) const {
  const int32_t qs = b.query_start_loc[r];
  const int32_t ql = b.query_start_loc[r + 1] - qs;
  const int32_t seq_len = b.seq_lens[r];
  const int32_t prefix = seq_len - ql;
  const int32_t window = config_.window_size;
  if (kind == RowKind::kNonCausal) return {r, formulas::noncausal_window(prefix, seq_len, window)};
  const int32_t replay_start = replay == nullptr ? 0 : replay[r];
  return {r, formulas::causal_window(prefix + (t - qs), window, left, right, replay_start)};
}

Status CpuBuilderRows::check_window_blocks(const BatchInput& b, int32_t t, const TokenWindow& tw,
                                           int32_t row_width) const {
  const int32_t block_size = config_.block_size;
  const int32_t r = tw.request;
  // Guards: check_batch already keeps every window of a valid token inside [0, seq_len), which
  // the table covers, and replay_start inside the prefix; no row is written from outside either.
  const int32_t seq_len = b.seq_lens[r];
  if (tw.window.start < 0 || tw.window.end > seq_len || tw.window.size() < 1) {
    return invalid_argument("batch.seq_lens[", r, "]: expected token ", t, "'s window inside [0, ",
                            seq_len, "), got positions [", tw.window.start, ", ", tw.window.end,
                            ")");
  }
  if (tw.window.size() > row_width) {
    // Only a draft update can get here: its query_start_loc may give a decode token a longer
    // query than the build's split allowed, and a non-causal row min(prefix, W) + ql entries.
    const int32_t ql = b.query_start_loc[r + 1] - b.query_start_loc[r];
    return invalid_argument("batch.query_start_loc[", r + 1, "]: expected token ", t,
                            "'s window to fit its row of width ", row_width,
                            ", got a request of query length ", ql, " and a window of ",
                            tw.window.size(), " positions");
  }
  const int64_t last_block = (tw.window.end - 1) / block_size;
  if (last_block >= b.block_table.cols) {
    return invalid_argument("batch.block_table[", r, "]: expected token ", t,
                            "'s blocks inside the table's ", b.block_table.cols,
                            " columns, got block column ", last_block);
  }
  const int32_t* bt_row = b.block_table.row(r);
  for (int64_t blk = tw.window.start / block_size; blk <= (tw.window.end - 1) / block_size; ++blk) {
    const int64_t id = bt_row[blk];
    if (id < 0) {
      return invalid_argument("batch.block_table[", r, "][", blk,
                              "]: expected a block id >= 0 (token ", t, " reads positions [",
                              tw.window.start, ", ", tw.window.end, ")), got ", id);
    }
    if (id * block_size + (block_size - 1) > kInt32Max) {
      return invalid_argument("batch.block_table[", r, "][", blk, "]: block id ", id,
                              " * block_size ", block_size, " overflows an int32 slot id");
    }
  }
  return Status::Ok();
}

Status CpuBuilderRows::check_windows(const BatchInput& b, const RowsPlan& plan) const {
  // Recomputes mapping and visibility on the fly so that nothing is written before it passes.
  const SpanCsr& spans = *plan.spans;
  const RowKind decode_kind = b.causal ? RowKind::kCausal : RowKind::kNonCausal;
  const int32_t* qsl = b.query_start_loc.data();
  const int32_t* replay = b.replay_start.empty() ? nullptr : b.replay_start.data();
  for (int32_t t = 0; t < b.num_tokens(); ++t) {
    if (b.slot_mapping[t] < 0) continue;
    const int32_t r = formulas::token_request(qsl, b.num_reqs(), t);
    const bool decode = t < plan.split.num_decode_tokens;
    int32_t left = 0, right = 0;
    if (!decode && plan.with_image) {
      const int32_t pos = formulas::token_position(b.seq_lens[r], qsl[r], qsl[r + 1], t);
      formulas::image_visibility(pos, spans.starts, spans.ends, spans.indptr[r],
                                 spans.indptr[r + 1], config_.max_image_tokens, &left, &right);
    }
    const TokenWindow tw =
        token_window(b, t, r, decode ? decode_kind : RowKind::kCausal, left, right, replay);
    const int32_t width = decode ? plan.decode_width : derived_.prefill_index_width;
    SPARSE_SWA_RETURN_IF_ERROR(check_window_blocks(b, t, tw, width));
  }
  return Status::Ok();
}

void CpuBuilderRows::write_rows(const BatchInput& b, const int32_t* token_to_req,
                                const uint8_t* is_valid, int32_t first_token, int32_t num_rows,
                                RowKind kind, bool with_image, const int32_t* replay, int32_t* rows,
                                int32_t row_width, int32_t* lens) const {
  const int32_t block_size = config_.block_size;
  for (int32_t i = 0; i < num_rows; ++i) {
    const int32_t t = first_token + i;
    int32_t* row = rows + static_cast<int64_t>(i) * row_width;
    if (!is_valid[t]) {
      lens[i] = 0;  // a padded token must not gather through stale indices
      std::fill(row, row + row_width, -1);
      continue;
    }
    const TokenWindow tw = with_image ? token_window(b, t, token_to_req[t], kind, left_visible_[t],
                                                     right_visible_[t], replay)
                                      : token_window(b, t, token_to_req[t], kind, 0, 0, replay);
    // check_windows kept 1 <= size <= row_width; the clamp keeps any slip inside the row.
    const int32_t valid = std::clamp(tw.window.size(), 0, row_width);
    lens[i] = valid;
    const int32_t* bt_row = b.block_table.row(tw.request);
    for (int32_t j = 0; j < valid; ++j) {
      row[j] = static_cast<int32_t>(formulas::slot_id(bt_row, block_size, tw.window.start + j));
    }
    std::fill(row + valid, row + row_width, -1);
  }
}

void CpuBuilderRows::write_flashinfer_lens(const BatchInput& b, int32_t td) {
  const int32_t num_reqs = b.num_reqs();
  for (int32_t t = 0; t < td; ++t) {
    fi_topk_lens_[t] = std::max(decode_lens_[t], config_.window_size);
    fi_seq_lens_[t] = num_reqs > 0 ? b.seq_lens[token_to_req_[t]] : 0;
  }
}

Status CpuBuilderRows::write_rows(const BatchInput& b, const RowsPlan& plan, SwaMetadata* md) {
  SPARSE_SWA_RETURN_IF_ERROR(check_windows(b, plan));

  // Checks passed: from here on nothing fails.
  const SpanCsr& spans = *plan.spans;
  const int32_t num_reqs = b.num_reqs();
  const int32_t num_tokens = b.num_tokens();
  const int32_t* replay = b.replay_start.empty() ? nullptr : b.replay_start.data();
  for (int32_t t = 0; t < num_tokens; ++t) {
    token_to_req_[t] = formulas::token_request(b.query_start_loc.data(), num_reqs, t);
    is_valid_[t] = b.slot_mapping[t] >= 0;
  }
  for (int32_t r = 0; r < num_reqs; ++r) replay_start_[r] = replay == nullptr ? 0 : replay[r];
  if (plan.with_image) {
    for (int32_t t = 0; t < num_tokens; ++t) {
      left_visible_[t] = right_visible_[t] = 0;
      if (t < plan.split.num_decode_tokens) continue;
      const int32_t r = token_to_req_[t];
      const int32_t qs = b.query_start_loc[r];
      const int32_t pos = formulas::token_position(b.seq_lens[r], qs, b.query_start_loc[r + 1], t);
      formulas::image_visibility(pos, spans.starts, spans.ends, spans.indptr[r],
                                 spans.indptr[r + 1], config_.max_image_tokens, &left_visible_[t],
                                 &right_visible_[t]);
    }
  }
  md->token_to_req_indices = {token_to_req_.data(), static_cast<size_t>(num_tokens)};
  md->is_valid_token = {is_valid_.data(), static_cast<size_t>(num_tokens)};
  md->replay_start = {replay_start_.data(), static_cast<size_t>(num_reqs)};

  const int32_t td = plan.split.num_decode_tokens;
  const bool noncausal = !b.causal;
  int32_t* decode_rows = noncausal ? decode_rows_noncausal_.data() : decode_rows_.data();
  const int32_t decode_width = plan.decode_width;
  if (td > 0) {
    std::fill(decode_lens_.begin() + td, decode_lens_.end(), 0);
    // DSpark non-causal rows ignore replay_start: they sit above the replayed window.
    write_rows(b, token_to_req_.data(), is_valid_.data(), 0, td,
               noncausal ? RowKind::kNonCausal : RowKind::kCausal, false,
               noncausal ? nullptr : replay, decode_rows, decode_width, decode_lens_.data());
  }
  md->decode_swa = {decode_rows,         decode_lens_.data(), td, decode_width, decode_width,
                    config_.window_size, MemorySpace::kHost};
  build_flashinfer_lens_ = config_.flashinfer_decode_lens && noncausal && td > 0;
  if (build_flashinfer_lens_) {
    write_flashinfer_lens(b, td);
    md->flashinfer_decode_topk_lens = {fi_topk_lens_.data(), static_cast<size_t>(td)};
    md->flashinfer_decode_seq_lens = {fi_seq_lens_.data(), static_cast<size_t>(td)};
  }

  const int32_t tp = plan.split.num_prefill_tokens;
  if (tp > 0) {
    write_rows(b, token_to_req_.data(), is_valid_.data(), td, tp, RowKind::kCausal, plan.with_image,
               replay, prefill_rows_.data(), derived_.prefill_index_width, prefill_lens_.data());
  }
  md->prefill_swa = {prefill_rows_.data(),
                     prefill_lens_.data(),
                     tp,
                     derived_.prefill_index_width,
                     derived_.prefill_index_width,
                     config_.window_size,
                     MemorySpace::kHost};
  if (plan.with_image) {
    md->left_visible = {left_visible_.data(), static_cast<size_t>(num_tokens)};
    md->right_visible = {right_visible_.data(), static_cast<size_t>(num_tokens)};
  }

  const int32_t rd = plan.split.num_decodes, rp = plan.split.num_prefills;
  for (int32_t p = 0; p < rp; ++p) {
    const int32_t r = rd + p;
    const int32_t ql = b.query_start_loc[r + 1] - b.query_start_loc[r];
    gather_lens_[p] =
        formulas::gather_len(ql, b.seq_lens[r] - ql, config_.window_size, replay_start_[r]);
  }
  md->prefill_gather_lens = {gather_lens_.data(), static_cast<size_t>(rp)};

  build_decode_rows_ = decode_rows;
  std::copy_n(replay_start_.data(), num_reqs, build_replay_start_.data());
  build_replay_given_ = replay != nullptr;
  return Status::Ok();
}

Status CpuBuilderRows::write_rows_groups(std::span<BuilderRows* const> rows,
                                         std::span<const BatchInput> batches,
                                         std::span<const RowsPlan> plans,
                                         std::span<SwaMetadata> mds) {
  // Every row's backend is a CpuBuilderRows (build_groups checked the backends).
  for (size_t g = 0; g < rows.size(); ++g) {
    const Status checked =
        static_cast<CpuBuilderRows*>(rows[g])->check_windows(batches[g], plans[g]);
    if (!checked.ok()) {
      return Status(checked.code(), str_cat("batches[", g, "]: ", checked.message()));
    }
  }
  for (size_t g = 0; g < rows.size(); ++g) {
    SPARSE_SWA_RETURN_IF_ERROR(rows[g]->write_rows(batches[g], plans[g], &mds[g]));
  }
  return Status::Ok();
}

Status CpuBuilderRows::update_decode_rows(const BatchInput& b, const DraftUpdateRecord& last) {
  const int32_t td = last.num_decode_tokens;
  const int32_t num_reqs = b.num_reqs();
  const int32_t* qsl = b.query_start_loc.data();
  // The build's mode and replay_start, over the batch's current arrays (checked by
  // check_draft_update_batch): the build's replay start must still lie inside each prefix.
  const RowKind kind = last.noncausal ? RowKind::kNonCausal : RowKind::kCausal;
  const int32_t* replay = last.noncausal ? nullptr : build_replay_start_.data();
  if (build_replay_given_) {
    BatchInput with_replay = b;
    with_replay.replay_start = {build_replay_start_.data(), static_cast<size_t>(num_reqs)};
    SPARSE_SWA_RETURN_IF_ERROR(check_replay_start(with_replay));
  }
  for (int32_t t = 0; t < td; ++t) {
    if (b.slot_mapping[t] < 0) continue;
    const TokenWindow tw =
        token_window(b, t, formulas::draft_token_request(qsl, num_reqs, t), kind, 0, 0, replay);
    SPARSE_SWA_RETURN_IF_ERROR(check_window_blocks(b, t, tw, last.decode_width));
  }
  // Checks passed: validity of every token from the current slot_mapping, the decode tokens'
  // requests from the current query_start_loc (docs/semantics.md#draft-update).
  for (int32_t t = 0; t < b.num_tokens(); ++t) is_valid_[t] = b.slot_mapping[t] >= 0;
  for (int32_t t = 0; t < td; ++t)
    token_to_req_[t] = formulas::draft_token_request(qsl, num_reqs, t);
  write_rows(b, token_to_req_.data(), is_valid_.data(), 0, td, kind, false, replay,
             build_decode_rows_, last.decode_width, decode_lens_.data());
  if (build_flashinfer_lens_) write_flashinfer_lens(b, td);
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<BuilderRows>> create_cpu_builder_rows(const BuilderConfig& config,
                                                               const DerivedConfig& derived) {
  try {
    return std::unique_ptr<BuilderRows>(new CpuBuilderRows(config, derived));
  } catch (const std::bad_alloc&) {
    return unavailable(
        "MetadataBuilder::create: out of host memory for the persistent buffers "
        "(max_num_batched_tokens = ",
        config.max_num_batched_tokens, ")");
  }
}

}  // namespace sparse_swa::detail
