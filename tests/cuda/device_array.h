// Test helpers for the CUDA suites: skipping without a device, and an owned device array.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "sparse_swa/metadata_builder.h"

#define SKIP_WITHOUT_GPU() \
  if (!::sparse_swa::cuda_backend_available()) GTEST_SKIP() << "no CUDA device"

namespace sparse_swa::testing {

// A device allocation of n elements of T (at least one).
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p_), std::max<size_t>(n, 1) * sizeof(T)),
              cudaSuccess);
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  void upload(const std::vector<T>& host) {
    EXPECT_EQ(cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    EXPECT_EQ(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
  // Fills every byte with 0xff, so a check cannot pass on values an earlier run left.
  void poison() {
    EXPECT_EQ(cudaMemset(p_, 0xff, std::max<size_t>(n_, 1) * sizeof(T)), cudaSuccess);
  }
  T* get() const { return p_; }

 private:
  size_t n_;
  T* p_ = nullptr;
};

}  // namespace sparse_swa::testing
