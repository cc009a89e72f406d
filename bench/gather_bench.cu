// SPDX-License-Identifier: Apache-2.0
// How fast the SMs gather fp8_ds_mla key rows from random slots, loaded as the fp8_ds_mla pair
// kernel's producer loads them (src/cuda/attention/sm90_pairs_fp8_kernel.cu): 32 keys a block, four
// threads a key, each thread nine 16-byte loads of the row and one 8-byte load of its scales.
// Rows are 576 bytes in 64-slot pages followed by the page's scales (the cache layout of
// docs/semantics.md#page-layouts), from a pool that fits in L2 and from one that does not.
//   Table 1, the gather alone: a group of 128 threads folds a block's words before it starts the
//   next block's loads, so each group has one block in flight; one CTA per SM holds W groups.
//   Table 2, the producer's loop: one warpgroup per SM loads block b + 1 while it decodes block b
//   into bf16 rows in shared memory (the library's conversion and swizzle), with the L2 warm or
//   flushed before each launch, and with 0 or 2 more warpgroups streaming 16-byte shared-memory
//   reads meanwhile (as the math warpgroups' wgmma operands do). "registers": the kernel's way,
//   block b + 1's bytes loaded into registers; "cp.async N": the same bytes copied by `cp.async`
//   into N raw stages in shared memory, N - 1 blocks in flight, each thread reading back the
//   chunks it copied (no barrier) just before it decodes them.
//   sparse_swa_gather_bench [--blocks N] [--smem-kb N] [--reps N]  (N KB of dynamic shared
//   memory per CTA in table 1: what is left of the SM's 256 KB is its L1)
// Prints GB/s of row bytes (584 a key) and cycles per block and group.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <random>
#include <vector>

#include "attention/sm90_shapes.h"
#include "cuda/attention/fp8_decode.cuh"
#include "cuda/attention/sm90_common.cuh"
#include "cuda_check.h"

namespace {

using sparse_swa::kNopeDim;
constexpr int kRowBytes = sparse_swa::kDsMlaTokenBytes, kScaleBytes = sparse_swa::kDsMlaScaleBytes;
constexpr int kPageSlots = 64;
constexpr int64_t kPageBytes = int64_t{kPageSlots} * (kRowBytes + kScaleBytes);
constexpr int kBlockKeys = 32;
constexpr size_t kFlushBytes = size_t{256} << 20;

// One thread's share of a key (part = thread % 4): its ten loads, as the producer's.
struct RawKey {
  uint4 nope[7];  // NoPE chunks part + 4 i
  uint4 rope[2];  // RoPE chunks part and part + 4
  uint2 scales;
};
// Byte offsets of a share's chunks in a key's row: NoPE chunk i, RoPE chunk i.
__device__ __forceinline__ int nope_offset(int part, int i) { return (part + 4 * i) * 16; }
__device__ __forceinline__ int rope_offset(int part, int i) {
  return kNopeDim + (part + 4 * i) * 16;
}
// Where a slot's row and scale bytes lie in the pool.
struct KeyPlace {
  const uint8_t* row;
  const uint8_t* scales;
};
__device__ __forceinline__ KeyPlace key_place(const uint8_t* pool, int32_t slot) {
  const uint8_t* page = pool + int64_t{slot / kPageSlots} * kPageBytes;
  return {page + (slot % kPageSlots) * kRowBytes,
          page + kPageSlots * kRowBytes + (slot % kPageSlots) * kScaleBytes};
}
__device__ __forceinline__ void load_key(const uint8_t* pool, int32_t slot, int part, RawKey& r) {
  const KeyPlace at = key_place(pool, slot);
#pragma unroll
  for (int i = 0; i < 7; ++i) {
    r.nope[i] = __ldg(reinterpret_cast<const uint4*>(at.row + nope_offset(part, i)));
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    r.rope[i] = __ldg(reinterpret_cast<const uint4*>(at.row + rope_offset(part, i)));
  }
  r.scales = __ldg(reinterpret_cast<const uint2*>(at.scales));
}

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
    RawKey r;
    load_key(pool, slot, part, r);
#pragma unroll
    for (const uint4& v : r.nope) acc ^= v.x ^ v.y ^ v.z ^ v.w;
#pragma unroll
    for (const uint4& v : r.rope) acc ^= v.x ^ v.y ^ v.z ^ v.w;
    acc ^= r.scales.x ^ r.scales.y;
  }
  const long long stop = clock64();
  out[int64_t{blockIdx.x} * blockDim.x + threadIdx.x] = acc;
  if (t == 0) cycles[g] = stop - start;
}

