// SPDX-License-Identifier: Apache-2.0
// The one per-step kernel of the CUDA metadata builder: every per-token output in one launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace sparse_swa::detail {

// Bits of the device error word (see MetadataBuilder::take_device_error).
enum DeviceErrorBits : uint32_t {
  kDeviceErrorWindow = 1u << 0,      // a window outside [0, seq_len) or wider than its row
  kDeviceErrorBlockTable = 1u << 1,  // a block index past the table, or a negative block id
  kDeviceErrorSlotOverflow = 1u << 2,
  kDeviceErrorPaddingSlot = 1u << 3,  // a padding token (past query_start_loc[R]) with a slot
  kDeviceErrorSlotValue = 1u << 4,    // a slot_mapping value < -1
  kDeviceErrorDraftSpans = 1u << 5,   // a draft update's query_start_loc differs from the build's
};

struct MetadataKernelParams {
  // Inputs, device memory.
  const int32_t* query_start_loc;  // [num_reqs + 1]
  const int32_t* seq_lens;         // [num_reqs]
  const int32_t* block_table;      // [>= num_reqs, block_table_stride]
  int64_t block_table_stride;
  int32_t block_table_cols;
  const int64_t* slot_mapping;  // [num_tokens], -1 = padding
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
  bool noncausal;   // decode rows are DSpark non-causal rows
  bool with_image;  // prefill rows are widened by in-image visibility
  // update_draft_decode_rows: only the first num_decode_tokens causal rows, with the mapping and
  // validity of the last build (below).
  bool update_only;

  // The last build's spans and decode tokens' validity, in builder-private buffers (the exported
  // token_to_req and is_valid are the caller's to write). A build with decode tokens writes them;
  // an update maps tokens over them (query_start_loc is then build_query_start_loc) and writes a
  // token whose span in the batch's own query_start_loc (batch_query_start_loc) differs as
  // invalid, flagging kDeviceErrorDraftSpans.
  int32_t* build_query_start_loc;        // [num_reqs + 1]
  uint8_t* build_valid;                  // [num_decode_tokens]
  const int32_t* batch_query_start_loc;  // update_only: [num_reqs + 1]

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
  uint32_t* error_word;    // DeviceErrorBits, OR-ed
};

inline constexpr int kMetadataKernelThreads = 256;

// How the kernel is launched on one device, looked up once (the builder's create()).
struct MetadataKernelLauncher {
  int resident_blocks = 1;           // SMs x resident blocks per SM (one wave)
  void* function = nullptr;          // the kernel's CUfunction
  void* cu_launch_kernel = nullptr;  // the driver's cuLaunchKernel; null: launch with <<<>>>
};
cudaError_t init_metadata_kernel_launcher(int device, MetadataKernelLauncher* launcher);

// Grid size for the launch: a warp per row, plus enough threads for the lens tail, capped at
// four waves of `resident_blocks` (warps then take several rows).
int metadata_kernel_blocks(const MetadataKernelParams& p, int resident_blocks);

// Enqueues the kernel on `stream`; returns the launch error, if any.
cudaError_t launch_metadata_kernel(const MetadataKernelParams& p,
                                   const MetadataKernelLauncher& launcher, cudaStream_t stream);

}  // namespace sparse_swa::detail
