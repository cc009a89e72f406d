// SPDX-License-Identifier: Apache-2.0
// How fast the SMs gather fp8_ds_mla key rows from random slots, loaded as the fp8_ds_mla prefill
// kernel's producer loads them (src/cuda/attention_ds_mla_prefill_fp8.cu): 32 keys a block, four
// threads a key, each thread nine 16-byte loads of the row and one 8-byte load of its scales.
// A group of 128 threads folds a block's words before it starts the next block's loads, so each
// group has one block in flight; one CTA per SM holds W groups (W blocks in flight per SM). Rows
// are 576 bytes in 64-slot pages followed by the page's scales (the cache layout of
// docs/semantics.md), from a pool that fits in L2 and from one that does not.
//   sparse_swa_gather_bench [--blocks N] [--reps N]
// Prints, per pool and W: GB/s of row bytes (584 a key) and cycles per block and group.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <random>
#include <vector>

#include "cuda_check.h"

namespace {

constexpr int kRowBytes = 576, kScaleBytes = 8, kPageSlots = 64;
constexpr int64_t kPageBytes = int64_t{kPageSlots} * (kRowBytes + kScaleBytes);
constexpr int kBlockKeys = 32;

// slots: [gridDim.x * W, blocks, 32] slot ids; out: [gridDim.x * 128 W] folded words; cycles:
// [gridDim.x * W] clock cycles of each group's loop.
template <int W>
__global__ void __launch_bounds__(128 * W, 1)
    gather_kernel(const uint8_t* pool, const int32_t* slots, int blocks, uint32_t* out,
                  long long* cycles) {
  const int group = threadIdx.x >> 7, t = threadIdx.x & 127, key = t >> 2, part = t & 3;
  const int64_t g = int64_t{blockIdx.x} * W + group;
  const int32_t* mine = slots + g * blocks * kBlockKeys;
  uint32_t acc = 0;
  const long long start = clock64();
  for (int b = 0; b < blocks; ++b) {
    // A data dependence on the previous block's words: its loads land before these start.
    const int32_t slot = mine[b * kBlockKeys + key + (acc == 0x9e3779b9u ? 1 : 0)];
    const uint8_t* page = pool + int64_t{slot / kPageSlots} * kPageBytes;
    const uint8_t* row = page + (slot % kPageSlots) * kRowBytes;
    uint4 v[9];
#pragma unroll
    for (int i = 0; i < 7; ++i)
      v[i] = __ldg(reinterpret_cast<const uint4*>(row + (part + 4 * i) * 16));
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      v[7 + i] = __ldg(reinterpret_cast<const uint4*>(row + 448 + (part + 4 * i) * 16));
    }
    const uint2 sc = __ldg(reinterpret_cast<const uint2*>(page + kPageSlots * kRowBytes +
                                                          (slot % kPageSlots) * kScaleBytes));
#pragma unroll
    for (int i = 0; i < 9; ++i) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
    acc ^= sc.x ^ sc.y;
  }
  const long long stop = clock64();
  out[int64_t{blockIdx.x} * blockDim.x + threadIdx.x] = acc;
  if (t == 0) cycles[g] = stop - start;
}

// The first `slots` slots of a pool allocation, under a name for the table.
struct Pool {
  const char* name;
  const uint8_t* bytes;  // [slots / 64 pages, kPageBytes]
  int64_t slots;
};

template <int W>
void run(const Pool& pool, int sms, int blocks, int reps, std::mt19937* rng) {
  const int64_t groups = int64_t{sms} * W, keys = groups * blocks * kBlockKeys;
  std::vector<int32_t> host(keys);
  std::uniform_int_distribution<int64_t> pick(0, pool.slots - 1);
  for (auto& s : host) s = static_cast<int32_t>(pick(*rng));
  int32_t* slots = nullptr;
  uint32_t* out = nullptr;
  long long* cycles = nullptr;
  // One spare entry: the data-dependence offset may read one past a group's last entry.
  CUDA_OK(cudaMalloc(&slots, (keys + 1) * sizeof(int32_t)));
  CUDA_OK(cudaMemset(slots, 0, (keys + 1) * sizeof(int32_t)));
  CUDA_OK(cudaMemcpy(slots, host.data(), keys * sizeof(int32_t), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMalloc(&out, groups * 128 * sizeof(uint32_t)));
  CUDA_OK(cudaMalloc(&cycles, groups * sizeof(long long)));
  cudaEvent_t a, b;
  CUDA_OK(cudaEventCreate(&a));
  CUDA_OK(cudaEventCreate(&b));
  std::vector<float> ms(reps);
  for (int r = -1; r < reps; ++r) {  // r = -1: warm-up (the small pool into L2)
    CUDA_OK(cudaEventRecord(a));
    gather_kernel<W><<<sms, 128 * W>>>(pool.bytes, slots, blocks, out, cycles);
    CUDA_OK(cudaEventRecord(b));
    CUDA_OK(cudaEventSynchronize(b));
    CUDA_OK(cudaGetLastError());
    if (r >= 0) CUDA_OK(cudaEventElapsedTime(&ms[r], a, b));
  }
  std::sort(ms.begin(), ms.end());
  const double median_s = ms[reps / 2] * 1e-3;
  std::vector<long long> cyc(groups);
  CUDA_OK(cudaMemcpy(cyc.data(), cycles, groups * sizeof(long long), cudaMemcpyDeviceToHost));
  double mean_cycles = 0;
  for (long long c : cyc) mean_cycles += double(c) / groups;
  std::printf("%-6s %2d %9.1f %9.0f %8.1f\n", pool.name, W,
              double(keys) * (kRowBytes + kScaleBytes) / median_s * 1e-9, mean_cycles / blocks,
              ms[reps / 2] * 1e3);
  CUDA_OK(cudaFree(slots));
  CUDA_OK(cudaFree(out));
  CUDA_OK(cudaFree(cycles));
  CUDA_OK(cudaEventDestroy(a));
  CUDA_OK(cudaEventDestroy(b));
}

}  // namespace

int main(int argc, char** argv) {
  int blocks = 64, reps = 10;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--blocks") && i + 1 < argc) {
      blocks = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--blocks N] [--reps N]\n", argv[0]);
      return 2;
    }
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::mt19937 rng(7);
  // 32768 slots (19 MB, as the prefill benchmark's pool) and 4M slots (2.4 GB).
  const int64_t small_slots = 32768, large_slots = int64_t{1} << 22;
  uint8_t* pool = nullptr;
  const int64_t pool_bytes = large_slots / kPageSlots * kPageBytes;
  CUDA_OK(cudaMalloc(&pool, pool_bytes));
  CUDA_OK(cudaMemset(pool, 0x5a, pool_bytes));
  std::printf("device: %s, %d SMs; %d blocks of %d keys per group; median of %d runs\n", prop.name,
              prop.multiProcessorCount, blocks, kBlockKeys, reps);
  std::printf("%-6s %2s %9s %9s %8s\n", "pool", "W", "GB/s", "cyc/blk", "us");
  const int sms = prop.multiProcessorCount;
  for (const Pool& p : {Pool{"19MB", pool, small_slots}, Pool{"2.4GB", pool, large_slots}}) {
    run<1>(p, sms, blocks, reps, &rng);
    run<2>(p, sms, blocks, reps, &rng);
    run<4>(p, sms, blocks, reps, &rng);
    run<8>(p, sms, blocks, reps, &rng);
  }
  CUDA_OK(cudaFree(pool));
  return 0;
}