namespace ds = sparse_swa::detail::sm90;
static_assert(kBlockKeys == ds::pairs_fp8::kBlockKeys);
constexpr int kBufBytes = kBlockKeys * sparse_swa::kHeadDim * 2;  // [32 keys, 512] bf16, swizzled
constexpr int kReadBytes = 64 * 1024;  // what the readers stream (a Q-sized region)
constexpr int kPipelineSmem = 4 * kBufBytes + kReadBytes + 16;

// A share decoded into the swizzled bf16 rows of buffer k, as the kernel's producer stores it.
__device__ __forceinline__ void store_key(const RawKey& r, uint8_t* k, int key, int part) {
  ds::store_nope_share<false>(r.nope, r.scales, k, key, part, kBlockKeys);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    *reinterpret_cast<uint4*>(k + ds::sw128(key, kNopeDim + (part + 4 * i) * 8, kBlockKeys)) =
        r.rope[i];
  }
}

// The producer's end: once all 128 producer threads are done, thread 0 records the loop's cycles
// and stops the readers.
__device__ __forceinline__ void finish_producer(long long loop_cycles, long long* cycles,
                                                volatile uint32_t* done) {
  asm volatile("bar.sync 1, 128;" ::: "memory");
  if (threadIdx.x == 0) {
    cycles[blockIdx.x] = loop_cycles;
    *done = 1;
  }
}

// A reader warpgroup's loop: 16-byte reads of the kReadBytes at `src` until the producer sets
// `done`; returns the folded words.
__device__ uint32_t read_until_done(const uint8_t* src, volatile uint32_t* done) {
  uint32_t acc = 0;
  for (int it = 0; *done == 0; ++it) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int off = ((threadIdx.x - 128) * 16 + i * 4096 + it * 64) & (kReadBytes - 1);
      const uint4 v = *reinterpret_cast<const uint4*>(src + off);
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  return acc;
}

// slots: [gridDim.x, blocks, 32]; out: [gridDim.x * blockDim.x] folded words; cycles:
// [gridDim.x] the producer's loop. Warpgroups 1..R read while warpgroup 0 runs its loop.
template <int R>
__global__ void __launch_bounds__(128 * (R + 1), 1)
    pipeline_kernel(const uint8_t* pool, const int32_t* slots, int blocks, uint32_t* out,
                    long long* cycles) {
  extern __shared__ __align__(1024) uint8_t smem[];
  volatile uint32_t* done = reinterpret_cast<volatile uint32_t*>(smem + 4 * kBufBytes + kReadBytes);
  if (threadIdx.x == 0) *done = 0;
  __syncthreads();
  uint32_t acc = 0;
  if (threadIdx.x >= 128) {
    acc = read_until_done(smem + 4 * kBufBytes, done);
  } else {
    const int t = threadIdx.x, key = t >> 2, part = t & 3;
    const int32_t* mine = slots + int64_t{blockIdx.x} * blocks * kBlockKeys;
    RawKey cur, next;
    load_key(pool, mine[key], part, cur);
    int32_t slot = mine[min(1, blocks - 1) * kBlockKeys + key];
    const long long start = clock64();
    for (int b = 0; b < blocks; ++b) {
      const int32_t after = mine[min(b + 2, blocks - 1) * kBlockKeys + key];
      load_key(pool, slot, part, next);
      store_key(cur, smem + (b & 3) * kBufBytes, key, part);
      cur = next;
      slot = after;
    }
    finish_producer(clock64() - start, cycles, done);
    acc = cur.nope[0].x;
  }
  out[int64_t{blockIdx.x} * blockDim.x + threadIdx.x] = acc;
}

// A block's raw bytes in shared memory: [32 keys, 576] row bytes, then [32 keys, 4 parts] scale
// words (each thread copies its key's 8 scale bytes for itself).
constexpr int kRawScalesOff = kBlockKeys * kRowBytes;
constexpr int kRawStage = kRawScalesOff + kBlockKeys * 4 * kScaleBytes;
template <int S>
constexpr int staged_smem() {
  return 2 * kBufBytes + kReadBytes + S * kRawStage + 16;
}

