// SPDX-License-Identifier: Apache-2.0
// CUDA_OK(call): the benchmarks' check of a CUDA runtime call. On an error it prints the file,
// line, call and error and exits 1 (benchmark programs only; the library returns a Status).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CUDA_OK(x)                                                                             \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)
