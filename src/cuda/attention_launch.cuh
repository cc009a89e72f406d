// Host entry points of the CUDA attention (src/cuda/attention.cu). Plain C++: included by the
// dispatcher in src/cpu/attention_cpu.cc.
#pragma once

#include <string_view>

#include "sparse_swa/attention.h"

namespace sparse_swa::detail {

// Shape checks shared by both backends (attention_cpu.cc): sizes, views, head count, scale and
// memory spaces (`space` is where every view must live). Host views also get their lens checked.
// `need_outputs` = false skips the out / lse pointers (the double reference writes elsewhere).
Status check_attention_shapes(const SparseAttentionParams& p, MemorySpace space,
                              bool need_outputs = true);

// Launches on `cuda_stream`; `p` has passed check_attention_shapes(p, kDevice).
Status cuda_sparse_attention(const SparseAttentionParams& p, void* cuda_stream);

// sparse_attention_workspace_bytes() of a CUDA build.
int64_t cuda_sparse_attention_workspace_bytes(const SparseAttentionParams& p);

// Copies host params to the device, runs, copies back; `host_params` passed
// check_attention_shapes(host_params, kHost).
Status cuda_sparse_attention_from_host(const SparseAttentionParams& host_params);

}  // namespace sparse_swa::detail
