// SPDX-License-Identifier: Apache-2.0
// Builder configuration: validated once, at construction; everything derived from it lives here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sparse_swa/status.h"

namespace sparse_swa {

enum class SpeculativeMethod { kNone, kMtp, kDspark };

// DeepSeek-V4 decode layer types; each needs its own FlashMLA tile-scheduler plan per step.
enum class LayerType : uint8_t { kSwaOnly = 0, kC2A = 1, kC4A = 2, kC128A = 3 };
inline constexpr int kNumLayerTypes = 4;

// A small set of layer types, iterated in the order of LayerType.
class LayerTypeSet {
 public:
  void insert(LayerType t) { bits_ |= 1u << static_cast<unsigned>(t); }
  bool contains(LayerType t) const { return bits_ & (1u << static_cast<unsigned>(t)); }
  bool empty() const { return bits_ == 0; }
  bool operator==(const LayerTypeSet&) const = default;
  // Names sorted alphabetically, as the JSON contract prints them ("c128a", "c4a", "swaonly").
  std::vector<std::string> sorted_names() const;

 private:
  unsigned bits_ = 0;
};

const char* layer_type_name(LayerType t);
const char* speculative_method_name(SpeculativeMethod m);
StatusOr<SpeculativeMethod> parse_speculative_method(std::string_view name);
// 1 -> swaonly, 2 -> c2a, 4 -> c4a, 128 -> c128a; anything else is an error naming the value.
StatusOr<LayerType> layer_type_for_ratio(int64_t compress_ratio, std::string_view field);

struct BuilderConfig {
  int32_t window_size = 0;             // W >= 1, the logical sliding window
  int32_t block_size = 0;              // B >= 1, tokens per SWA KV page
  int32_t max_num_batched_tokens = 0;  // row capacity of every per-token buffer
  int32_t max_num_seqs = 0;            // request capacity
  int64_t max_model_len = 0;
  int32_t num_speculative_tokens = 0;  // k >= 0
  SpeculativeMethod speculative_method = SpeculativeMethod::kNone;
  bool parallel_drafting = false;
  // The engine's model runner: false (V1) counts the parallel drafter's k mask slots in theta,
  // true (V2) does not (docs/semantics.md#decode-threshold).
  bool model_runner_v2 = false;
  int32_t max_image_tokens = 0;  // Mi >= 0, the longest image span
  // True (DeepSeek-V4 vision): prefill rows are W + Mi wide and image spans widen windows.
  // False (DeepSeek-V4.1 vision): rows of width W, plain causal windows, image spans ignored
  // (docs/semantics.md#image-widening-switch).
  bool widen_image_spans = true;
  std::vector<int32_t> compress_ratios;  // each in {1, 2, 4, 128}; empty means {1}
  // DSpark non-causal row width; 0 derives it (see DerivedConfig). A consumer that accepts only
  // some widths sets it from its dispatch policy (choose_noncausal_width in dispatch_policy.h),
  // so the producer writes exactly what the consumer reads. Must be >= W + theta.
  int32_t noncausal_index_width = 0;
  // Also write flashinfer_decode_topk_lens / flashinfer_decode_seq_lens on non-causal steps
  // (the FlashInfer DSpark decode's per-token lens; docs/semantics.md#flashinfer-decode-lens).
  bool flashinfer_decode_lens = false;
};

// theta = 1 + k, plus k more for parallel drafting on model runner V1 (int64: validate_config
// calls it before the ranges are known).
int64_t decode_threshold_of(const BuilderConfig& config);

// Everything the builder derives from a valid config.
struct DerivedConfig {
  int32_t decode_threshold = 1;     // theta = decode_threshold_of(config)
  int32_t prefill_index_width = 0;  // W + Mi when widening image spans, else W
  bool widens_images = false;       // widen_image_spans and Mi > 0: the image path can run
  // DSpark: config.noncausal_index_width if set, else
  // max(round_up(W + k, 64), round_up(W + theta, 64)) (docs/semantics.md#dspark-width).
  int32_t noncausal_index_width = 0;
  LayerTypeSet layer_types;
  bool is_dspark = false;
};

// Validates every field; the message names the field ("config.window_size: ...").
Status validate_config(const BuilderConfig& config);
// Requires a valid config.
DerivedConfig derive_config(const BuilderConfig& config);

// The reference's get_dspark_swa_index_width(W, k) = round_up(W + k, 64); it truncates rows when
// W + theta crosses the next multiple of 64, so the builder uses noncausal_index_width instead
// (docs/semantics.md#dspark-row-width).
int32_t reference_noncausal_width(int32_t window_size, int32_t num_speculative_tokens);

}  // namespace sparse_swa
