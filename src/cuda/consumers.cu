// SPDX-License-Identifier: Apache-2.0
// CUDA versions of the index consumers (src/cpu/: the reference they match bit for bit).
// One warp per output row; every read is bounds-checked against the shapes the host checked, and
// a row whose metadata is inconsistent (the CPU reports an error) becomes -1 with lens 0, so no
// input value can make a kernel fault. Launchers enqueue on the caller's stream and never sync.
#include <cuda_runtime.h>

#include <cub/block/block_scan.cuh>

#include "backend.h"
#include "common/mixed_relayout.h"
#include "common/swa_formulas.h"
#include "cuda/cuda_utils.h"

namespace sparse_swa::detail {

namespace {

constexpr int kWarp = kWarpSize;
constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / kWarp;

// Plain-pointer copies of the views a kernel reads.
struct Mat {
  const int32_t* data;
  int64_t rows, cols, stride;
};
struct OutRows {
  int32_t* data;
  int32_t* lens;
  int32_t width;
  int64_t stride;
};
struct TokenInfo {  // the step's per-token arrays
  const int32_t* token_to_req;
  const uint8_t* is_valid;
  int32_t num_reqs;
};
struct Cache {
  Mat table;
  int32_t block_size;
  int32_t ratio;
};
struct Step {
  TokenInfo tokens;
  const int32_t* qsl;
  const int32_t* seq_lens;
  Mat block_table;
  int32_t block_size;
  int32_t window;
  const int32_t* left_visible;  // null without image widening
  const int32_t* right_visible;
  const int32_t* replay_start;  // [>= num_reqs], null without bounded replay (all 0)
};

Mat mat(const MatrixView<const int32_t>& m) { return {m.data, m.rows, m.cols, m.stride}; }
OutRows out_rows(const IndexView& v) { return {v.data, v.lens, v.width, v.row_stride}; }
Cache cache_of(const CompressedCache& c) {
  return {mat(c.block_table), c.block_size, c.compress_ratio};
}
Step step_of(const ConsumerStep& s) {
  const SwaMetadata& md = s.md;
  return {{md.token_to_req_indices.data(), md.is_valid_token.data(), md.num_reqs},
          s.batch.query_start_loc.data(),
          s.batch.seq_lens.data(),
          mat(s.batch.block_table),
          s.block_size,
          md.window_size,
          md.has_image() ? md.left_visible.data() : nullptr,
          md.has_image() ? md.right_visible.data() : nullptr,
          md.replay_start.empty() ? nullptr : md.replay_start.data()};
}

int blocks_for(int64_t rows) {
  return static_cast<int>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

// The request of token t, or -1 for an invalid token or an out-of-range mapping.
__device__ int32_t valid_request(const TokenInfo& ti, int32_t t) {
  if (!ti.is_valid[t]) return -1;
  const int32_t r = ti.token_to_req[t];
  return r >= 0 && r < ti.num_reqs ? r : -1;
}

// host_global_slot's rule: -1 for a negative or out-of-table index or a negative block id.
__device__ int32_t global_slot(const Cache& c, int32_t r, int32_t l) {
  if (l < 0) return -1;
  const int64_t blk = l / c.block_size;
  if (blk >= c.table.cols) return -1;
  const int64_t id = c.table.data[r * c.table.stride + blk];
  if (id < 0) return -1;
  const int64_t g = id * c.block_size + l % c.block_size;
  return g > kInt32Max ? -1 : static_cast<int32_t>(g);
}

__device__ void write_empty_row(const OutRows& out, int64_t i, int lane) {
  int32_t* row = out.data + i * out.stride;
  for (int32_t j = lane; j < out.width; j += kWarp) row[j] = -1;
  if (lane == 0) out.lens[i] = 0;
}

struct TokenWindow {
  bool ok;
  int32_t pos;
  int32_t seq_len;
  formulas::Window window;
};

// host_token_window's checks as a warp vote: any failure gives ok = false. The causal window
// starts no earlier than the request's replay_start (docs/semantics.md#bounded-replay).
__device__ TokenWindow token_window(const Step& s, int32_t t, int32_t r, bool check_blocks,
                                    int lane) {
  TokenWindow tw{false, 0, 0, {0, 0}};
  const int32_t qs = s.qsl[r], qe = s.qsl[r + 1];
  tw.seq_len = s.seq_lens[r];
  const int64_t prefix = int64_t{tw.seq_len} - (qe - qs);
  if (t < qs || t >= qe || prefix < 0) return tw;
  tw.pos = static_cast<int32_t>(prefix + (t - qs));
  int32_t left = 0, right = 0;
  if (s.left_visible != nullptr) {
    left = s.left_visible[t];
    right = s.right_visible[t];
    if (left < 0 || right < 0) return tw;
  }
  // Bounded replay: the CPU's error for a start outside [0, prefix] masks the row here.
  const int32_t replay = s.replay_start != nullptr ? s.replay_start[r] : 0;
  if (replay < 0 || replay > prefix) return tw;
  tw.window = formulas::causal_window(tw.pos, s.window, left, right, replay);
  if (tw.window.end > tw.seq_len) return tw;
  bool bad = false;
  if (check_blocks) {
    const int64_t first = tw.window.start / s.block_size;
    const int64_t last = (tw.window.end - 1) / s.block_size;
    for (int64_t blk = first + lane; blk <= last; blk += kWarp) {
      if (blk >= s.block_table.cols) {
        bad = true;
        break;
      }
      const int64_t id = s.block_table.data[r * s.block_table.stride + blk];
      if (id < 0 || id * s.block_size + (s.block_size - 1) > kInt32Max) bad = true;
    }
  }
  tw.ok = !__any_sync(kFullWarpMask, bad);
  return tw;
}

// ---------------------------------------------------------------- compressed top-k

__global__ void compressed_topk_kernel(TokenInfo ti, int32_t first_token, Mat local, Cache cache,
                                       OutRows out) {
  const int64_t i = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (i >= local.rows) return;
  const int32_t r = valid_request(ti, first_token + static_cast<int32_t>(i));
  if (r < 0) return write_empty_row(out, i, lane);
  int32_t* row = out.data + i * out.stride;
  const int32_t* in = local.data + i * local.stride;
  int32_t count = 0;
  for (int32_t j = lane; j < out.width; j += kWarp) {
    const int32_t g = j < local.cols ? global_slot(cache, r, in[j]) : -1;
    row[j] = g;
    count += g >= 0;
  }
  count = warp_sum(count);
  if (lane == 0) out.lens[i] = count;
}

__global__ void copy_global_kernel(TokenInfo ti, int32_t first_token, Mat global,
                                   const int32_t* global_lens, OutRows out) {
  const int64_t i = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (i >= global.rows) return;
  if (!ti.is_valid[first_token + i]) return write_empty_row(out, i, lane);  // no mapping read
  const int32_t len = min(max(global_lens[i], 0), static_cast<int32_t>(global.cols));
  int32_t* row = out.data + i * out.stride;
  for (int32_t j = lane; j < out.width; j += kWarp) {
    row[j] = j < len ? global.data[i * global.stride + j] : -1;
  }
  if (lane == 0) out.lens[i] = len;
}

// ---------------------------------------------------------------- mixed matrix

struct MixedParams {
  Step step;
  int32_t num_tokens;
  int32_t num_decode_tokens;
  Mat decode_rows;  // [Td, decode width]
  const int32_t* decode_lens;
  Cache cache;
  Mat decode_local;   // cols 0 when absent
  Mat decode_global;  // cols 0 when absent
  const int32_t* decode_global_lens;
  Mat prefill_local;  // cols 0 when absent
  int32_t swa_width;  // S
  bool relaid;        // decode rows are non-causal and re-laid (MixedMatrixForm::kFlashInferSm100)
  OutRows out;
  int32_t* swa_lens;  // null when not requested
};

// host_relaid_row's checks: ok = false where the CPU reports an error.
struct DeviceRelaid {
  bool ok;
  formulas::RelaidRow row;
};
__device__ DeviceRelaid device_relaid_row(const MixedParams& p, int32_t t, int32_t r) {
  DeviceRelaid d{false, {0, 0}};
  const int64_t qs = p.step.qsl[r], qe = p.step.qsl[r + 1];
  const int64_t ql = qe - qs, ctx = int64_t{p.step.seq_lens[r]} - ql;
  if (t < qs || t >= qe || ctx < 0) return d;
  d.row = formulas::relaid_row(ctx, ql, t - qs, p.step.window);
  d.ok = p.decode_lens[t] == d.row.row_entries() && d.row.row_entries() <= p.decode_rows.cols &&
         d.row.compressed_start(p.step.window) <= p.swa_width;
  return d;
}

__global__ void mixed_matrix_kernel(MixedParams p) {
  const int64_t t64 = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (t64 >= p.num_tokens) return;
  const int32_t t = static_cast<int32_t>(t64);
  const int32_t s = p.swa_width;
  int32_t* row = p.out.data + t64 * p.out.stride;
  int32_t r = valid_request(p.step.tokens, t);
  const bool decode = t < p.num_decode_tokens;
  TokenWindow tw{};
  DeviceRelaid relaid{false, {0, 0}};
  if (r >= 0 && !decode) {
    tw = token_window(p.step, t, r, /*check_blocks=*/true, lane);
    if (!tw.ok || tw.window.size() > s) r = -1;
  }
  if (r >= 0 && decode && p.relaid) {
    relaid = device_relaid_row(p, t, r);
    if (!relaid.ok) r = -1;
  }
  if (r < 0) {
    write_empty_row(p.out, t64, lane);
    if (lane == 0 && p.swa_lens != nullptr) p.swa_lens[t] = 0;
    return;
  }
  int32_t swa_count, compressed_count = 0;
  // cs: where the compressed entries start (S, or W + spill for a re-laid row; <= S, checked).
  int32_t cs = s;
  if (decode) {
    const int32_t* src = p.decode_rows.data + t64 * p.decode_rows.stride;
    const int32_t* local = p.decode_local.data + t64 * p.decode_local.stride;
    const int32_t* global = p.decode_global.data + t64 * p.decode_global.stride;
    const int32_t glen = p.decode_global.cols > 0 ? min(max(p.decode_global_lens[t], 0),
                                                        static_cast<int32_t>(p.decode_global.cols))
                                                  : 0;
    if (p.relaid) cs = static_cast<int32_t>(relaid.row.compressed_start(p.step.window));
    int32_t count = 0;
    for (int32_t j = lane; j < p.out.width; j += kWarp) {
      int32_t v = -1;
      if (j < cs) {
        if (p.relaid) {
          const int64_t from = formulas::relaid_source(j, p.step.window, relaid.row);
          v = from < 0 ? -1 : src[from];
        } else {
          v = j < p.decode_rows.cols ? src[j] : -1;
        }
      } else if (j - cs < p.decode_local.cols) {
        v = global_slot(p.cache, r, local[j - cs]);
        count += v >= 0;
      } else if (j - cs < glen) {
        v = global[j - cs];
      }
      row[j] = v;
    }
    compressed_count = p.decode_local.cols > 0 ? warp_sum(count) : glen;
    swa_count = min(max(p.decode_lens[t], 0), static_cast<int32_t>(p.decode_rows.cols));
  } else {
    const int32_t* bt = p.step.block_table.data + r * p.step.block_table.stride;
    swa_count = tw.window.size();
    if (p.cache.ratio > 1) {
      compressed_count = static_cast<int32_t>(
          min(static_cast<int64_t>((tw.pos + 1) / p.cache.ratio), p.prefill_local.cols));
    }
    const int32_t* local =
        p.prefill_local.data + (t64 - p.num_decode_tokens) * p.prefill_local.stride;
    for (int32_t j = lane; j < p.out.width; j += kWarp) {
      int32_t v = -1;
      if (j < swa_count) {
        v = static_cast<int32_t>(formulas::slot_id(bt, p.step.block_size, tw.window.start + j));
      } else if (j >= s && j - s < compressed_count) {
        v = global_slot(p.cache, r, local[j - s]);
      }
      row[j] = v;
    }
  }
  if (lane == 0) {
    p.out.lens[t] = cs + compressed_count;
    if (p.swa_lens != nullptr) p.swa_lens[t] = swa_count;
  }
}

// ---------------------------------------------------------------- combined prefill

struct CombineParams {
  Step step;
  CombineChunk chunk;
  int32_t num_decodes;
  int32_t num_decode_tokens;
  const int32_t* gather_lens;  // [num_prefills]
  Mat prefill_local;           // cols == chunk.topk
  OutRows out;
};

__global__ void combined_prefill_kernel(CombineParams p) {
  const int64_t i = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (i >= p.chunk.rows) return;
  const int32_t t = p.chunk.first_token + static_cast<int32_t>(i);
  const int32_t r = valid_request(p.step.tokens, t);
  const int32_t b = r - p.chunk.first_request;
  if (r < 0 || b < 0 || b >= p.chunk.num_requests) return write_empty_row(p.out, i, lane);
  // The combine reads no block table: only positions.
  const TokenWindow tw = token_window(p.step, t, r, /*check_blocks=*/false, lane);
  const int32_t gather = p.gather_lens[r - p.num_decodes];
  const int32_t n = p.chunk.compressed_width, m = p.chunk.total_width;
  if (!tw.ok || gather < 0 || gather > tw.seq_len || int64_t{n} + gather > m) {
    return write_empty_row(p.out, i, lane);
  }
  const int32_t gather_start = tw.seq_len - gather;
  const int32_t start = max(tw.window.start, gather_start);
  const int32_t end = max(min(tw.window.end, tw.seq_len), start);
  const int32_t swa_len = end - start;
  const int32_t ratio = p.chunk.ratio;
  const int32_t topk_len = ratio > 1 ? min((tw.pos + 1) / ratio, p.chunk.topk) : 0;
  const int32_t entries = tw.seq_len / ratio;
  const int32_t base = m * b;
  const int32_t* local = p.prefill_local.data + (t - p.num_decode_tokens) * p.prefill_local.stride;
  int32_t* row = p.out.data + i * p.out.stride;
  for (int32_t j = lane; j < p.out.width; j += kWarp) {
    int32_t v = -1;
    if (j < topk_len) {
      const int32_t l = local[j];
      v = l >= 0 && l < entries ? base + l : -1;  // masked, still counted (FlashMLA skips -1)
    } else if (j < topk_len + swa_len) {
      v = base + n + (start - gather_start) + (j - topk_len);
    }
    row[j] = v;
  }
  if (lane == 0) p.out.lens[i] = topk_len + swa_len;
}

// ---------------------------------------------------------------- ragged

constexpr int kScanThreads = 1024;

// One block: indptr[0] = 0, indptr[i + 1] = sum of clamped lens[0..i].
__global__ void ragged_indptr_kernel(const int32_t* lens, int64_t rows, int32_t width,
                                     int32_t* indptr) {
  using Scan = cub::BlockScan<int32_t, kScanThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ int32_t carry;
  if (threadIdx.x == 0) {
    carry = 0;
    indptr[0] = 0;
  }
  __syncthreads();
  for (int64_t base = 0; base < rows; base += kScanThreads) {
    const int64_t i = base + threadIdx.x;
    const int32_t len = i < rows ? min(max(lens[i], 0), width) : 0;
    int32_t inclusive, total;
    Scan(temp).InclusiveSum(len, inclusive, total);
    if (i < rows) indptr[i + 1] = carry + inclusive;
    __syncthreads();  // every thread read `carry` and the scan storage is free again
    if (threadIdx.x == 0) carry += total;
    __syncthreads();
  }
}

__global__ void ragged_values_kernel(Mat dense, const int32_t* indptr, int32_t* values) {
  const int64_t i = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (i >= dense.rows) return;
  const int32_t begin = indptr[i], len = indptr[i + 1] - begin;
  const int32_t* src = dense.data + i * dense.stride;
  for (int32_t j = lane; j < len; j += kWarp) values[begin + j] = src[j];
}

}  // namespace

Status cuda_compressed_topk_to_global(const SwaMetadata& md, int32_t first_token,
                                      MatrixView<const int32_t> local, const CompressedCache& cache,
                                      IndexView out, void* stream) {
  const TokenInfo ti{md.token_to_req_indices.data(), md.is_valid_token.data(), md.num_reqs};
  compressed_topk_kernel<<<blocks_for(local.rows), kThreads, 0,
                           static_cast<cudaStream_t>(stream)>>>(ti, first_token, mat(local),
                                                                cache_of(cache), out_rows(out));
  return check_launch("compressed_topk_to_global");
}

Status cuda_copy_global_topk(const SwaMetadata& md, int32_t first_token, ConstIndexView global,
                             IndexView out, void* stream) {
  const TokenInfo ti{md.token_to_req_indices.data(), md.is_valid_token.data(), md.num_reqs};
  const Mat g{global.data, global.rows, global.width, global.row_stride};
  copy_global_kernel<<<blocks_for(global.rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      ti, first_token, g, global.lens, out_rows(out));
  return check_launch("copy_global_topk");
}

Status cuda_build_mixed_matrix(const ConsumerStep& step, const CompressedTopk& topk,
                               const MixedMatrixShape& shape, MixedMatrixForm form, IndexView out,
                               std::span<int32_t> swa_lens, void* stream) {
  const SwaMetadata& md = step.md;
  MixedParams p{};
  p.step = step_of(step);
  p.num_tokens = md.num_tokens;
  p.num_decode_tokens = md.num_decode_tokens;
  p.decode_rows = {md.decode_swa.data, md.decode_swa.rows, md.decode_swa.width,
                   md.decode_swa.row_stride};
  p.decode_lens = md.decode_swa.lens;
  p.cache = cache_of(topk.cache);
  p.decode_local = mat(topk.decode_local);
  p.decode_global = {topk.decode_global.data, topk.decode_global.rows, topk.decode_global.width,
                     topk.decode_global.row_stride};
  p.decode_global_lens = topk.decode_global.lens;
  p.prefill_local = mat(topk.prefill_local);
  p.swa_width = shape.swa_width;
  p.relaid = form == MixedMatrixForm::kFlashInferSm100 && !md.causal;
  p.out = out_rows(out);
  p.swa_lens = swa_lens.empty() ? nullptr : swa_lens.data();
  mixed_matrix_kernel<<<blocks_for(md.num_tokens), kThreads, 0,
                        static_cast<cudaStream_t>(stream)>>>(p);
  return check_launch("build_mixed_matrix");
}

Status cuda_build_combined_prefill(const ConsumerStep& step, const CombineChunk& chunk,
                                   MatrixView<const int32_t> prefill_local, IndexView out,
                                   void* stream) {
  if (chunk.rows == 0) return Status::Ok();
  CombineParams p{};
  p.step = step_of(step);
  p.chunk = chunk;
  p.num_decodes = step.md.num_decodes;
  p.num_decode_tokens = step.md.num_decode_tokens;
  p.gather_lens = step.md.prefill_gather_lens.data();
  p.prefill_local = mat(prefill_local);
  p.out = out_rows(out);
  combined_prefill_kernel<<<blocks_for(chunk.rows), kThreads, 0,
                            static_cast<cudaStream_t>(stream)>>>(p);
  return check_launch("build_combined_prefill");
}

Status cuda_to_ragged(const ConstIndexView& view, const RaggedView& out, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  ragged_indptr_kernel<<<1, kScanThreads, 0, s>>>(view.lens, view.rows, view.width, out.indptr);
  SPARSE_SWA_RETURN_IF_ERROR(check_launch("to_ragged (indptr)"));
  if (view.rows == 0) return Status::Ok();
  const Mat dense{view.data, view.rows, view.width, view.row_stride};
  ragged_values_kernel<<<blocks_for(view.rows), kThreads, 0, s>>>(dense, out.indptr, out.values);
  return check_launch("to_ragged (values)");
}

}  // namespace sparse_swa::detail
