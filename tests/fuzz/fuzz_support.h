// SPDX-License-Identifier: Apache-2.0
// Small helpers the libFuzzer targets share: float bit views and rare choices.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstring>

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

}  // namespace sparse_swa::fuzz
