#include <cuda_runtime.h>

#include <climits>

#include "common/swa_formulas.h"
#include "cuda/metadata_kernel.cuh"

namespace sparse_swa::detail {

namespace {

constexpr int kWarp = 32;

__device__ void flag(const MetadataKernelParams& p, uint32_t bit) { atomicOr(p.error_word, bit); }

__device__ void write_invalid_row(int32_t* row, int32_t width, int32_t* len, int lane) {
  if (lane == 0) *len = 0;
  for (int32_t j = lane; j < width; j += kWarp) row[j] = -1;
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
    r = formulas::token_request(p.query_start_loc, p.num_reqs, t);
    const int64_t slot = p.slot_mapping[t];
    valid = slot >= 0;
    if (lane == 0) {
      if (slot < -1) flag(p, kDeviceErrorSlotValue);
      if (slot != -1 && (p.num_reqs == 0 || t >= p.query_start_loc[p.num_reqs])) {
        flag(p, kDeviceErrorPaddingSlot);
      }
    }
    if (p.num_reqs == 0 || t >= p.query_start_loc[p.num_reqs]) valid = false;
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
  const int32_t pos = prefix + (t - qs);
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
  bool bad_slot = false;
  for (int32_t j = lane; j < width; j += kWarp) {
    int32_t value = -1;
    if (j < n) {
      const int64_t slot = formulas::slot_id(bt_row, p.block_size, w.start + j);
      if (slot >= 0 && slot <= INT_MAX) {
        value = static_cast<int32_t>(slot);
      } else {
        bad_slot = true;
      }
    }
    row[j] = value;
  }
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
    for (int64_t i = p.num_decode_tokens + tid; i < p.lens_capacity; i += num_threads) {
      p.decode_lens[i] = 0;
    }
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
