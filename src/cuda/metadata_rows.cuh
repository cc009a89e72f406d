// SPDX-License-Identifier: Apache-2.0
// Device helpers of the metadata kernel (metadata_kernel.cu): a token's request, and index rows
// written from a block-table row. Warp-level: every function with a `lane` runs on all 32 lanes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cuda_utils.h"
#include "cuda/metadata_kernel.cuh"

namespace sparse_swa::detail::rows {

__device__ inline void flag(const MetadataKernelParams& p, uint32_t bit) {
  atomicOr(p.error_word, bit);
}

// The request of a token, with its query range [query_start, query_end), seq_len and replay
// start (0 without p.replay_start).
struct TokenRequest {
  int32_t r = 0;
  int32_t query_start = 0;
  int32_t query_end = 0;
  int32_t seq_len = 0;
  int32_t replay = 0;
};

// Candidates r in [lo, hi), 0 < hi - lo <= 32, hi <= num_reqs: lane i loads request lo + i's
// query range, seq_len and replay start, all in one round of loads, and the warp picks the last r
// with qsl[r] <= t. Returns whether t lies in [qsl[lo], qsl[r + 1]), which makes r the answer over
// all requests (for non-decreasing qsl). All 32 lanes must call it; all get the same result.
__device__ inline bool find_among(const MetadataKernelParams& p, int32_t t, int32_t lo, int32_t hi,
                                  int lane, TokenRequest* out) {
  const int32_t i = min(lo + lane, hi - 1);
  const int32_t qs = __ldg(p.query_start_loc + i);
  const int32_t qe = __ldg(p.query_start_loc + i + 1);
  const int32_t seq = __ldg(p.seq_lens + i);
  const int32_t replay = p.replay_start != nullptr ? p.replay_start[i] : 0;
  const unsigned below = __ballot_sync(kFullWarpMask, lo + lane < hi && qs <= t);
  const int k = below == 0 ? 0 : 31 - __clz(below);
  out->r = lo + k;
  out->query_start = __shfl_sync(kFullWarpMask, qs, k);
  out->query_end = __shfl_sync(kFullWarpMask, qe, k);
  out->seq_len = __shfl_sync(kFullWarpMask, seq, k);
  out->replay = __shfl_sync(kFullWarpMask, replay, k);
  return (below & 1u) != 0 && t < out->query_end;
}

// Request of real token t over all num_reqs > 0 requests: a 32-ary search, one coalesced load per
// level. Garbage in qsl still gives an r in [0, num_reqs).
__device__ inline TokenRequest search_request(const MetadataKernelParams& p, int32_t t, int lane) {
  int32_t lo = 0, hi = p.num_reqs;  // invariant: qsl[lo] <= t < qsl[hi]
  while (hi - lo > kWarpSize) {
    const int32_t span = hi - lo;  // < 2^24 (max_num_seqs): span * 32 fits int32
    const int32_t idx = lo + span * lane / kWarpSize;
    const unsigned below = __ballot_sync(kFullWarpMask, __ldg(p.query_start_loc + idx) <= t) | 1u;
    const int k = 31 - __clz(below);
    const int32_t next_lo = lo + span * k / kWarpSize;
    hi = k == kWarpSize - 1 ? hi : lo + span * (k + 1) / kWarpSize;
    lo = next_lo;
  }
  TokenRequest out;
  find_among(p, t, lo, hi, lane, &out);
  return out;
}

// Where the host split says token t's request lies: t / decode_query_len for decodes of one
// query length, else the decodes or the prefills. A hint only; find_among checks it.
__device__ inline bool find_by_host_split(const MetadataKernelParams& p, int32_t t, int lane,
                                          TokenRequest* out) {
  int32_t lo = p.num_decodes, hi = p.num_reqs;
  if (t < p.num_decode_tokens) {
    lo = p.decode_query_len > 0 ? t / p.decode_query_len : 0;
    hi = p.decode_query_len > 0 ? lo + 1 : p.num_decodes;
  }
  if (lo < 0 || hi > p.num_reqs || hi <= lo || hi - lo > kWarpSize) return false;
  return find_among(p, t, lo, hi, lane, out);
}

__device__ inline void write_invalid_row(int32_t* row, int32_t width, int32_t* len, int lane) {
  if (lane == 0) *len = 0;
  for (int32_t j = lane; j < width; j += kWarpSize) row[j] = -1;
}

// Positions to blocks: a shift when block_size is a power of two (the usual case), else a
// division. Positions are >= 0.
struct BlockSize {
  int32_t size;
  int32_t shift;  // log2(size), or -1
  __device__ int32_t block(int32_t pos) const { return shift >= 0 ? pos >> shift : pos / size; }
};

// Slot of block id `block` at offset `off`; -1 (and *bad) when it is negative or past int32.
__device__ inline int32_t checked_slot(int32_t block, int32_t block_size, int32_t off, bool* bad) {
  const int64_t slot = static_cast<int64_t>(block) * block_size + off;
  if (slot >= 0 && slot <= kInt32Max) return static_cast<int32_t>(slot);
  *bad = true;
  return -1;
}

// The block ids of a request's block-table row that a warp's rows need, blocks [first, last]:
// loaded once, one per lane, when they number at most 32 (`in_lanes`, warp-uniform), so that
// every row written from them costs no further load; else read from memory entry by entry.
struct RowBlocks {
  const int32_t* bt_row;
  int32_t first;
  bool in_lanes;
  int32_t lane_id;  // block first + lane (in_lanes)
};

__device__ inline RowBlocks load_row_blocks(const int32_t* bt_row, int32_t first, int32_t last,
                                            int lane) {
  RowBlocks b{bt_row, first, last - first < kWarpSize, 0};
  if (b.in_lanes && first + lane <= last) b.lane_id = __ldg(bt_row + first + lane);
  return b;
}

// Block id of block `blk` (when `needed`). All lanes must call it.
__device__ inline int32_t block_id(const RowBlocks& b, int32_t blk, bool needed) {
  if (b.in_lanes) return __shfl_sync(kFullWarpMask, b.lane_id, needed ? blk - b.first : 0);
  return needed ? __ldg(b.bt_row + blk) : 0;
}

// Entries [j0, j0 + 4) of a row of n entries from position start: slots, -1 past n. Needs block
// sizes of >= 4 positions (bs.shift >= 2), so that the 4 entries lie in at most two blocks (two
// shuffles, one 64-bit slot base each), and the row's blocks in lanes. All lanes must call it.
__device__ inline int4 row_chunk(int32_t j0, int32_t n, int32_t start, const RowBlocks& blocks,
                                 const BlockSize& bs, bool* bad) {
  const int32_t mask = bs.size - 1;
  const int32_t pos = start + j0;
  const int32_t blk = pos >> bs.shift;
  const int32_t off = pos & mask;
  const bool needed = j0 < n;
  const bool crosses = needed && off + min(n - j0, 4) - 1 > mask;  // its last needed entry
  const int32_t id0 = block_id(blocks, blk, needed);
  const int32_t id1 = block_id(blocks, blk + 1, needed && crosses);
  const int64_t slot0 = (static_cast<int64_t>(id0) << bs.shift) + off;
  const int64_t slot1 = (static_cast<int64_t>(id1) << bs.shift) + off - bs.size;
  int32_t v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t slot = off + i > mask ? slot1 + i : slot0 + i;
    const bool ok = slot >= 0 && slot <= kInt32Max;
    *bad |= j0 + i < n && !ok;
    v[i] = j0 + i < n && ok ? static_cast<int32_t>(slot) : -1;
  }
  return make_int4(v[0], v[1], v[2], v[3]);
}

