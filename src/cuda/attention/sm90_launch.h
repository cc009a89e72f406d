// SPDX-License-Identifier: Apache-2.0
// The sm_90a attention as the dispatcher (dispatch.cc) sees it: whether it takes a call, the
// device's capacity for the plan (src/attention/sm90_plan.h), and the launch of a plan.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention/overrides.h"
#include "attention/sm90_plan.h"
#include "sparse_swa/attention.h"

namespace sparse_swa::detail {

// True when the sm_90a kernels take this call: every segment an fp8_ds_mla cache, or every
// segment a bf16 cache, and the device runs their sm_90a machine code.
bool sm90_applies(const SparseAttentionParams& p);

// The current device's SM count and cluster capacity (sm90_capacity.cu: asked once per device,
// SmCapacity::ideal where the clusters cannot be asked about); the error where the SM count is
// unknown.
cudaError_t current_sm_capacity(SmCapacity* sms);

// Plans the call on the current device and launches it (the plan's union or decode pass, the
// kernel, the merge of its slices) on `stream`; `p` has passed the front end's checks
// (src/attention.cc) and sm90_applies(p).
Status launch_sm90_attention(const SparseAttentionParams& p, const AttentionOverrides& overrides,
                             cudaStream_t stream);

}  // namespace sparse_swa::detail
