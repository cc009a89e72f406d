// SPDX-License-Identifier: Apache-2.0
// The one per-step kernel of the CUDA metadata builder: every per-token output in one launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "sparse_swa/metadata_builder.h"  // kMaxBuildGroups

namespace sparse_swa::detail {

// Bits of the device error word (see MetadataBuilder::take_device_error).
enum DeviceErrorBits : uint32_t {
  kDeviceErrorWindow = 1u << 0,      // a window outside [0, seq_len) or wider than its row
  kDeviceErrorBlockTable = 1u << 1,  // a block index past the table, or a negative block id
  kDeviceErrorSlotOverflow = 1u << 2,
  kDeviceErrorPaddingSlot = 1u << 3,  // a padding token (past query_start_loc[R]) with a slot
  kDeviceErrorSlotValue = 1u << 4,    // a slot_mapping value < -1
  kDeviceErrorReplayStart = 1u << 5,  // a replay_start outside [0, seq_len - query_len]
};

struct MetadataKernelParams {
  // Inputs, device memory.
  const int32_t* query_start_loc;  // [num_reqs + 1]
  const int32_t* seq_lens;         // [num_reqs]
  const int32_t* block_table;      // [>= num_reqs, block_table_stride]
  int64_t block_table_stride;
  int32_t block_table_cols;
  const int64_t* slot_mapping;  // [num_tokens], -1 = padding
  // SWA bounded replay, [num_reqs], or null (none: 0): clamps causal rows and gather lens. A
  // build reads the batch's array; a causal draft update the build's copy (build_replay).
  const int32_t* replay_start;
  // Image spans, packed: indptr [num_reqs + 1] | starts [num_spans] | ends [num_spans].
  const int32_t* spans;
  int32_t num_spans;

  int32_t num_reqs;
  int32_t num_tokens;
  int32_t num_decode_tokens;
  int32_t num_decodes;
  int32_t num_prefills;
  // Query length shared by every decode request of the host split, 0 when they differ: decode
  // token t then belongs to request t / decode_query_len, checked against the device arrays.
  int32_t decode_query_len;
  int32_t window;
  int32_t block_size;
  int32_t block_shift;  // log2(block_size) when it is a power of two, else -1
  int32_t max_image_tokens;
  bool noncausal;   // decode rows are DSpark non-causal rows (a draft update: the build's mode)
  bool with_image;  // prefill rows are widened by in-image visibility
  // update_draft_decode_rows: validity of every token, then the first num_decode_tokens tokens'
  // requests (padding: the last request) and rows, from the current device arrays.
  bool update_only;
  // Check replay_start against the arrays (a build given one; an update of such a build).
  bool check_replay;

  // Outputs, device memory (persistent buffers).
  int32_t* token_to_req;  // [num_tokens]
  uint8_t* is_valid;      // [num_tokens]
  int32_t* decode_rows;   // [num_decode_tokens, decode_width]
  int32_t decode_width;
  int32_t* decode_lens;  // [lens_capacity]; [num_decode_tokens, capacity) zeroed when Td > 0
  int32_t lens_capacity;
  int32_t* prefill_rows;  // [num_tokens - num_decode_tokens, prefill_width]
  int32_t prefill_width;
  int32_t* prefill_lens;   // [num_tokens - num_decode_tokens]
  int32_t* left_visible;   // [num_tokens] (with_image)
  int32_t* right_visible;  // [num_tokens] (with_image)
  int32_t* gather_lens;    // [num_prefills]
  // A build: replay_start (or zeros) copied to the exported buffer and the builder's own copy
  // the draft update reads, [num_reqs] each.
  int32_t* replay_out;
  int32_t* build_replay;
  // The FlashInfer decode lens, [num_decode_tokens] each, or null (not written this step).
  int32_t* flashinfer_topk_lens;
  int32_t* flashinfer_seq_lens;
  uint32_t* error_word;  // DeviceErrorBits, OR-ed
};

// MetadataBuilder::build_groups: several builders' steps in one launch. groups[g] is what group
// g's own launch would take; the launch fills unit_end (each group's work units follow the
// previous group's).
struct MetadataGroupParams {
  MetadataKernelParams groups[kMaxBuildGroups];
  int32_t unit_end[kMaxBuildGroups];  // cumulative work units through group g
  int32_t num_groups;
};

// Kernel parameters are limited to 4 KiB (the larger limit of newer toolkits is not assumed).
static_assert(sizeof(MetadataGroupParams) <= 4096, "MetadataGroupParams past the parameter limit");

inline constexpr int kMetadataKernelThreads = 256;

// How the kernels are launched on one device, looked up once (the builder's create()).
struct MetadataKernelLauncher {
  int resident_blocks = 1;           // SMs x resident blocks per SM (one wave)
  void* function = nullptr;          // the one-step kernel's CUfunction
  void* groups_function = nullptr;   // the grouped kernel's CUfunction
  void* cu_launch_kernel = nullptr;  // the driver's cuLaunchKernel; null: launch with <<<>>>
};
cudaError_t init_metadata_kernel_launcher(int device, MetadataKernelLauncher* launcher);

// Grid size for the launch: a warp per row, plus enough threads for the lens tail, capped at
// four waves of `resident_blocks` (warps then take several rows).
int metadata_kernel_blocks(const MetadataKernelParams& p, int resident_blocks);

// Enqueues the kernel on `stream`; returns the launch error, if any.
cudaError_t launch_metadata_kernel(const MetadataKernelParams& p,
                                   const MetadataKernelLauncher& launcher, cudaStream_t stream);
// The same for gp.num_groups steps in one launch (fills gp.unit_end).
cudaError_t launch_metadata_groups_kernel(MetadataGroupParams* gp,
                                          const MetadataKernelLauncher& launcher,
                                          cudaStream_t stream);

}  // namespace sparse_swa::detail
