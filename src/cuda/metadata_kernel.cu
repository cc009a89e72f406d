// SPDX-License-Identifier: Apache-2.0
// The one per-step kernel of the CUDA metadata builder: every per-token output in one launch. A
// warp takes one decode token, one DSpark draft request (its rows are all alike) or a run of
// prefill tokens. A warp's rows cost two rounds of dependent loads: the request (hinted by the
// host split, all candidates' query ranges and seq_lens in one round) and its block ids (one per
// lane); everything else is arithmetic on registers and shuffles. The shared paths fall back to
// the per-token path for anything unusual; it writes the same values and flags device errors.
#include <cuda.h>
#include <cuda_runtime.h>

#include "common/swa_formulas.h"
#include "cuda/metadata_kernel.cuh"
#include "cuda/metadata_rows.cuh"

namespace sparse_swa::detail {

namespace {

using namespace rows;

// The request of token t: from the host split's hint when the device arrays confirm it, else
// searched. Writes token_to_req and is_valid; returns whether the token is valid. CUDA-graph
// padding tokens (*padding) map to request 0 in a build and to the last request in a draft
// update (docs/semantics.md#draft-update), with an empty query range.
__device__ bool map_token(const MetadataKernelParams& p, int32_t t, int lane, TokenRequest* q,
                          bool* padding) {
  const int64_t slot = p.slot_mapping[t];
  *padding = p.num_reqs == 0 || t >= __ldg(p.query_start_loc + p.num_reqs);
  const bool found = p.num_reqs > 0 && find_by_host_split(p, t, lane, q);
  if (!*padding && !found) *q = search_request(p, t, lane);
  if (*padding) {
    *q = TokenRequest{};
    if (p.update_only && p.num_reqs > 0) q->r = p.num_reqs - 1;
  }
  const bool valid = !*padding && slot >= 0;
  if (lane == 0) {
    if (slot < -1) flag(p, kDeviceErrorSlotValue);
    if (slot != -1 && *padding) flag(p, kDeviceErrorPaddingSlot);
    p.token_to_req[t] = q->r;
    p.is_valid[t] = valid ? 1 : 0;
  }
  return valid;
}

// The FlashInfer decode lens of decode token t of request r with `lens` valid entries (lane 0).
__device__ void write_flashinfer_lens(const MetadataKernelParams& p, int32_t t, int32_t r,
                                      int32_t seq_len, int32_t lens) {
  if (p.flashinfer_topk_lens == nullptr) return;
  p.flashinfer_topk_lens[t] = max(lens, p.window);
  p.flashinfer_seq_lens[t] = seq_len;
}

// One warp writes the row of token t.
__device__ void build_row(const MetadataKernelParams& p, int32_t t, int lane) {
  const int32_t td = p.num_decode_tokens;
  const bool decode = t < td;
  TokenRequest q;
  bool padding = false;
  const bool valid = map_token(p, t, lane, &q, &padding);
  int32_t* row;
  int32_t width;
  int32_t* len;  // assigned below
  if (decode) {
    row = p.decode_rows + static_cast<int64_t>(t) * p.decode_width;
    width = p.decode_width;
    len = p.decode_lens + t;
    if (lane == 0 && p.flashinfer_topk_lens != nullptr) {
      // Padding tokens: seq_lens of the request they map to. Rewritten below for valid rows.
      const int32_t seq = padding ? (p.num_reqs > 0 ? __ldg(p.seq_lens + q.r) : 0) : q.seq_len;
      write_flashinfer_lens(p, t, q.r, seq, 0);
    }
  } else {
    row = p.prefill_rows + static_cast<int64_t>(t - td) * p.prefill_width;
    width = p.prefill_width;
    len = p.prefill_lens + (t - td);
  }
  const int32_t ql = q.query_end - q.query_start;
  const int32_t prefix = q.seq_len - ql;
  const int32_t pos = formulas::token_position(q.seq_len, q.query_start, q.query_end, t);
  int32_t left = 0, right = 0;
  if (!p.update_only && p.with_image) {
    // Padding tokens lie past every span of their request 0: visibility 0.
    if (!decode && !padding) {
      const int32_t* indptr = p.spans;
      formulas::image_visibility(pos, p.spans + p.num_reqs + 1,
                                 p.spans + p.num_reqs + 1 + p.num_spans, indptr[q.r],
                                 indptr[q.r + 1], p.max_image_tokens, &left, &right);
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
  // DSpark non-causal rows ignore replay_start: they sit above the replayed window.
  const formulas::Window w = (decode && p.noncausal)
                                 ? formulas::noncausal_window(prefix, q.seq_len, p.window)
                                 : formulas::causal_window(pos, p.window, left, right, q.replay);
  const int32_t n = w.size();
  // Device inputs the host could not check: the row must fit its window and the table.
  const bool window_ok = ql >= 0 && prefix >= 0 && n >= 1 && n <= width && w.end <= q.seq_len;
  const BlockSize bs{p.block_size, p.block_shift};
  const bool table_ok = window_ok && bs.block(w.end - 1) < p.block_table_cols;
  if (!window_ok || !table_ok) {
    if (lane == 0) flag(p, window_ok ? kDeviceErrorBlockTable : kDeviceErrorWindow);
    write_invalid_row(row, width, len, lane);
    return;
  }
  const int32_t* bt_row = p.block_table + static_cast<int64_t>(q.r) * p.block_table_stride;
  const RowBlocks blocks = load_row_blocks(bt_row, bs.block(w.start), bs.block(w.end - 1), lane);
  if (write_row(row, width, n, w.start, blocks, bs, lane)) {
    flag(p, kDeviceErrorBlockTable | kDeviceErrorSlotOverflow);
  }
  if (lane == 0) {
    *len = n;
    if (decode) write_flashinfer_lens(p, t, q.r, q.seq_len, n);
  }
}

// DSpark draft rows: every token of a request has the same non-causal window, so one warp takes a
// whole request (q <= 32 tokens, the decodes' shared query length), computes the row once and
// stores it for each valid token. Returns false, having written nothing, when anything differs
// from that common case; the per-token path then writes the same values (and flags errors).
__device__ bool build_draft_request(const MetadataKernelParams& p, int32_t t0, int32_t count,
                                    int lane) {
  const int64_t slot = lane < count ? p.slot_mapping[t0 + lane] : 0;
  const int32_t num_real = __ldg(p.query_start_loc + p.num_reqs);
  TokenRequest q;
  const bool found = find_by_host_split(p, t0, lane, &q);
  if (!found || t0 + count > num_real || q.query_start != t0 || q.query_end != t0 + count) {
    return false;
  }
  const int32_t ql = count, prefix = q.seq_len - ql;
  const formulas::Window w = formulas::noncausal_window(prefix, q.seq_len, p.window);
  const int32_t n = w.size(), width = p.decode_width;
  const BlockSize bs{p.block_size, p.block_shift};
  if (prefix < 0 || n < 1 || n > width || w.end > q.seq_len ||
      bs.block(w.end - 1) >= p.block_table_cols || width % 4 != 0 || bs.shift < 2) {
    return false;
  }
  const int32_t* bt_row = p.block_table + static_cast<int64_t>(q.r) * p.block_table_stride;
  const RowBlocks blocks = load_row_blocks(bt_row, bs.block(w.start), bs.block(w.end - 1), lane);
  if (!blocks.in_lanes) return false;
  const bool mine = lane < count;
  const unsigned valid = __ballot_sync(kFullWarpMask, mine && slot >= 0);
  bool bad = false;
  for (int32_t base = 0; base < width; base += 4 * kWarpSize) {
    const int32_t j0 = base + 4 * lane;
    const int4 v = row_chunk(j0, n, w.start, blocks, bs, &bad);
    if (j0 >= width) continue;
    for (int32_t j = 0; j < count; ++j) {
      int4* out =
          reinterpret_cast<int4*>(p.decode_rows + static_cast<int64_t>(t0 + j) * width + j0);
      *out = (valid >> j) & 1u ? v : make_int4(-1, -1, -1, -1);
    }
  }
  if (bad && valid != 0) flag(p, kDeviceErrorBlockTable | kDeviceErrorSlotOverflow);
  if (mine) {
    if (slot < -1) flag(p, kDeviceErrorSlotValue);
    p.token_to_req[t0 + lane] = q.r;
    p.is_valid[t0 + lane] = slot >= 0 ? 1 : 0;
    p.decode_lens[t0 + lane] = slot >= 0 ? n : 0;
    write_flashinfer_lens(p, t0 + lane, q.r, q.seq_len, slot >= 0 ? n : 0);
  }
  return true;
}

// Prefill tokens: a warp takes kPrefillRun consecutive tokens; those of the first token's request
// share its lookup and one load of its block ids, and each row is then arithmetic and one store
// per lane. Returns how many leading tokens it wrote (0: none; the per-token path takes the rest).
// 4 measured best for 8 x 1024 prefill tokens on the H200 (2: 4.4 us, 4: 3.85 us, 8: 4.15 us).
constexpr int32_t kPrefillRun = 4;

__device__ int32_t build_prefill_run(const MetadataKernelParams& p, int32_t t0, int32_t size,
                                     int lane) {
  const int64_t slot = lane < size ? p.slot_mapping[t0 + lane] : 0;
  const int32_t num_real = __ldg(p.query_start_loc + p.num_reqs);
  TokenRequest q;
  const bool found = find_by_host_split(p, t0, lane, &q);
  if (p.num_reqs == 0 || t0 >= num_real) return 0;
  if (!found) q = search_request(p, t0, lane);
  const int32_t count = min(size, q.query_end - t0);
  const int32_t ql = q.query_end - q.query_start, prefix = q.seq_len - ql;
  const int32_t width = p.prefill_width;
  const BlockSize bs{p.block_size, p.block_shift};
  const int32_t pos0 = q.seq_len - ql + (t0 - q.query_start);
  const int32_t rs = q.replay;
  const formulas::Window first = formulas::causal_window(pos0, p.window, 0, 0, rs);
  const formulas::Window last = formulas::causal_window(pos0 + count - 1, p.window, 0, 0, rs);
  if (count < 1 || ql < 0 || prefix < 0 || rs < 0 || rs > prefix || last.size() > width ||
      last.end > q.seq_len || bs.block(last.end - 1) >= p.block_table_cols || width % 4 != 0 ||
      bs.shift < 2) {
    return 0;
  }
  const int32_t* bt_row = p.block_table + static_cast<int64_t>(q.r) * p.block_table_stride;
  const RowBlocks blocks =
      load_row_blocks(bt_row, bs.block(first.start), bs.block(last.end - 1), lane);
  if (!blocks.in_lanes) return 0;
  const bool mine = lane < count;
  const unsigned valid = __ballot_sync(kFullWarpMask, mine && slot >= 0);
  const int32_t row0 = t0 - p.num_decode_tokens;
  bool bad = false;
  for (int32_t j = 0; j < count; ++j) {
    const formulas::Window w = formulas::causal_window(pos0 + j, p.window, 0, 0, rs);
    const bool row_valid = (valid >> j) & 1u;
    int32_t* row = p.prefill_rows + static_cast<int64_t>(row0 + j) * width;
    for (int32_t base = 0; base < width; base += 4 * kWarpSize) {
      const int32_t j0 = base + 4 * lane;
      const int4 v = row_chunk(j0, row_valid ? w.size() : 0, w.start, blocks, bs, &bad);
      if (j0 < width) *reinterpret_cast<int4*>(row + j0) = v;
    }
  }
  if (bad) flag(p, kDeviceErrorBlockTable | kDeviceErrorSlotOverflow);
  if (mine) {
    if (slot < -1) flag(p, kDeviceErrorSlotValue);
    p.token_to_req[t0 + lane] = q.r;
    p.is_valid[t0 + lane] = slot >= 0 ? 1 : 0;
    p.prefill_lens[row0 + lane] =
        slot >= 0 ? formulas::causal_window(pos0 + lane, p.window, 0, 0, rs).size() : 0;
  }
  return count;
}

// Work units: the decode tokens in groups of draft_group(p) (whole DSpark draft requests, else one
// token), then the prefill tokens in runs of prefill_run(p).
__host__ __device__ inline int32_t draft_group(const MetadataKernelParams& p) {
  // With images the per-token path also writes the decode tokens' (zero) visibility.
  const bool drafts = !p.update_only && !p.with_image && p.noncausal && p.decode_query_len >= 2 &&
                      p.decode_query_len <= 32;
  return drafts ? p.decode_query_len : 1;
}

__host__ __device__ inline int32_t prefill_run(const MetadataKernelParams& p) {
  return p.update_only || p.with_image ? 1 : kPrefillRun;
}

__host__ __device__ inline int32_t num_units(const MetadataKernelParams& p) {
  const int32_t g = draft_group(p), run = prefill_run(p);
  const int32_t prefill_rows = p.update_only ? 0 : p.num_tokens - p.num_decode_tokens;
  return (p.num_decode_tokens + g - 1) / g + (prefill_rows + run - 1) / run;
}

__device__ void build_unit(const MetadataKernelParams& p, int32_t unit, int lane) {
  const int32_t g = draft_group(p);
  const int32_t decode_units = (p.num_decode_tokens + g - 1) / g;
  if (unit >= decode_units) {
    const int32_t run = prefill_run(p);
    const int32_t t0 = p.num_decode_tokens + (unit - decode_units) * run;
    const int32_t size = min(run, p.num_tokens - t0);
    const int32_t done = size > 1 ? build_prefill_run(p, t0, size, lane) : 0;
    for (int32_t t = t0 + done; t < t0 + size; ++t) build_row(p, t, lane);
    return;
  }
  const int32_t t0 = unit * g;
  const int32_t count = min(g, p.num_decode_tokens - t0);
  if (g > 1 && build_draft_request(p, t0, count, lane)) return;
  for (int32_t t = t0; t < t0 + count; ++t) build_row(p, t, lane);
}

// Everything of a step but its rows, for all of the grid's threads: the lens tail (stores that
// need not wait), the per-request replay_start copies and checks, a draft update's validity, the
// gather lens (a round of loads) by the grid's last threads, which have no rows unless the grid
// is capped (metadata_kernel_blocks adds a block for them).
__device__ void write_step_arrays(const MetadataKernelParams& p, int32_t tid, int32_t num_threads) {
  if (!p.update_only && p.num_decode_tokens > 0) {
    // Zero [Td, capacity): a scalar head up to a multiple of 4, then 16-byte stores.
    const int32_t begin = p.num_decode_tokens, end = p.lens_capacity;
    const int32_t aligned = begin + 3 < end ? (begin + 3) / 4 * 4 : end;
    for (int32_t i = begin + tid; i < aligned; i += num_threads) p.decode_lens[i] = 0;
    const int32_t vectors = (end - aligned) / 4;
    int4* tail = reinterpret_cast<int4*>(p.decode_lens + aligned);
    for (int32_t i = tid; i < vectors; i += num_threads) tail[i] = make_int4(0, 0, 0, 0);
    for (int32_t i = aligned + vectors * 4 + tid; i < end; i += num_threads) p.decode_lens[i] = 0;
  }
  // Per request: a build copies replay_start (or zeros) to its two buffers; both check it.
  for (int32_t r = tid; r < p.num_reqs && (p.check_replay || !p.update_only); r += num_threads) {
    const int32_t rs = p.replay_start != nullptr ? p.replay_start[r] : 0;
    if (!p.update_only) p.replay_out[r] = p.build_replay[r] = rs;
    if (p.check_replay) {
      const int32_t ql = p.query_start_loc[r + 1] - p.query_start_loc[r];
      if (rs < 0 || rs > p.seq_lens[r] - ql) flag(p, kDeviceErrorReplayStart);
    }
  }
  if (p.update_only) {
    // Validity of the tokens past the decode rows (the row warps write the decode tokens').
    const int32_t num_real = p.num_reqs > 0 ? p.query_start_loc[p.num_reqs] : 0;
    for (int32_t t = p.num_decode_tokens + tid; t < p.num_tokens; t += num_threads) {
      const int64_t slot = p.slot_mapping[t];
      if (slot < -1) flag(p, kDeviceErrorSlotValue);
      if (slot != -1 && t >= num_real) flag(p, kDeviceErrorPaddingSlot);
      p.is_valid[t] = slot >= 0 && t < num_real ? 1 : 0;
    }
  }
  for (int32_t i = num_threads - 1 - tid; !p.update_only && i < p.num_prefills; i += num_threads) {
    const int32_t r = p.num_decodes + i;
    const int32_t ql = p.query_start_loc[r + 1] - p.query_start_loc[r];
    const int32_t rs = p.replay_start != nullptr ? p.replay_start[r] : 0;
    p.gather_lens[i] = formulas::gather_len(ql, p.seq_lens[r] - ql, p.window, rs);
  }
}

__global__ void __launch_bounds__(kMetadataKernelThreads)
    build_metadata_kernel(const MetadataKernelParams p) {
  // Indices fit int32: rows <= max_num_batched_tokens, the grid is capped (metadata_kernel_blocks).
  const int lane = threadIdx.x % kWarpSize;
  const int32_t warps_per_block = blockDim.x / kWarpSize;
  const int32_t total_warps = gridDim.x * warps_per_block;
  const int32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
  const int32_t num_threads = gridDim.x * blockDim.x;
  write_step_arrays(p, tid, num_threads);
  const int32_t units = num_units(p);
  for (int32_t u = blockIdx.x * warps_per_block + threadIdx.x / kWarpSize; u < units;
       u += total_warps) {
    build_unit(p, u, lane);
  }
}

// Several steps (build_groups): each group's arrays by every thread, then the groups' work units
// one after the other over the grid's warps. The parameters stay in the parameter space
// (__grid_constant__): a group's are read where they lie, never copied per thread.
__global__ void __launch_bounds__(kMetadataKernelThreads)
    build_metadata_groups_kernel(const __grid_constant__ MetadataGroupParams gp) {
  const int lane = threadIdx.x % kWarpSize;
  const int32_t warps_per_block = blockDim.x / kWarpSize;
  const int32_t total_warps = gridDim.x * warps_per_block;
  const int32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
  const int32_t num_threads = gridDim.x * blockDim.x;
  for (int32_t g = 0; g < gp.num_groups; ++g) write_step_arrays(gp.groups[g], tid, num_threads);
  const int32_t units = gp.unit_end[gp.num_groups - 1];
  for (int32_t u = blockIdx.x * warps_per_block + threadIdx.x / kWarpSize; u < units;
       u += total_warps) {
    int32_t g = 0;
    while (u >= gp.unit_end[g]) ++g;  // warp-uniform: u is the warp's
    build_unit(gp.groups[g], u - (g > 0 ? gp.unit_end[g - 1] : 0), lane);
  }
}

}  // namespace

cudaError_t init_metadata_kernel_launcher(int device, MetadataKernelLauncher* launcher) {
  int sms = 0, per_sm = 0;
  cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) {
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, build_metadata_kernel,
                                                        kMetadataKernelThreads, 0);
  }
  if (err != cudaSuccess) return err;
  launcher->resident_blocks = sms * per_sm > 0 ? sms * per_sm : 1;
  // The driver's cuLaunchKernel on the kernel's cached handle skips the runtime's per-launch
  // lookup (about 0.5 us of host time per step on the H200 host); without it, <<<>>> is used.
  cudaFunction_t function = nullptr, groups_function = nullptr;
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetFuncBySymbol(&function, reinterpret_cast<const void*>(build_metadata_kernel)) ==
          cudaSuccess &&
      cudaGetFuncBySymbol(&groups_function, reinterpret_cast<const void*>(
                                                build_metadata_groups_kernel)) == cudaSuccess &&
      cudaGetDriverEntryPointByVersion("cuLaunchKernel", &entry, 12000, cudaEnableDefault,
                                       &found) == cudaSuccess &&
      found == cudaDriverEntryPointSuccess) {
    launcher->function = function;
    launcher->groups_function = groups_function;
    launcher->cu_launch_kernel = entry;
  }
  cudaGetLastError();  // a failed lookup only means the runtime launch path
  return cudaSuccess;
}

