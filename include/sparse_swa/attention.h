// SPDX-License-Identifier: Apache-2.0
// Sparse MLA attention over the SWA cache and an optional second (compressed) cache: the
// computation the SWA metadata feeds, at any head count 1..128 and any index width.
//
// Per query token t and head h, the keys are the union of two index segments:
//   SWA segment:   entries j < swa_indices.lens[t] of row t, slot ids into swa_cache
//   extra segment: entries j < extra_indices.lens[t] of row t, slot ids into extra_cache
// An entry is used only when it is inside its row's length and >= 0 (-1 holes inside the length
// are skipped, so the mixed single-matrix form -- SWA section first, lens counting the whole
// section -- is just a call without an extra segment). Entries past the length are never read.
// With K_i the decoded 512-value key row (V = the same row):
//   s_i = softmax_scale * <q[t,h], K_i>,  lse = ln(sum_i exp(s_i)),  out = sum_i exp(s_i - lse) K_i
// A row with no valid key gets out = 0 and lse = +inf. With sinks: out *= 1 / (1 + exp(sink[h] -
// lse)), lse unchanged (a row with no key stays 0).
//
// Index values inside the length that are neither -1 nor a slot (< -1, or >= num_blocks *
// block_size):
//   CPU backend: an error naming the segment, row and entry; nothing is written.
//   CUDA backend: the entry is skipped (masked like -1) and counted in bad_index_count when
//   given; the kernel never reads outside the cache.
// The CPU backend accumulates in double and is the reference; the CUDA backend accumulates in
// fp32, launches asynchronously on the stream, never synchronises and is graph-capturable.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "sparse_swa/index_view.h"
#include "sparse_swa/kv_cache.h"
#include "sparse_swa/metadata_builder.h"  // cuda_backend_available()
#include "sparse_swa/status.h"

namespace sparse_swa {

inline constexpr int32_t kMaxAttentionHeads = 128;
inline constexpr int32_t kMaxQueryGroup = 8;  // tokens per query group (query_group_size)
inline constexpr float kDefaultSoftmaxScale = 0.044194173824159216f;  // 512^-0.5

// Which CUDA kernel runs a call (docs/design.md#attention-kernels). kAuto chooses from the
// shapes; the others force a family of the sm_90a tensor-core kernels, for tests and
// measurements (forcing one that cannot take the call is an error):
//   kSm90Tile32: one kernel walks 32-key tiles with separate QK + softmax and P V warpgroups and
//     keeps P as two bf16 parts (the fp32 tolerance);
//   kSm90Pairs: two math warpgroups share pairs of key blocks (32 keys for fp8_ds_mla rows, 64
//     for bf16 rows; at 1..16 heads on bf16 rows, the keys-as-rows few-heads form) and round P
//     to bf16 once (docs/design.md#attention-precision).
// Either splits the keys when the plan does.
enum class AttentionKernel : int32_t { kAuto = 0, kSm90Tile32 = 1, kSm90Pairs = 2 };

// "auto", "sm90_tile32", "sm90_pairs": the spelling the CLI tools and Python use for
// params.kernel.
const char* attention_kernel_name(AttentionKernel kernel);
StatusOr<AttentionKernel> parse_attention_kernel(std::string_view name);

struct SparseAttentionParams {
  int64_t num_tokens = 0;  // T
  int32_t num_heads = 0;   // H, 1..128

  const uint16_t* q = nullptr;  // [T, H, 512] bf16 bits, contiguous

  ConstKvCacheView swa_cache;  // the SWA cache
  ConstIndexView swa_indices;  // [T, width] slot ids into swa_cache; lens [T]
  // Optional second segment (compressed top-k), its own block size and page stride.
  // extra_indices.rows == 0 means none; otherwise rows == T.
  ConstKvCacheView extra_cache;
  ConstIndexView extra_indices;  // [T, extra_width] slot ids into extra_cache; lens [T]

  const float* sinks = nullptr;  // [H] fp32 per-head attention sink, or nullptr
  float softmax_scale = kDefaultSoftmaxScale;

  uint16_t* out = nullptr;  // [T, H, 512] bf16 bits
  float* lse = nullptr;     // [T, H] fp32, natural log

  // CUDA only, optional device int32 [1]: adds the number of masked entries (< -1 or past the
  // cache).
  int32_t* bad_index_count = nullptr;

  // CUDA only, optional device scratch, 16-byte aligned: lets the kernel split each token's keys
  // over several CTAs when tokens x heads alone would leave SMs idle (small batches, and the last
  // few tokens of a larger one: docs/design.md#splits), and decode each key of fp8_ds_mla caches
  // once for prefill batches whose tokens share their keys (docs/design.md#decoded-keys: a bf16
  // copy of the caches, 1 KB a slot, then that call's split partials). Size it with
  // sparse_attention_workspace_bytes(); none, or too small, only means fewer splits or keys
  // decoded per use. Reused by every call on the same stream (calls on different streams need
  // their own).
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;

