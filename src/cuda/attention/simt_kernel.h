// SPDX-License-Identifier: Apache-2.0
// The general SIMT attention kernel (simt_kernel.cu): every cache dtype, every device.
#pragma once

#include <cuda_runtime.h>

#include "sparse_swa/attention.h"

namespace sparse_swa::detail {

// Launches it on `stream`; `p` has passed the front end's and the dispatcher's checks.
Status launch_simt_attention(const SparseAttentionParams& p, cudaStream_t stream);

}  // namespace sparse_swa::detail
