#include <cuda_runtime.h>

#include <climits>

#include "common/swa_formulas.h"
#include "cuda/metadata_kernel.cuh"

namespace sparse_swa::detail {

namespace {

constexpr int kWarp = 32;

__device__ void flag(const MetadataKernelParams& p, uint32_t bit) { atomicOr(p.error_word, bit); }

constexpr unsigned kFullMask = 0xffffffffu;

// Request of real token t (t < query_start_loc[num_reqs]): the last r with qsl[r] <= t. A
// 32-ary search, one coalesced load per level, instead of log2(R) dependent loads. All 32 lanes
// must call it; every lane gets the same answer. Garbage in qsl still gives an r in [0, R).
__device__ int32_t warp_token_request(const int32_t* qsl, int32_t num_reqs, int32_t t, int lane) {
  int32_t lo = 0, hi = num_reqs;  // invariant: qsl[lo] <= t < qsl[hi]
  while (hi - lo > kWarp) {
    const int64_t span = hi - lo;
    const int32_t idx = lo + static_cast<int32_t>(span * lane / kWarp);
    const unsigned below = __ballot_sync(kFullMask, qsl[idx] <= t) | 1u;  // qsl[lo] <= t
    const int k = 31 - __clz(below);
    const int32_t next_lo = lo + static_cast<int32_t>(span * k / kWarp);
    hi = k == kWarp - 1 ? hi : lo + static_cast<int32_t>(span * (k + 1) / kWarp);
    lo = next_lo;
  }
  const int32_t idx = lo + lane;
  const unsigned below = __ballot_sync(kFullMask, idx < hi && qsl[idx] <= t) | 1u;
  return lo + 31 - __clz(below);
}

__device__ void write_invalid_row(int32_t* row, int32_t width, int32_t* len, int lane) {
  if (lane == 0) *len = 0;
  for (int32_t j = lane; j < width; j += kWarp) row[j] = -1;
}

// Slot of block id `block` at offset `off`; -1 (and *bad) when it is negative or past int32.
__device__ int32_t checked_slot(int32_t block, int32_t block_size, int32_t off, bool* bad) {
  const int64_t slot = static_cast<int64_t>(block) * block_size + off;
  if (slot >= 0 && slot <= INT_MAX) return static_cast<int32_t>(slot);
  *bad = true;
  return -1;
}

// row[j] = slot of position start + j for j < n, else -1; j < width. Returns true when a slot
// was out of range. Scalar form, for widths that are not a multiple of 4.
__device__ bool write_row_scalar(int32_t* row, int32_t width, int32_t n, int32_t start,
                                 const int32_t* bt_row, int32_t block_size, int lane) {
  bool bad = false;
  for (int32_t j = lane; j < width; j += kWarp) {
    int32_t value = -1;
    if (j < n) {
      const int32_t pos = start + j;
      const int32_t blk = pos / block_size;
      value = checked_slot(bt_row[blk], block_size, pos - blk * block_size, &bad);
    }
    row[j] = value;
  }
  return bad;
}

// Same with 16-byte stores: lane writes entries [4 * lane + 128 * k, +4); one division per 4
// entries. Needs width % 4 == 0 (then every row starts 16-byte aligned).
__device__ bool write_row_vec4(int32_t* row, int32_t width, int32_t n, int32_t start,
                               const int32_t* bt_row, int32_t block_size, int lane) {
  bool bad = false;
  for (int32_t j0 = 4 * lane; j0 < width; j0 += 4 * kWarp) {
    int32_t v[4] = {-1, -1, -1, -1};
    if (j0 < n) {
      const int32_t pos = start + j0;
      int32_t blk = pos / block_size;
      int32_t off = pos - blk * block_size;
      int32_t id = bt_row[blk];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (j0 + i < n) {
          if (off == block_size) {
            off = 0;
            id = bt_row[++blk];
          }
          v[i] = checked_slot(id, block_size, off, &bad);
          ++off;
        }
      }
    }
    *reinterpret_cast<int4*>(row + j0) = make_int4(v[0], v[1], v[2], v[3]);
  }
  return bad;
}

// One warp writes the row of token t.
__device__ void build_row(const MetadataKernelParams& p, int32_t t, int lane) {
  const int32_t td = p.num_decode_tokens;
  const bool decode = t < td;
  int32_t r;
  bool valid;
  if (p.update_only) {
    r = p.token_to_req[t];
    valid = p.is_valid[t] != 0;
  } else {
    const int64_t slot = p.slot_mapping[t];
    const bool padding = p.num_reqs == 0 || t >= p.query_start_loc[p.num_reqs];
    r = padding ? 0 : warp_token_request(p.query_start_loc, p.num_reqs, t, lane);
    valid = slot >= 0;
    if (lane == 0) {
      if (slot < -1) flag(p, kDeviceErrorSlotValue);
      if (slot != -1 && padding) flag(p, kDeviceErrorPaddingSlot);
    }
    if (padding) valid = false;
    if (lane == 0) {
      p.token_to_req[t] = r;
      p.is_valid[t] = valid ? 1 : 0;
    }
  }
  int32_t* row;
  int32_t width;
  int32_t* len;  // assigned below
  if (decode) {
    row = p.decode_rows + static_cast<int64_t>(t) * p.decode_width;
    width = p.decode_width;
    len = p.decode_lens + t;
  } else {
    row = p.prefill_rows + static_cast<int64_t>(t - td) * p.prefill_width;
    width = p.prefill_width;
    len = p.prefill_lens + (t - td);
  }
  if (p.num_reqs == 0) {  // every token is padding
    write_invalid_row(row, width, len, lane);
    return;
  }

  const int32_t qs = p.query_start_loc[r];
  const int32_t ql = p.query_start_loc[r + 1] - qs;
  const int32_t seq_len = p.seq_lens[r];
  const int32_t prefix = seq_len - ql;
  const int32_t pos = formulas::token_position(seq_len, qs, qs + ql, t);
  int32_t left = 0, right = 0;
  if (!p.update_only && p.with_image) {
    if (!decode) {
      const int32_t* indptr = p.spans;
      formulas::image_visibility(pos, p.spans + p.num_reqs + 1,
                                 p.spans + p.num_reqs + 1 + p.num_spans, indptr[r], indptr[r + 1],
                                 p.max_image_tokens, &left, &right);
    }
    if (lane == 0) {
      p.left_visible[t] = left;
      p.right_visible[t] = right;
    }
  }
  if (!valid) {
    write_invalid_row(row, width, len, lane);
    return;
  }
  const formulas::Window w = (decode && p.noncausal && !p.update_only)
                                 ? formulas::noncausal_window(prefix, seq_len, p.window)
                                 : formulas::causal_window(pos, p.window, left, right);
  const int32_t n = w.size();
  // Device inputs the host could not check: the row must fit its window and the table.
  const bool window_ok = ql >= 0 && prefix >= 0 && n >= 1 && n <= width && w.end <= seq_len;
  const bool table_ok = window_ok && (w.end - 1) / p.block_size < p.block_table_cols;
  if (!window_ok || !table_ok) {
    if (lane == 0) flag(p, window_ok ? kDeviceErrorBlockTable : kDeviceErrorWindow);
    write_invalid_row(row, width, len, lane);
    return;
  }
  const int32_t* bt_row = p.block_table + static_cast<int64_t>(r) * p.block_table_stride;
  const bool bad_slot = (width % 4 == 0)
                            ? write_row_vec4(row, width, n, w.start, bt_row, p.block_size, lane)
                            : write_row_scalar(row, width, n, w.start, bt_row, p.block_size, lane);
  if (bad_slot) flag(p, kDeviceErrorBlockTable | kDeviceErrorSlotOverflow);
  if (lane == 0) *len = n;
}

__global__ void __launch_bounds__(kMetadataKernelThreads)
    build_metadata_kernel(const MetadataKernelParams p) {
  const int lane = threadIdx.x % kWarp;
  const int warps_per_block = blockDim.x / kWarp;
  const int64_t total_warps = static_cast<int64_t>(gridDim.x) * warps_per_block;
  const int32_t rows = p.update_only ? p.num_decode_tokens : p.num_tokens;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * warps_per_block + threadIdx.x / kWarp;
       t < rows; t += total_warps) {
    build_row(p, static_cast<int32_t>(t), lane);
  }
  if (p.update_only) return;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t num_threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if (p.num_decode_tokens > 0) {
    // Zero [Td, capacity): a scalar head up to a multiple of 4, then 16-byte stores.
    const int64_t begin = p.num_decode_tokens, end = p.lens_capacity;
    const int64_t aligned = begin + 3 < end ? (begin + 3) / 4 * 4 : end;
    for (int64_t i = begin + tid; i < aligned; i += num_threads) p.decode_lens[i] = 0;
    const int64_t vectors = (end - aligned) / 4;
    int4* tail = reinterpret_cast<int4*>(p.decode_lens + aligned);
    for (int64_t i = tid; i < vectors; i += num_threads) tail[i] = make_int4(0, 0, 0, 0);
    for (int64_t i = aligned + vectors * 4 + tid; i < end; i += num_threads) p.decode_lens[i] = 0;
  }
  for (int64_t i = tid; i < p.num_prefills; i += num_threads) {
    const int32_t r = p.num_decodes + static_cast<int32_t>(i);
    const int32_t ql = p.query_start_loc[r + 1] - p.query_start_loc[r];
    p.gather_lens[i] = formulas::gather_len(ql, p.seq_lens[r] - ql, p.window);
  }
}

}  // namespace