namespace {

// Blocks for `units` work units (a warp each) and the other work of steps `p[0, n)`.
int blocks_for(const MetadataKernelParams* p, int n, int64_t units, int resident_blocks) {
  const int warps_per_block = kMetadataKernelThreads / kWarpSize;
  int64_t blocks = (units + warps_per_block - 1) / warps_per_block;
  bool prefills = false;
  int64_t tail_blocks = 0;
  for (int g = 0; g < n; ++g) {
    if (p[g].update_only) continue;
    prefills = prefills || p[g].num_prefills > 0;
    // The lens tail: about 4 entries per thread (64 per thread, in one block, made a one-token
    // step 0.6 us slower).
    const int64_t tail =
        p[g].num_decode_tokens > 0 ? p[g].lens_capacity - p[g].num_decode_tokens : 0;
    const int64_t needed = (tail + 4 * kMetadataKernelThreads - 1) / (4 * kMetadataKernelThreads);
    tail_blocks = needed > tail_blocks ? needed : tail_blocks;
  }
  if (prefills) ++blocks;  // a block free of rows for the gather lens
  blocks = blocks > tail_blocks ? blocks : tail_blocks;
  // Up to four waves: more rows in flight hide the rows' load latency better than warps looping.
  if (blocks > 4 * int64_t{resident_blocks}) blocks = 4 * int64_t{resident_blocks};
  return blocks < 1 ? 1 : static_cast<int>(blocks);
}

using CuLaunchKernel = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    unsigned, unsigned, CUstream, void**, void**);

}  // namespace

