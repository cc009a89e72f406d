// SPDX-License-Identifier: Apache-2.0
#include "cpu/consumer_rows.h"

#include "common/int_limits.h"

namespace sparse_swa::detail {

StatusOr<TokenWindow> host_token_window(const ConsumerStep& step, int32_t t, bool with_image,
                                        bool check_blocks) {
  const SwaMetadata& md = step.md;
  const BatchInput& b = step.batch;
  const int32_t r = md.token_to_req_indices[t];
  if (r < 0 || r >= md.num_reqs) {
    return invalid_argument("metadata.token_to_req_indices[", t, "]: expected 0..", md.num_reqs - 1,
                            ", got ", r);
  }
  const int64_t qs = b.query_start_loc[r], qe = b.query_start_loc[r + 1];
  if (t < qs || t >= qe) {
    return invalid_argument("token ", t, ": maps to request ", r,
                            " but batch.query_start_loc gives that request tokens [", qs, ", ", qe,
                            ")");
  }
  const int32_t seq = b.seq_lens[r];
  const int64_t prefix = int64_t{seq} - (qe - qs);
  if (prefix < 0) {
    return invalid_argument("batch.seq_lens[", r, "]: expected >= query length ", qe - qs, ", got ",
                            seq);
  }
  TokenWindow tw;
  tw.request = r;
  tw.pos = static_cast<int32_t>(prefix + (t - qs));
  int32_t left = 0, right = 0;
  if (with_image) {
    left = md.left_visible[t];
    right = md.right_visible[t];
    // Bounded as the builder writes them: left <= pos, right < seq_len - pos.
    if (left < 0 || right < 0 || left > tw.pos || right > int64_t{seq} - 1 - tw.pos) {
      return invalid_argument("metadata.left_visible/right_visible[", t, "]: expected 0..", tw.pos,
                              " / 0..", int64_t{seq} - 1 - tw.pos, ", got ", left, " / ", right);
    }
  }
  // Bounded replay: no window KV below replay_start (none given: 0). Inside [0, prefix] as the
  // builder checks it, so that the window keeps at least the token's own position.
  const int32_t replay = md.replay_start.empty() ? 0 : md.replay_start[r];
  if (replay < 0 || replay > prefix) {
    return invalid_argument("metadata.replay_start[", r, "]: expected 0..prefix seq_lens[", r,
                            "] - query_len = ", seq, " - ", qe - qs, " = ", prefix, ", got ",
                            replay);
  }
  tw.window = formulas::causal_window(tw.pos, md.window_size, left, right, replay);
  if (tw.window.end > seq) {
    return invalid_argument("token ", t, ": window [", tw.window.start, ", ", tw.window.end,
                            ") of request ", r, " ends past seq_len ", seq);
  }
  if (!check_blocks) return tw;
  const int32_t bs = step.block_size;
  const int32_t* bt = b.block_table.row(r);
  for (int64_t blk = tw.window.start / bs; blk <= (tw.window.end - 1) / bs; ++blk) {
    if (blk >= b.block_table.cols) {
      return invalid_argument("batch.block_table: token ", t, " reads page ", blk, " of request ",
                              r, ", past the table's ", b.block_table.cols, " columns");
    }
    const int64_t id = bt[blk];
    if (id < 0 || id * bs + (bs - 1) > kInt32Max) {
      return invalid_argument("batch.block_table[", r, "][", blk,
                              "]: expected a block id >= 0 whose slots fit int32 (token ", t,
                              " reads positions [", tw.window.start, ", ", tw.window.end,
                              ")), got ", id);
    }
  }
  return tw;
}

int32_t host_global_slot(const CompressedCache& cache, int32_t r, int32_t l) {
  if (l < 0) return -1;
  const int64_t blk = l / cache.block_size;
  if (blk >= cache.block_table.cols) return -1;
  const int64_t id = cache.block_table.row(r)[blk];
  if (id < 0) return -1;
  const int64_t g = id * cache.block_size + l % cache.block_size;
  return g > kInt32Max ? -1 : static_cast<int32_t>(g);
}

}  // namespace sparse_swa::detail