// row[j] = slot of position start + j for j < n (n >= 1), else -1; j < width; the positions' blocks
// lie in `blocks`. Entries go out 4 per lane in 16-byte stores when width % 4 == 0 (rows are then
// 16-byte aligned), else one per lane. Returns true when a slot was out of range.
__device__ inline bool write_row(int32_t* row, int32_t width, int32_t n, int32_t start,
                                 const RowBlocks& blocks, const BlockSize& bs, int lane) {
  bool bad = false;
  if (width % 4 == 0 && bs.shift >= 2 && blocks.in_lanes) {
    for (int32_t base = 0; base < width; base += 4 * kWarpSize) {
      const int32_t j0 = base + 4 * lane;
      const int4 v = row_chunk(j0, n, start, blocks, bs, &bad);
      if (j0 < width) *reinterpret_cast<int4*>(row + j0) = v;
    }
  } else if (width % 4 == 0) {
    for (int32_t base = 0; base < width; base += 4 * kWarpSize) {
      const int32_t j0 = base + 4 * lane;
      int32_t v[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const bool needed = j0 + i < n;
        const int32_t pos = start + j0 + i;
        const int32_t blk = bs.block(pos);
        const int32_t id = block_id(blocks, blk, needed);
        v[i] = needed ? checked_slot(id, bs.size, pos - blk * bs.size, &bad) : -1;
      }
      if (j0 < width) *reinterpret_cast<int4*>(row + j0) = make_int4(v[0], v[1], v[2], v[3]);
    }
  } else {
    for (int32_t base = 0; base < width; base += kWarpSize) {
      const int32_t j = base + lane;
      const bool needed = j < n;
      const int32_t blk = bs.block(start + j);
      const int32_t id = block_id(blocks, blk, needed);
      const int32_t value =
          needed ? checked_slot(id, bs.size, start + j - blk * bs.size, &bad) : -1;
      if (j < width) row[j] = value;
    }
  }
  return bad;
}

}  // namespace sparse_swa::detail::rows
