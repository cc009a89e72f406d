// SPDX-License-Identifier: Apache-2.0
// Small helpers the libFuzzer targets share: float bit views, rare choices, a seeded generator
// for bulk values and aligned owned bytes.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "sparse_swa/kv_cache.h"

namespace sparse_swa::fuzz {

inline uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}
inline float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

// True with probability p; an exhausted input (ConsumeProbability 0) never picks the rare case.
inline bool rare(FuzzedDataProvider& in, float p) {
  return in.ConsumeProbability<float>() > 1.0f - p;
}

// Bulk values (cache pages, q, rows) come from a generator seeded by the input, so that the
// input's bytes drive the shapes rather than run out on values.
struct Rng {
  uint64_t state;
  uint32_t next() {  // splitmix64
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return static_cast<uint32_t>((z ^ (z >> 31)) >> 32);
  }
  int32_t uniform(int32_t lo, int32_t hi) {  // [lo, hi]
    return lo + static_cast<int32_t>(next() % static_cast<uint32_t>(hi - lo + 1));
  }
};

// `size` bytes, 64-byte aligned, followed by `slack` more (room for views offset to break an
// alignment rule; 0: AddressSanitizer sees any read past `size`), every byte `fill`. An empty
// allocation still gets 16 bytes, so that `data` is a valid, distinct address.
struct AlignedBytes {
  AlignedBytes(size_t n, size_t slack, uint8_t fill)
      : size(n), bytes(n + slack == 0 ? 16 : n + slack) {
    data = static_cast<uint8_t*>(::operator new (bytes, std::align_val_t{64}));
    std::memset(data, fill, bytes);
  }
  ~AlignedBytes() { ::operator delete (data, std::align_val_t{64}); }
  AlignedBytes(const AlignedBytes&) = delete;
  AlignedBytes& operator=(const AlignedBytes&) = delete;
  std::vector<uint8_t> copy() const { return {data, data + bytes}; }
  size_t size;
  size_t bytes;  // allocated: size + slack (16 when both are 0)
  uint8_t* data;
};

// Content bytes per token of each cache dtype, from the layouts in kv_cache.h (written out here
// rather than taken from the library, whose checks the targets test).
inline int64_t layout_token_bytes(CacheDtype d) {
  return d == CacheDtype::kFp8DsMla ? 584 : (d == CacheDtype::kBf16 ? 1024 : 512);
}

}  // namespace sparse_swa::fuzz