  // CUDA only: the device every pointer above lives on, when the caller knows it (it took them
  // from device tensors, e.g. through DLPack); -1 = unknown. Unknown, the backend asks the driver
  // about each pointer (cudaPointerGetAttributes, about 0.3 us each) and refuses host memory.
  // Known, it must be the current device (an error otherwise) and those queries are skipped;
  // null pointers, shapes and alignment are checked either way.
  int32_t pointers_device = -1;

  // CUDA only: the kernel choice (above); the CPU reference has one path.
  AttentionKernel kernel = AttentionKernel::kAuto;

  // A hint, 1..kMaxQueryGroup: rows g k .. g k + g - 1 (g = query_group_size; the last group may
  // be shorter) are query tokens of one request whose key lists overlap (MTP and DSpark steps).
  // The CUDA backend may then load and decode each key a group shares once for all its tokens
  // (docs/design.md#query-groups): on fp8_ds_mla caches, when g x H <= 64, the groups fill the
  // SMs and the workspace holds their key lists (sparse_attention_workspace_bytes() counts
  // them). Results are those of the call without the hint, within the pair kernels' tolerance
  // (docs/design.md#attention-precision); the CPU reference ignores it.
  int32_t query_group_size = 1;
};

// Runs the attention on the backend the views' memory space picks (swa_indices.space): host =
// the CPU reference, device = CUDA. Every view, and every pointer, must live in that space. The
// CUDA backend also needs q, out and workspace 16-byte aligned and the other arrays aligned to
// their 4-byte elements (an error otherwise).
// Shape, stride, head-count, dtype and memory-space problems are errors before anything runs.
// cuda_stream is a cudaStream_t (nullptr = default stream; ignored on the CPU).
Status sparse_attention(const SparseAttentionParams& params, void* cuda_stream = nullptr);

// Workspace bytes the CUDA backend uses for these shapes (tokens, heads, row widths, query groups,
// cache sizes) on the current device: 0 when it would neither split the keys, nor share them
// within query groups, nor decode them once; 0 without a CUDA build or without a device.
int64_t sparse_attention_workspace_bytes(const SparseAttentionParams& params);

// The kernel family the CUDA backend runs for these params (shapes, cache dtypes, params.kernel)
// on the current device: kSm90Tile32 or kSm90Pairs for the tensor-core kernels, kAuto for the
// general kernel, for params it would refuse, or without a CUDA build or device. kSm90Pairs
// rounds P to bf16 once before P V (docs/design.md#attention-precision).
AttentionKernel sparse_attention_kernel(const SparseAttentionParams& params);

// The most sparse_attention_workspace_bytes() gives for any shape without query groups or
// decoded keys on the current device (the split-KV planner fills the SMs once, so the bound
// depends on the device only): a workspace of this size serves every call. Query groups need room
// for their key lists (it grows with tokens and widths), decoded keys for a bf16 copy of the
// caches: size those calls' workspace with sparse_attention_workspace_bytes(). 0 without a CUDA
// build or device.
int64_t sparse_attention_max_workspace_bytes();

// An owned device allocation of sparse_attention_max_workspace_bytes() on the current device,
// for SparseAttentionParams::workspace. Errors: UNAVAILABLE without a CUDA build or device, or
// while `cuda_stream` (a cudaStream_t, nullptr = the default stream) is being captured into a
// CUDA graph (allocating would invalidate the capture; a call without a workspace only splits
// less); INTERNAL on a CUDA error. A size of 0 (no split ever planned) owns nothing.
class AttentionWorkspace {
 public:
  static StatusOr<std::unique_ptr<AttentionWorkspace>> create(void* cuda_stream = nullptr);
  ~AttentionWorkspace();
  AttentionWorkspace(const AttentionWorkspace&) = delete;
  AttentionWorkspace& operator=(const AttentionWorkspace&) = delete;
  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  AttentionWorkspace() = default;
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

// The CPU reference without output rounding: out [T, H, 512] and lse [T, H] in double (host
// memory; params.out and params.lse are ignored).
Status sparse_attention_reference(const SparseAttentionParams& params, double* out, double* lse);

// For tools: the CUDA backend on host-resident params (copies inputs to the device, runs, copies
// out and lse back, synchronises). Not graph-capturable; unavailable without a CUDA build.
Status sparse_attention_cuda_from_host(const SparseAttentionParams& host_params);

}  // namespace sparse_swa
