// SPDX-License-Identifier: Apache-2.0
// Random attention problems for the CUDA-vs-CPU tests (tests/attention/*_cuda_test.cc): paged
// caches and index rows on the host with poison where no valid entry may reach, and their device
// copies with poisoned outputs. Needs the CUDA runtime: only CUDA builds include it.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "common/fp8_e4m3.h"
#include "sparse_swa/attention.h"
#include "support/device_array.h"

namespace sparse_swa::testing {

constexpr int32_t kPoisonSlots = 16;  // slots [0, 16) hold NaN / huge keys, never inside lens
constexpr CacheDtype kDs = CacheDtype::kFp8DsMla;
constexpr CacheDtype kBf = CacheDtype::kBf16;
constexpr CacheDtype kE4 = CacheDtype::kFp8E4m3;

// One paged cache on the host: num_slots random keys (row scales vary), slots [0, 16) poisoned.
struct HostCache {
  HostCache(CacheDtype dtype, int32_t block_size, int64_t min_slots, uint32_t seed)
      : dtype(dtype), block_size(block_size) {
    num_blocks = (std::max<int64_t>(min_slots, 2 * kPoisonSlots) + block_size - 1) / block_size;
    // Tight page plus 48 bytes: the stride must come from the view, never from B * 584.
    stride = (block_size * cache_token_bytes(dtype) + 15) / 16 * 16 + 48;
    bytes.assign(num_blocks * stride, 0x5c);
    const int64_t n = num_blocks * block_size;
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> rows(n * kHeadDim);
    for (int64_t s = 0; s < n; ++s) {
      const float scale = s < kPoisonSlots ? 0.0f : 0.25f + 0.75f * (s % 5);
      for (int d = 0; d < kHeadDim; ++d) {
        float v = normal(rng) * scale;
        if (s < kPoisonSlots) v = (s + d) % 2 ? std::nanf("") : 3e38f;
        rows[s * kHeadDim + d] = v;
      }
    }
    std::vector<int64_t> slots(n);
    for (int64_t s = 0; s < n; ++s) slots[s] = s;
    const Status st = encode_kv_rows({rows.data(), n, kHeadDim, kHeadDim}, slots, view());
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
  KvCacheView view() {
    return {bytes.data(), num_blocks, block_size, stride, dtype, MemorySpace::kHost};
  }
  int64_t num_slots() const { return num_blocks * block_size; }

  CacheDtype dtype;
  int32_t block_size;
  int64_t num_blocks = 0, stride = 0;
  std::vector<uint8_t> bytes;
};

struct IndexRows {
  IndexRows(int64_t rows, int32_t width, int32_t stride)
      : rows(rows),
        width(width),
        stride(stride),
        data(std::max<int64_t>(1, rows * stride), -1),
        lens(std::max<int64_t>(1, rows), 0) {}
  ConstIndexView view() const {
    return {data.data(), lens.data(), rows, width, stride, width, MemorySpace::kHost};
  }
  int64_t rows;
  int32_t width, stride;
  std::vector<int32_t> data, lens;
};

// Random rows: lens 0 / full / uniform, 5% -1 holes inside the length, garbage past it
// (poison slots, ids past the cache, INT32_MAX, other negatives).
inline void fill_rows(IndexRows* r, int64_t num_slots, std::mt19937* rng) {
  std::uniform_int_distribution<int64_t> slot(kPoisonSlots, num_slots - 1);
  for (int64_t t = 0; t < r->rows; ++t) {
    const uint32_t pick = (*rng)() % 10;
    int32_t len =
        pick == 0 ? 0 : (pick < 4 ? r->width : static_cast<int32_t>((*rng)() % (r->width + 1)));
    r->lens[t] = len;
    int32_t* row = r->data.data() + t * r->stride;
    for (int32_t j = 0; j < r->stride; ++j) {
      if (j < len) {
        row[j] = (*rng)() % 20 == 0 ? -1 : static_cast<int32_t>(slot(*rng));
      } else {
        const int32_t garbage[] = {static_cast<int32_t>((*rng)() % kPoisonSlots),
                                   static_cast<int32_t>(num_slots + j),
                                   std::numeric_limits<int32_t>::max(), -5, -1};
        row[j] = garbage[(*rng)() % 5];
      }
    }
  }
}

// Query groups of g rows (MTP / DSpark), over fill_rows' lens and garbage: a group's first row
// draws distinct slots (5% -1 holes); each later row takes most of its entries from the row
// before, one place on (a window that moves, a top-k that overlaps), where that row has a valid
// entry there, else fresh slots of the group's draw. No row repeats a slot, but in every third
// group, where some entries repeat their neighbour (a key listed twice by one token).
inline void share_within_groups(IndexRows* r, int64_t num_slots, int32_t g, std::mt19937* rng) {
  std::vector<int32_t> perm(num_slots - kPoisonSlots);
  std::iota(perm.begin(), perm.end(), kPoisonSlots);
  size_t next = perm.size();
  for (int64_t t = 0; t < r->rows; ++t) {
    if (t % g == 0) {  // a new group: a new draw
      std::shuffle(perm.begin(), perm.end(), *rng);
      next = 0;
    }
    const bool repeats = (t / g) % 3 == 0;
    const int32_t* prev = r->data.data() + (t - 1) * r->stride;
    int32_t* row = r->data.data() + t * r->stride;
    for (int32_t j = 0; j < r->lens[t]; ++j) {
      const uint32_t pick = (*rng)() % 20;
      if (pick == 0) {
        row[j] = -1;
      } else if (repeats && pick == 1 && j > 0) {
        row[j] = row[j - 1];
      } else if (t % g != 0 && pick < 16 && j + 1 < r->lens[t - 1] && prev[j + 1] >= 0) {
        row[j] = prev[j + 1];
      } else {
        row[j] = next < perm.size() ? perm[next++] : -1;
      }
    }
  }
}

inline std::vector<uint16_t> random_q(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> q(n * kHeadDim);
  for (uint16_t& v : q) {
    float x = normal(rng);
    if (x == 0.0f) x = 0.5f;
    v = fp8::float_to_bf16(x);
  }
  return q;
}

// Device copies of a host problem; params() is the same call on device memory.
class DeviceProblem {
 public:
  DeviceProblem(const SparseAttentionParams& hp, const HostCache& swa, const IndexRows& swa_rows,
                const HostCache* extra, const IndexRows* extra_rows, const std::vector<uint16_t>& q,
                const std::vector<float>& sinks, bool with_workspace = false)
      : swa_cache_(swa.bytes),
        swa_idx_(swa_rows.data),
        swa_lens_(swa_rows.lens),
        extra_cache_(extra ? extra->bytes : std::vector<uint8_t>{}),
        extra_idx_(extra_rows ? extra_rows->data : std::vector<int32_t>{}),
        extra_lens_(extra_rows ? extra_rows->lens : std::vector<int32_t>{}),
        q_(q),
        sinks_(sinks),
        out_(q.size()),
        lse_(hp.num_tokens * hp.num_heads),
        bad_(1) {
    p_ = hp;
    p_.q = q_.get();
    p_.out = out_.get();
    p_.lse = lse_.get();
    p_.sinks = hp.sinks ? sinks_.get() : nullptr;
    p_.swa_cache.data = swa_cache_.get();
    p_.swa_cache.space = MemorySpace::kDevice;
    p_.swa_indices.data = swa_idx_.get();
    p_.swa_indices.lens = swa_lens_.get();
    p_.swa_indices.space = MemorySpace::kDevice;
    if (extra_rows != nullptr) {
      p_.extra_cache.data = extra_cache_.get();
      p_.extra_cache.space = MemorySpace::kDevice;
      p_.extra_indices.data = extra_idx_.get();
      p_.extra_indices.lens = extra_lens_.get();
      p_.extra_indices.space = MemorySpace::kDevice;
    }
    EXPECT_EQ(cudaMemset(bad_.get(), 0, sizeof(int32_t)), cudaSuccess);
    p_.bad_index_count = bad_.get();
    if (with_workspace) {
      const int64_t bytes = sparse_attention_workspace_bytes(p_);
      workspace_ = std::make_unique<DeviceArray<uint8_t>>(static_cast<size_t>(bytes));
      workspace_->poison();
      p_.workspace = workspace_->get();
      p_.workspace_bytes = bytes;
    }
    out_.poison();
    lse_.poison();
  }
  const SparseAttentionParams& params() const { return p_; }
  std::vector<uint16_t> out() const { return out_.download(); }
  std::vector<float> lse() const { return lse_.download(); }
  int32_t bad_count() const { return bad_.download()[0]; }
  DeviceArray<int32_t>& swa_idx() { return swa_idx_; }
  DeviceArray<int32_t>& swa_lens() { return swa_lens_; }
  void poison_outputs() {
    out_.poison();
    lse_.poison();
  }

