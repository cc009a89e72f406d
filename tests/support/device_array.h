// SPDX-License-Identifier: Apache-2.0
// Test helpers for the CUDA suites: skipping without a device, and an owned device array (a
// DeviceBuffer of src/cuda/cuda_utils.h that reports failures as test failures).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "cuda/cuda_utils.h"
#include "sparse_swa/metadata_builder.h"

#define SKIP_WITHOUT_GPU() \
  if (!::sparse_swa::cuda_backend_available()) GTEST_SKIP() << "no CUDA device"

namespace sparse_swa::testing {

// A device allocation of n elements of T (at least one).
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    const Status st = buffer_.allocate(std::max<size_t>(n, 1));
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  void upload(const std::vector<T>& host) {
    EXPECT_EQ(cudaMemcpy(get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    EXPECT_EQ(cudaMemcpy(host.data(), get(), n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
  // Fills every byte with 0xff, so a check cannot pass on values an earlier run left.
  void poison() { EXPECT_EQ(cudaMemset(get(), 0xff, buffer_.bytes()), cudaSuccess); }
  T* get() const { return buffer_.get(); }

 private:
  size_t n_;
  detail::DeviceBuffer<T> buffer_;
};

}  // namespace sparse_swa::testing
