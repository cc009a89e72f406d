// SPDX-License-Identifier: Apache-2.0
// What one enqueue costs on the host, and enqueue + cudaStreamSynchronize end to end, for the
// ways a builder step could be enqueued: a memset node, an empty kernel with a small or a
// parameter block about the builder's size (runtime <<<>>> or the driver's cuLaunchKernel with a
// cached function), and the metadata kernel itself with no rows (through src/backend.h's launch
// probe). Medians of 500 after 50 warm-ups.
//   sparse_swa_cuda_launch_probe
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "backend.h"

namespace {

struct Small {
  int* out;
};
struct Large {  // at least the size of the metadata kernel's parameter block (printed below)
  int* out;
  char pad[256 - sizeof(int*)];
};

__global__ void empty_small(Small p) {
  if (p.out != nullptr && threadIdx.x == 1024) *p.out = 0;
}
__global__ void empty_large(Large p) {
  if (p.out != nullptr && threadIdx.x == 1024) *p.out = p.pad[0];
}

using Clock = std::chrono::steady_clock;
double micros(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void probe(const char* name, cudaStream_t s, const std::function<void()>& enqueue) {
  std::vector<double> host, round_trip, back_to_back;
  for (int i = 0; i < 550; ++i) {
    const auto t0 = Clock::now();
    enqueue();
    const auto t1 = Clock::now();
    cudaStreamSynchronize(s);
    const auto t2 = Clock::now();
    if (i >= 50) {
      host.push_back(micros(t0, t1));
      round_trip.push_back(micros(t0, t2));
    }
  }
  // Enqueues without a sync in between (the GPU busy or the queue non-empty).
  for (int i = 0; i < 550; ++i) {
    const auto t0 = Clock::now();
    enqueue();
    const auto t1 = Clock::now();
    if (i >= 50) back_to_back.push_back(micros(t0, t1));
  }
  cudaStreamSynchronize(s);
  std::printf("%-44s host %6.2f us  round trip %6.2f us  back-to-back host %6.2f us  (%s)\n", name,
              median(host), median(round_trip), median(back_to_back),
              cudaGetErrorString(cudaGetLastError()));
}

}  // namespace

int main() {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  int* word = nullptr;
  cudaMalloc(&word, 4);
  using CuLaunch = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                unsigned, unsigned, CUstream, void**, void**);
  CuLaunch cu_launch = nullptr;
  cudaDriverEntryPointQueryResult q;
  cudaGetDriverEntryPointByVersion("cuLaunchKernel", reinterpret_cast<void**>(&cu_launch), 12000,
                                   cudaEnableDefault, &q);
  cudaFunction_t large_fn = nullptr;
  cudaGetFuncBySymbol(&large_fn, reinterpret_cast<const void*>(empty_large));
  int device = 0;
  cudaGetDevice(&device);
  sparse_swa::detail::MetadataLaunchProbe launcher;
  const sparse_swa::Status probe_status =
      sparse_swa::detail::cuda_init_metadata_launch_probe(&launcher);
  if (!probe_status.ok()) {
    std::printf("%s\n", probe_status.to_string().c_str());
    return 1;
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, device);
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf(
      "%s, driver %d, runtime %d, metadata kernel param block %lld bytes, resident blocks %d\n",
      prop.name, driver, runtime, static_cast<long long>(launcher.params_bytes),
      launcher.resident_blocks);

  const Small small{nullptr};
  Large large{};
  probe("cudaMemsetAsync 4 B", s, [&] { cudaMemsetAsync(word, 0, 4, s); });
  probe("empty kernel, 8 B params, <<<1, 32>>>", s, [&] { empty_small<<<1, 32, 0, s>>>(small); });
  probe("empty kernel, 256 B params, <<<1, 32>>>", s, [&] { empty_large<<<1, 32, 0, s>>>(large); });
  probe("empty kernel, 256 B params, <<<16, 256>>>", s,
        [&] { empty_large<<<16, 256, 0, s>>>(large); });
  probe("empty kernel, 256 B, cuLaunchKernel", s, [&] {
    void* args[] = {&large};
    cu_launch(large_fn, 1, 1, 1, 32, 1, 1, 0, reinterpret_cast<CUstream>(s), args, nullptr);
  });
  probe("metadata kernel, no rows (the builder's launch)", s, [&] {
    (void)sparse_swa::detail::cuda_launch_metadata_kernel_without_rows(launcher, s, true);
  });
  probe("metadata kernel, no rows (<<<>>>)", s, [&] {
    (void)sparse_swa::detail::cuda_launch_metadata_kernel_without_rows(launcher, s, false);
  });
  cudaFree(word);
  cudaStreamDestroy(s);
  return 0;
}
