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

// Unavailable when no CUDA device can be used.
Status check_cuda_device();
// True while `stream` (a cudaStream_t) is being captured into a graph. Launchers skip the
// pointer-attribute queries then: capture must record kernels only.
bool stream_capturing(void* stream);

// Ok when `ptr` is device (or managed) memory the current device can read; `name` prefixes the
// message. A host pointer handed to a kernel would fault, so launchers check first.
Status check_device_pointer(const void* ptr, const char* name);

}  // namespace sparse_swa::detail
