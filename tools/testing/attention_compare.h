// SPDX-License-Identifier: Apache-2.0
// The CUDA attention's tolerance against the CPU reference, shared by the attention tests and the
// soak (tests/soak/). Elementwise: |cuda - ref_double| <= 2 * |ref_float - ref_double| + 1e-3,
// where ref_double is sparse_attention_reference() and ref_float a plain fp32 computation over the
// same bf16 inputs that rounds its output to bf16; lse the same way, +inf exactly; NaN never
// passes. bf16_p (kernels that round P to bf16 once): plus 2^-8 (weighted mean of |V| + |ref|). No
// gtest here: failures are counted and the first one described.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sparse_swa/attention.h"

namespace sparse_swa::testing {

// The plain fp32 reference (host params): out [T, H, 512] as floats, lse [T, H]; abs_out (or
// nullptr) [T, H, 512] the same weighted mean of |V| (the scale of P's rounding error).
void float_attention_reference(const SparseAttentionParams& p, float* out, float* lse,
                               float* abs_out = nullptr);

struct AttentionComparison {
  double max_err = 0, max_float_ref_err = 0, max_lse_err = 0;
  int64_t failures = 0;
  std::string first_failure;
};

// Compares CUDA outputs (bf16 bits, fp32 lse) of the call `hp` describes (host views) with both
// references, over the tokens in parallel threads. A reference that fails counts as a failure.
// bf16_p: sparse_attention_kernel(params) == AttentionKernel::kSm90Pairs for the call compared.
AttentionComparison compare_attention(const SparseAttentionParams& hp,
                                      const std::vector<uint16_t>& cuda_out,
                                      const std::vector<float>& cuda_lse, bool bf16_p = false);

}  // namespace sparse_swa::testing