// As pipeline_kernel, the bytes by cp.async into S raw stages (block b + S - 1 copied while block
// b is decoded); two bf16 buffers are enough for a producer that nothing reads.
template <int R, int S>
__global__ void __launch_bounds__(128 * (R + 1), 1)
    staged_kernel(const uint8_t* pool, const int32_t* slots, int blocks, uint32_t* out,
                  long long* cycles) {
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* const raw0 = smem + 2 * kBufBytes + kReadBytes;
  volatile uint32_t* done = reinterpret_cast<volatile uint32_t*>(raw0 + S * kRawStage);
  if (threadIdx.x == 0) *done = 0;
  __syncthreads();
  uint32_t acc = 0;
  if (threadIdx.x >= 128) {
    acc = read_until_done(smem + 2 * kBufBytes, done);
  } else {
    namespace ptx = sparse_swa::detail::ptx;
    const int t = threadIdx.x, key = t >> 2, part = t & 3;
    const int32_t* mine = slots + int64_t{blockIdx.x} * blocks * kBlockKeys;
    const auto copy_block = [&](int b) {  // this thread's chunks of block b into stage b % S
      if (b < blocks) {
        const KeyPlace at = key_place(pool, mine[b * kBlockKeys + key]);
        const uint32_t dst = ptx::smem_addr(raw0 + (b % S) * kRawStage + key * kRowBytes);
#pragma unroll
        for (int i = 0; i < 7; ++i) {
          ptx::cp_async_16(dst + nope_offset(part, i), at.row + nope_offset(part, i));
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          ptx::cp_async_16(dst + rope_offset(part, i), at.row + rope_offset(part, i));
        }
        ptx::cp_async_8(
            ptx::smem_addr(raw0 + (b % S) * kRawStage + kRawScalesOff + t * kScaleBytes),
            at.scales);
      }
      ptx::cp_async_commit();
    };
    for (int b = 0; b < S - 1; ++b) copy_block(b);
    const long long start = clock64();
    for (int b = 0; b < blocks; ++b) {
      copy_block(b + S - 1);  // into the stage block b - 1 was read from
      ptx::cp_async_wait<S - 1>();
      const uint8_t* raw = raw0 + (b % S) * kRawStage;
      const uint8_t* row = raw + key * kRowBytes;
      RawKey cur;
#pragma unroll
      for (int i = 0; i < 7; ++i) {
        cur.nope[i] = *reinterpret_cast<const uint4*>(row + nope_offset(part, i));
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        cur.rope[i] = *reinterpret_cast<const uint4*>(row + rope_offset(part, i));
      }
      cur.scales = *reinterpret_cast<const uint2*>(raw + kRawScalesOff + t * kScaleBytes);
      store_key(cur, smem + (b & 1) * kBufBytes, key, part);
    }
    finish_producer(clock64() - start, cycles, done);
    acc = *reinterpret_cast<const uint32_t*>(smem + t * 16);
  }
  out[int64_t{blockIdx.x} * blockDim.x + threadIdx.x] = acc;
}

// The first `slots` slots of a pool allocation, under a name for the table.
struct Pool {
  const char* name;
  const uint8_t* bytes;  // [slots / 64 pages, kPageBytes]
  int64_t slots;
};

// `keys` random slots of the pool on the device ([keys + 1] int32, the spare entry 0: table 1's
// data-dependence offset may read one past a group's last entry).
int32_t* random_slots(const Pool& pool, int64_t keys, std::mt19937* rng) {
  std::vector<int32_t> host(keys);
  std::uniform_int_distribution<int64_t> pick(0, pool.slots - 1);
  for (auto& s : host) s = static_cast<int32_t>(pick(*rng));
  int32_t* slots = nullptr;
  CUDA_OK(cudaMalloc(&slots, (keys + 1) * sizeof(int32_t)));
  CUDA_OK(cudaMemset(slots, 0, (keys + 1) * sizeof(int32_t)));
  CUDA_OK(cudaMemcpy(slots, host.data(), keys * sizeof(int32_t), cudaMemcpyHostToDevice));
  return slots;
}

