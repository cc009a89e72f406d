// Host entry points of the CUDA codec (src/cuda/kv_codec.cu). Plain C++: included by the CPU
// dispatcher in src/cpu/kv_codec.cc, which has already checked every shape.
#pragma once

#include <span>

#include "sparse_swa/kv_cache.h"

namespace sparse_swa::detail {

Status cuda_encode_kv_rows(MatrixView<const float> rows, std::span<const int64_t> slots,
                           const KvCacheView& cache, const KvCodecOptions& options);
Status cuda_encode_kv_rows_bf16(MatrixView<const uint16_t> rows, std::span<const int64_t> slots,
                                const KvCacheView& cache, const KvCodecOptions& options);
Status cuda_decode_kv_rows(const ConstKvCacheView& cache, std::span<const int64_t> slots,
                           MatrixView<float> out, const KvCodecOptions& options);

}  // namespace sparse_swa::detail