int metadata_kernel_blocks(const MetadataKernelParams& p, int num_sms) {
  const int warps_per_block = kMetadataKernelThreads / kWarp;
  const int32_t rows = p.update_only ? p.num_decode_tokens : p.num_tokens;
  int64_t blocks = (static_cast<int64_t>(rows) + warps_per_block - 1) / warps_per_block;
  if (!p.update_only) {
    // The lens tail: about 4 elements per thread.
    const int64_t tail = p.num_decode_tokens > 0 ? p.lens_capacity - p.num_decode_tokens : 0;
    const int64_t tail_blocks =
        (tail + 4 * kMetadataKernelThreads - 1) / (4 * kMetadataKernelThreads);
    blocks = blocks > tail_blocks ? blocks : tail_blocks;
  }
  const int64_t cap = static_cast<int64_t>(num_sms) * 16;
  if (blocks > cap) blocks = cap;
  return blocks < 1 ? 1 : static_cast<int>(blocks);
}

cudaError_t launch_metadata_kernel(const MetadataKernelParams& p, int num_sms,
                                   cudaStream_t stream) {
  build_metadata_kernel<<<metadata_kernel_blocks(p, num_sms), kMetadataKernelThreads, 0, stream>>>(
      p);
  return cudaGetLastError();
}

}  // namespace sparse_swa::detail