 private:
  DeviceArray<uint8_t> swa_cache_;
  DeviceArray<int32_t> swa_idx_, swa_lens_;
  DeviceArray<uint8_t> extra_cache_;
  DeviceArray<int32_t> extra_idx_, extra_lens_;
  DeviceArray<uint16_t> q_;
  DeviceArray<float> sinks_;
  DeviceArray<uint16_t> out_;
  DeviceArray<float> lse_;
  DeviceArray<int32_t> bad_;
  std::unique_ptr<DeviceArray<uint8_t>> workspace_;
  SparseAttentionParams p_;
};

inline int sm_count() {
  int device = 0, sms = 0;
  EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  return sms;
}

// True when the call these device params describe runs a pair kernel, which rounds P to bf16
// once (the comparison's wider bound).
inline bool rounds_p(const SparseAttentionParams& device_params) {
  return sparse_attention_kernel(device_params) == AttentionKernel::kSm90Pairs;
}

// A small fixed problem for the behaviour tests.
struct SmallProblem {
  SmallProblem(int32_t heads, int32_t tokens, int32_t width, CacheDtype dtype = kDs)
      : cache(dtype, 64, 256, 99),
        rows(tokens, width, width),
        q(random_q(int64_t{tokens} * heads, 98)) {
    std::mt19937 rng(97);
    fill_rows(&rows, cache.num_slots(), &rng);
    hp.num_tokens = tokens;
    hp.num_heads = heads;
    hp.q = q.data();
    hp.swa_cache = cache.view();
    hp.swa_indices = rows.view();
  }
  HostCache cache;
  IndexRows rows;
  std::vector<uint16_t> q;
  SparseAttentionParams hp;
};

}  // namespace sparse_swa::testing
