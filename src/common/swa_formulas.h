// SPDX-License-Identifier: Apache-2.0
// Per-token formulas shared by the CPU reference and the CUDA kernels (one spec, two backends).
// Positions are absolute token positions of a request; windows are half-open [start, end).
#pragma once

#include <climits>
#include <cstdint>

#if defined(__CUDACC__)
#define SPARSE_SWA_HD __host__ __device__ __forceinline__
#else
#define SPARSE_SWA_HD inline
#endif

namespace sparse_swa::formulas {

SPARSE_SWA_HD int32_t min32(int32_t a, int32_t b) { return a < b ? a : b; }
SPARSE_SWA_HD int32_t max32(int32_t a, int32_t b) { return a > b ? a : b; }
SPARSE_SWA_HD int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
SPARSE_SWA_HD int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Window {
  int32_t start;
  int32_t end;
  SPARSE_SWA_HD int32_t size() const { return end - start; }
};

// Causal window of the token at `pos`, widened by in-image visibility (left, right >= 0):
// it starts up to max(left - (W - 1), 0) positions earlier and ends `right` positions later,
// and never before the request's replay_start (SWA bounded replay: no window KV below it; 0 =
// no replay).
SPARSE_SWA_HD Window causal_window(int32_t pos, int32_t window, int32_t left, int32_t right,
                                   int32_t replay_start = 0) {
  const int32_t left_add = max32(left - (window - 1), 0);
  return {max32(max32(pos - (window - 1) - left_add, 0), replay_start), pos + right + 1};
}

// DSpark non-causal draft window: the W context tokens strictly before the draft block plus
// every block token, identical for all tokens of the request.
SPARSE_SWA_HD Window noncausal_window(int32_t prefix_len, int32_t seq_len, int32_t window) {
  return {max32(prefix_len - window, 0), seq_len};
}

// KV slot of absolute position p: block_table_row[p / B] * B + p % B (64-bit; the builder checks
// that every slot it writes fits int32).
SPARSE_SWA_HD int64_t slot_id(const int32_t* block_table_row, int32_t block_size, int32_t p) {
  return static_cast<int64_t>(block_table_row[p / block_size]) * block_size + p % block_size;
}

// In-image visibility of position `pos` given its request's spans (inclusive bounds).
// Later spans overwrite earlier ones, as in the reference; valid spans never overlap.
SPARSE_SWA_HD void image_visibility(int32_t pos, const int32_t* span_starts,
                                    const int32_t* span_ends, int32_t span_begin,
                                    int32_t span_end_index, int32_t max_image_tokens, int32_t* left,
                                    int32_t* right) {
  int32_t l = 0, r = 0;
  for (int32_t i = span_begin; i < span_end_index; ++i) {
    const int32_t s = span_starts[i], e = span_ends[i];
    if (pos >= s && pos <= e) {
      l = min32(pos - s, max_image_tokens - 1);
      r = min32(e - pos, max_image_tokens);
    }
  }
  *left = l;
  *right = r;
}

// Trailing SWA tokens the prefill path gathers for one request:
// ql + min(max(prefix - replay_start, 0), W - 1) (context below replay_start has no window KV).
SPARSE_SWA_HD int32_t gather_len(int32_t query_len, int32_t prefix_len, int32_t window,
                                 int32_t replay_start) {
  return query_len + min32(max32(prefix_len - replay_start, 0), window - 1);
}

// Absolute position of token t of request r, clamped to int32. Only CUDA-graph padding tokens
// (mapped to request 0, past its query) can exceed int32; they lie past every span of request
// 0 either way, so the clamp keeps their visibility 0, as the reference's wrapped value does.
SPARSE_SWA_HD int32_t token_position(int32_t seq_len, int32_t query_start, int32_t query_end,
                                     int32_t t) {
  const int64_t pos = int64_t{seq_len} - (query_end - query_start) + (int64_t{t} - query_start);
  return pos > INT32_MAX ? INT32_MAX : static_cast<int32_t>(pos);
}

// Request owning token t: the last r with query_start_loc[r] <= t (empty requests skipped).
// Tokens at or past query_start_loc[num_reqs] are CUDA-graph padding and map to request 0.
SPARSE_SWA_HD int32_t token_request(const int32_t* query_start_loc, int32_t num_reqs, int32_t t) {
  if (num_reqs <= 0 || t >= query_start_loc[num_reqs]) return 0;
  int32_t lo = 0, hi = num_reqs;  // invariant: qsl[lo] <= t < qsl[hi]
  while (hi - lo > 1) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (query_start_loc[mid] <= t) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// The draft update's request of token t: token_request for real tokens, and the last request
// (num_reqs - 1; 0 without requests) for CUDA-graph padding tokens, whose padding may differ
// from the dummy batch a captured graph was built with.
SPARSE_SWA_HD int32_t draft_token_request(const int32_t* query_start_loc, int32_t num_reqs,
                                          int32_t t) {
  if (num_reqs <= 0) return 0;
  if (t >= query_start_loc[num_reqs]) return num_reqs - 1;
  return token_request(query_start_loc, num_reqs, t);
}

}  // namespace sparse_swa::formulas