int metadata_kernel_blocks(const MetadataKernelParams& p, int resident_blocks) {
  return blocks_for(&p, 1, num_units(p), resident_blocks);
}

cudaError_t launch_metadata_kernel(const MetadataKernelParams& p,
                                   const MetadataKernelLauncher& launcher, cudaStream_t stream) {
  const unsigned blocks = metadata_kernel_blocks(p, launcher.resident_blocks);
  if (launcher.cu_launch_kernel != nullptr) {
    void* args[] = {const_cast<MetadataKernelParams*>(&p)};
    const CUresult result = reinterpret_cast<CuLaunchKernel>(launcher.cu_launch_kernel)(
        static_cast<CUfunction>(launcher.function), blocks, 1, 1, kMetadataKernelThreads, 1, 1, 0,
        reinterpret_cast<CUstream>(stream), args, nullptr);
    // The runtime's error codes equal the driver's for every error a launch can return.
    return static_cast<cudaError_t>(result);
  }
  build_metadata_kernel<<<blocks, kMetadataKernelThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_metadata_groups_kernel(MetadataGroupParams* gp,
                                          const MetadataKernelLauncher& launcher,
                                          cudaStream_t stream) {
  int64_t units = 0;
  for (int32_t g = 0; g < gp->num_groups; ++g) {
    units += num_units(gp->groups[g]);
    if (units > INT32_MAX) return cudaErrorInvalidValue;  // groups x max_num_batched_tokens
    gp->unit_end[g] = static_cast<int32_t>(units);
  }
  const unsigned blocks = blocks_for(gp->groups, gp->num_groups, units, launcher.resident_blocks);
  if (launcher.cu_launch_kernel != nullptr) {
    void* args[] = {gp};
    const CUresult result = reinterpret_cast<CuLaunchKernel>(launcher.cu_launch_kernel)(
        static_cast<CUfunction>(launcher.groups_function), blocks, 1, 1, kMetadataKernelThreads, 1,
        1, 0, reinterpret_cast<CUstream>(stream), args, nullptr);
    return static_cast<cudaError_t>(result);
  }
  build_metadata_groups_kernel<<<blocks, kMetadataKernelThreads, 0, stream>>>(*gp);
  return cudaGetLastError();
}

}  // namespace sparse_swa::detail