template <int W>
void run(const Pool& pool, int sms, int blocks, int smem, int reps, std::mt19937* rng) {
  const int64_t groups = int64_t{sms} * W, keys = groups * blocks * kBlockKeys;
  int32_t* slots = random_slots(pool, keys, rng);
  uint32_t* out = nullptr;
  long long* cycles = nullptr;
  CUDA_OK(cudaMalloc(&out, groups * 128 * sizeof(uint32_t)));
  CUDA_OK(cudaMalloc(&cycles, groups * sizeof(long long)));
  cudaEvent_t a, b;
  CUDA_OK(cudaEventCreate(&a));
  CUDA_OK(cudaEventCreate(&b));
  std::vector<float> ms(reps);
  for (int r = -1; r < reps; ++r) {  // r = -1: warm-up (the small pool into L2)
    CUDA_OK(cudaEventRecord(a));
    gather_kernel<W><<<sms, 128 * W, smem>>>(pool.bytes, slots, blocks, out, cycles);
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
  std::printf("%-6s %2d %5d %9.1f %9.0f %8.1f\n", pool.name, W, smem / 1024,
              double(keys) * (kRowBytes + kScaleBytes) / median_s * 1e-9, mean_cycles / blocks,
              ms[reps / 2] * 1e3);
  CUDA_OK(cudaFree(slots));
  CUDA_OK(cudaFree(out));
  CUDA_OK(cudaFree(cycles));
  CUDA_OK(cudaEventDestroy(a));
  CUDA_OK(cudaEventDestroy(b));
}

// Table 2's row: the producer's loop on one CTA per SM, R reader warpgroups beside it; flush
// (256 MiB, or nullptr for a warm L2) written before each launch.
using PipelineKernel = void (*)(const uint8_t*, const int32_t*, int, uint32_t*, long long*);
void run_pipeline(const Pool& pool, int sms, int blocks, int reps, uint8_t* flush,
                  std::mt19937* rng, const char* how, int readers, PipelineKernel kernel,
                  int smem) {
  const int64_t keys = int64_t{sms} * blocks * kBlockKeys;
  int32_t* slots = random_slots(pool, keys, rng);
  uint32_t* out = nullptr;
  long long* cycles = nullptr;
  CUDA_OK(cudaMalloc(&out, int64_t{sms} * 128 * (readers + 1) * sizeof(uint32_t)));
  CUDA_OK(cudaMalloc(&cycles, sms * sizeof(long long)));
  CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  std::vector<double> per_block(reps);
  std::vector<long long> cyc(sms);
  for (int r = -1; r < reps; ++r) {  // r = -1: warm-up
    if (flush != nullptr) CUDA_OK(cudaMemset(flush, r & 0xff, kFlushBytes));
    kernel<<<sms, 128 * (readers + 1), smem>>>(pool.bytes, slots, blocks, out, cycles);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaMemcpy(cyc.data(), cycles, sms * sizeof(long long), cudaMemcpyDeviceToHost));
    if (r < 0) continue;
    double mean = 0;
    for (long long c : cyc) mean += double(c) / sms;
    per_block[r] = mean / blocks;
  }
  std::sort(per_block.begin(), per_block.end());
  std::printf("%-6s %-7s %-11s %7d %9.0f\n", pool.name, flush != nullptr ? "flushed" : "warm", how,
              readers, per_block[reps / 2]);
  CUDA_OK(cudaFree(slots));
  CUDA_OK(cudaFree(out));
  CUDA_OK(cudaFree(cycles));
}

}  // namespace

int main(int argc, char** argv) {
  int blocks = 64, reps = 10, smem_kb = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--blocks") && i + 1 < argc) {
      blocks = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--smem-kb") && i + 1 < argc) {
      smem_kb = std::clamp(std::atoi(argv[++i]), 0, 227);
    } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--blocks N] [--smem-kb N] [--reps N]\n", argv[0]);
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
  std::printf("%-6s %2s %5s %9s %9s %8s\n", "pool", "W", "smem", "GB/s", "cyc/blk", "us");
  const int sms = prop.multiProcessorCount;
  const int smem = smem_kb * 1024;
  for (auto f : {&gather_kernel<1>, &gather_kernel<2>, &gather_kernel<4>, &gather_kernel<8>}) {
    CUDA_OK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  }
  for (const Pool& p : {Pool{"19MB", pool, small_slots}, Pool{"2.4GB", pool, large_slots}}) {
    run<1>(p, sms, blocks, smem, reps, &rng);
    run<2>(p, sms, blocks, smem, reps, &rng);
    run<4>(p, sms, blocks, smem, reps, &rng);
    run<8>(p, sms, blocks, smem, reps, &rng);
  }
  std::printf("\nthe producer's loop, one CTA per SM (cycles per block, median of %d runs)\n",
              reps);
  std::printf("%-6s %-7s %-11s %7s %9s\n", "pool", "L2", "bytes", "readers", "cyc/blk");
  uint8_t* flush = nullptr;
  CUDA_OK(cudaMalloc(&flush, kFlushBytes));
  for (const Pool& p : {Pool{"19MB", pool, small_slots}, Pool{"2.4GB", pool, large_slots}}) {
    for (uint8_t* f : {static_cast<uint8_t*>(nullptr), flush}) {
      const auto row = [&](const char* how, int readers, PipelineKernel k, int smem) {
        run_pipeline(p, sms, blocks, reps, f, &rng, how, readers, k, smem);
      };
      row("registers", 0, &pipeline_kernel<0>, kPipelineSmem);
      row("registers", 2, &pipeline_kernel<2>, kPipelineSmem);
      row("cp.async 2", 0, &staged_kernel<0, 2>, staged_smem<2>());
      row("cp.async 2", 2, &staged_kernel<2, 2>, staged_smem<2>());
      row("cp.async 3", 0, &staged_kernel<0, 3>, staged_smem<3>());
      row("cp.async 3", 2, &staged_kernel<2, 3>, staged_smem<3>());
    }
  }
  CUDA_OK(cudaFree(flush));
  CUDA_OK(cudaFree(pool));
  return 0;
}
