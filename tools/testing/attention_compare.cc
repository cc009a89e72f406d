// SPDX-License-Identifier: Apache-2.0
#include "testing/attention_compare.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>

#include "common/fp8_e4m3.h"

namespace sparse_swa::testing {

namespace {

constexpr float kInfF = std::numeric_limits<float>::infinity();

// Tokens [t0, t0 + n) of p (host views).
SparseAttentionParams slice(const SparseAttentionParams& p, int64_t t0, int64_t n) {
  SparseAttentionParams s = p;
  s.num_tokens = n;
  s.q = p.q + t0 * p.num_heads * kHeadDim;
  s.swa_indices.data = p.swa_indices.row(t0);
  s.swa_indices.lens = p.swa_indices.lens + t0;
  s.swa_indices.rows = n;
  if (p.extra_indices.rows != 0) {
    s.extra_indices.data = p.extra_indices.row(t0);
    s.extra_indices.lens = p.extra_indices.lens + t0;
    s.extra_indices.rows = n;
  }
  return s;
}

void parallel_over_tokens(int64_t T, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t workers =
      std::max<int64_t>(1, std::min<int64_t>(T, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (int64_t w = 0; w < workers; ++w) {
    const int64_t b = T * w / workers, e = T * (w + 1) / workers;
    threads.emplace_back([&fn, b, e] {
      if (e > b) fn(b, e);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace

void float_attention_reference(const SparseAttentionParams& p, float* out, float* lse,
                               float* abs_out) {
  std::vector<float> keys;
  std::vector<int64_t> slots;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    keys.clear();
    int64_t n = 0;
    for (int s = 0; s < (p.extra_indices.rows != 0 ? 2 : 1); ++s) {
      const ConstIndexView& v = s == 0 ? p.swa_indices : p.extra_indices;
      const ConstKvCacheView& c = s == 0 ? p.swa_cache : p.extra_cache;
      slots.clear();
      for (int32_t j = 0; j < v.lens[t]; ++j) {
        if (v.row(t)[j] >= 0) slots.push_back(v.row(t)[j]);
      }
      keys.resize((n + slots.size()) * kHeadDim);
      // Slots come from rows the double reference accepts; a failure shows up as NaN keys.
      if (!decode_kv_rows(
               c, slots,
               {keys.data() + n * kHeadDim, static_cast<int64_t>(slots.size()), kHeadDim, kHeadDim})
               .ok()) {
        std::fill(keys.begin() + n * kHeadDim, keys.end(), std::nanf(""));
      }
      n += static_cast<int64_t>(slots.size());
    }
    std::vector<float> score(n), o(kHeadDim), a(kHeadDim);
    for (int32_t h = 0; h < p.num_heads; ++h) {
      float* y = out + (t * p.num_heads + h) * kHeadDim;
      if (n == 0) {
        std::fill(y, y + kHeadDim, 0.0f);
        if (abs_out != nullptr)
          std::fill(abs_out + (y - out), abs_out + (y - out) + kHeadDim, 0.0f);
        lse[t * p.num_heads + h] = kInfF;
        continue;
      }
      const uint16_t* q = p.q + (t * p.num_heads + h) * kHeadDim;
      float m = -kInfF;
      for (int64_t i = 0; i < n; ++i) {
        float dot = 0.0f;
        for (int d = 0; d < kHeadDim; ++d) dot += fp8::bf16_to_float(q[d]) * keys[i * kHeadDim + d];
        score[i] = dot * p.softmax_scale;
        m = std::max(m, score[i]);
      }
      float sum = 0.0f;
      std::fill(o.begin(), o.end(), 0.0f);
      std::fill(a.begin(), a.end(), 0.0f);
      for (int64_t i = 0; i < n; ++i) {
        const float w = std::exp(score[i] - m);
        sum += w;
        for (int d = 0; d < kHeadDim; ++d) {
          o[d] += w * keys[i * kHeadDim + d];
          a[d] += w * std::abs(keys[i * kHeadDim + d]);
        }
      }
      const float l = m + std::log(sum);
      float factor = 1.0f / sum;
      if (p.sinks != nullptr) factor /= 1.0f + std::exp(p.sinks[h] - l);
      for (int d = 0; d < kHeadDim; ++d)
        y[d] = fp8::bf16_to_float(fp8::float_to_bf16(o[d] * factor));
      if (abs_out != nullptr) {
        for (int d = 0; d < kHeadDim; ++d) abs_out[(y - out) + d] = a[d] * factor;
      }
      lse[t * p.num_heads + h] = l;
    }
  }
}

AttentionComparison compare_attention(const SparseAttentionParams& hp,
                                      const std::vector<uint16_t>& cuda_out,
                                      const std::vector<float>& cuda_lse, bool bf16_p) {
  const int64_t n = hp.num_tokens * hp.num_heads;
  std::vector<double> ref(n * kHeadDim), ref_lse(n);
  std::vector<float> fref(n * kHeadDim), fref_lse(n), fref_abs(n * kHeadDim);
  AttentionComparison e;
  std::mutex reference_error_mutex;
  parallel_over_tokens(hp.num_tokens, [&](int64_t b, int64_t end) {
    const SparseAttentionParams s = slice(hp, b, end - b);
    const Status st = sparse_attention_reference(s, ref.data() + b * hp.num_heads * kHeadDim,
                                                 ref_lse.data() + b * hp.num_heads);
    if (!st.ok()) {
      const std::lock_guard<std::mutex> lock(reference_error_mutex);
      if (e.failures++ == 0) e.first_failure = "reference: " + st.to_string();
    }
    float_attention_reference(s, fref.data() + b * hp.num_heads * kHeadDim,
                              fref_lse.data() + b * hp.num_heads,
                              fref_abs.data() + b * hp.num_heads * kHeadDim);
  });
  if (e.failures > 0) return e;
  auto fail = [&](const std::string& what) {
    if (e.failures++ == 0) e.first_failure = what;
  };
  if (static_cast<int64_t>(cuda_out.size()) != n * kHeadDim ||
      static_cast<int64_t>(cuda_lse.size()) != n) {
    fail("output sizes " + std::to_string(cuda_out.size()) + " / " +
         std::to_string(cuda_lse.size()) + " for " + std::to_string(n) + " rows");
    return e;
  }
  for (int64_t i = 0; i < n * kHeadDim; ++i) {
    const double got = fp8::bf16_to_float(cuda_out[i]);
    const double err = std::abs(got - ref[i]);
    const double ferr = std::abs(double{fref[i]} - ref[i]);
    e.max_float_ref_err = std::max(e.max_float_ref_err, ferr);
    // P in bf16: 2^-9 x the weighted mean of |V| at most (docs/design.md#attention-precision),
    // and then the output's own rounding, no longer the fp32 reference's: 2^-9 |out|; each
    // allowed twice over.
    const double p_rounding = bf16_p ? 0x1p-8 * (fref_abs[i] + std::abs(ref[i])) : 0.0;
    if (!(err <= 2 * ferr + p_rounding + 1e-3)) {
      fail("out[" + std::to_string(i / kHeadDim / hp.num_heads) + "][" +
           std::to_string(i / kHeadDim % hp.num_heads) + "][" + std::to_string(i % kHeadDim) +
           "] = " + std::to_string(got) + ", reference " + std::to_string(ref[i]) + ", fp32 ref " +
           std::to_string(fref[i]));
    }
    if (err == err) e.max_err = std::max(e.max_err, err);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (std::isinf(ref_lse[i])) {
      if (cuda_lse[i] != kInfF)
        fail("lse[" + std::to_string(i) + "] expected +inf, got " + std::to_string(cuda_lse[i]));
      continue;
    }
    const double err = std::abs(double{cuda_lse[i]} - ref_lse[i]);
    if (!(err <= 2 * std::abs(double{fref_lse[i]} - ref_lse[i]) + 1e-3)) {
      fail("lse[" + std::to_string(i) + "] = " + std::to_string(cuda_lse[i]) + ", reference " +
           std::to_string(ref_lse[i]));
    }
    if (err == err) e.max_lse_err = std::max(e.max_lse_err, err);
  }
  return e;
}

}  // namespace sparse_swa::testing
