// SPDX-License-Identifier: Apache-2.0
#include "sparse_swa/config.h"

#include <algorithm>
#include <limits>

#include "common/int_limits.h"
#include "common/swa_formulas.h"

namespace sparse_swa {

namespace {
// A row's width must fit int32 with room for window arithmetic.
constexpr int64_t kMaxRowWidth = int64_t{1} << 24;
// Largest persistent index buffer (elements) the builder will allocate.
constexpr int64_t kMaxBufferElements = int64_t{1} << 31;
constexpr int64_t kDsparkAlignment = 64;
// Bounds that keep every persistent buffer allocatable (8 GiB in all at most).
constexpr int64_t kMaxNumSeqs = int64_t{1} << 24;
constexpr int64_t kMaxBufferBytes = int64_t{8} << 30;
// Mapping, validity, lens, visibility, spans and the FlashInfer decode lens.
constexpr int64_t kPerTokenArrays = 10;
// Span indptr, gather lens, host plan copies, replay_start and its private copy.
constexpr int64_t kPerRequestArrays = 8;
}  // namespace

std::vector<std::string> LayerTypeSet::sorted_names() const {
  std::vector<std::string> names;
  for (int i = 0; i < kNumLayerTypes; ++i) {
    const auto t = static_cast<LayerType>(i);
    if (contains(t)) names.emplace_back(layer_type_name(t));
  }
  std::sort(names.begin(), names.end());
  return names;
}

const char* layer_type_name(LayerType t) {
  switch (t) {
    case LayerType::kSwaOnly:
      return "swaonly";
    case LayerType::kC2A:
      return "c2a";
    case LayerType::kC4A:
      return "c4a";
    case LayerType::kC128A:
      return "c128a";
  }
  return "unknown";
}

const char* speculative_method_name(SpeculativeMethod m) {
  switch (m) {
    case SpeculativeMethod::kNone:
      return "none";
    case SpeculativeMethod::kMtp:
      return "mtp";
    case SpeculativeMethod::kDspark:
      return "dspark";
  }
  return "unknown";
}

StatusOr<SpeculativeMethod> parse_speculative_method(std::string_view name) {
  if (name == "none") return SpeculativeMethod::kNone;
  if (name == "mtp") return SpeculativeMethod::kMtp;
  if (name == "dspark") return SpeculativeMethod::kDspark;
  return invalid_argument("config.speculative_method: expected one of none, mtp, dspark, got \"",
                          printable_excerpt(name), "\"");
}

StatusOr<LayerType> layer_type_for_ratio(int64_t compress_ratio, std::string_view field) {
  switch (compress_ratio) {
    case 1:
      return LayerType::kSwaOnly;
    case 2:
      return LayerType::kC2A;
    case 4:
      return LayerType::kC4A;
    case 128:
      return LayerType::kC128A;
    default:
      return invalid_argument(field, ": expected a compress ratio in {1, 2, 4, 128}, got ",
                              compress_ratio);
  }
}

int64_t decode_threshold_of(const BuilderConfig& c) {
  const int64_t k = c.num_speculative_tokens;
  // Model runner V1's parallel drafter appends up to k mask slots to a verified request.
  return 1 + k + (c.parallel_drafting && !c.model_runner_v2 ? k : 0);
}

int32_t reference_noncausal_width(int32_t window_size, int32_t num_speculative_tokens) {
  const int64_t w = std::max(window_size, 0) + int64_t{std::max(num_speculative_tokens, 0)};
  return static_cast<int32_t>(formulas::round_up(w, kDsparkAlignment));
}

Status validate_config(const BuilderConfig& c) {
  auto at_least = [](std::string_view field, int64_t value, int64_t min) -> Status {
    if (value < min)
      return invalid_argument("config.", field, ": expected >= ", min, ", got ", value);
    return Status::Ok();
  };
  SPARSE_SWA_RETURN_IF_ERROR(at_least("window_size", c.window_size, 1));
  SPARSE_SWA_RETURN_IF_ERROR(at_least("block_size", c.block_size, 1));
  SPARSE_SWA_RETURN_IF_ERROR(at_least("max_num_batched_tokens", c.max_num_batched_tokens, 1));
  SPARSE_SWA_RETURN_IF_ERROR(at_least("max_num_seqs", c.max_num_seqs, 1));
  SPARSE_SWA_RETURN_IF_ERROR(at_least("max_model_len", c.max_model_len, 1));
  SPARSE_SWA_RETURN_IF_ERROR(at_least("num_speculative_tokens", c.num_speculative_tokens, 0));
  SPARSE_SWA_RETURN_IF_ERROR(at_least("max_image_tokens", c.max_image_tokens, 0));
  if (c.speculative_method == SpeculativeMethod::kNone) {
    if (c.num_speculative_tokens != 0) {
      return invalid_argument(
          "config.num_speculative_tokens: expected 0 with speculative_method none, got ",
          c.num_speculative_tokens);
    }
    if (c.parallel_drafting) {
      return invalid_argument(
          "config.parallel_drafting: expected false with speculative_method none, got true");
    }
  }
  for (size_t i = 0; i < c.compress_ratios.size(); ++i) {
    auto type =
        layer_type_for_ratio(c.compress_ratios[i], str_cat("config.compress_ratios[", i, "]"));
    SPARSE_SWA_RETURN_IF_ERROR(type.status());
  }
  // Widths: W + Mi (prefill rows) and W + theta rounded to 64 (non-causal rows) must stay small.
  const int64_t theta = decode_threshold_of(c);
  const int64_t image_width = c.widen_image_spans ? c.max_image_tokens : 0;
  const int64_t widest = std::max<int64_t>(
      c.window_size + image_width,
      formulas::round_up(c.window_size + std::max<int64_t>(theta, c.num_speculative_tokens), 64));
  if (widest > kMaxRowWidth) {
    return invalid_argument(
        "config: the widest index row (window_size + max_image_tokens or "
        "window_size + decode threshold) must be <= ",
        kMaxRowWidth, ", got ", widest);
  }
  if (widest * c.max_num_batched_tokens > kMaxBufferElements) {
    return invalid_argument("config.max_num_batched_tokens: ", c.max_num_batched_tokens,
                            " rows of width ", widest, " exceed the ", kMaxBufferElements,
                            "-element index buffer limit");
  }
  if (c.noncausal_index_width != 0) {
    if (c.speculative_method != SpeculativeMethod::kDspark) {
      return invalid_argument(
          "config.noncausal_index_width: only DSpark has non-causal rows; "
          "expected 0 with speculative_method ",
          speculative_method_name(c.speculative_method), ", got ", c.noncausal_index_width);
    }
    const int64_t needed = c.window_size + theta;
    if (c.noncausal_index_width < needed || c.noncausal_index_width > kMaxRowWidth) {
      return invalid_argument(
          "config.noncausal_index_width: expected window_size + decode "
          "threshold = ",
          needed, " .. ", kMaxRowWidth,
          " (a non-causal row holds up to W + "
          "theta entries), got ",
          c.noncausal_index_width);
    }
    if (int64_t{c.noncausal_index_width} * c.max_num_batched_tokens > kMaxBufferElements) {
      return invalid_argument("config.noncausal_index_width: ", c.noncausal_index_width,
                              " x max_num_batched_tokens exceeds the ", kMaxBufferElements,
                              "-element index buffer limit");
    }
  }
  if (c.max_num_seqs > kMaxNumSeqs) {
    return invalid_argument("config.max_num_seqs: expected <= ", kMaxNumSeqs, ", got ",
                            c.max_num_seqs);
  }
  // Every persistent buffer together (index rows of each kind, per-token and per-request
  // arrays) must stay within one budget, so that a valid config cannot exhaust memory.
  const int64_t noncausal_width =
      c.speculative_method == SpeculativeMethod::kDspark
          ? std::max<int64_t>(
                c.noncausal_index_width,
                formulas::round_up(
                    c.window_size + std::max<int64_t>(theta, c.num_speculative_tokens), 64))
          : 0;
  const int64_t row_elements =
      c.window_size + noncausal_width + c.window_size + image_width + kPerTokenArrays;
  const int64_t total_bytes =
      4 * (row_elements * c.max_num_batched_tokens + kPerRequestArrays * int64_t{c.max_num_seqs});
  if (total_bytes > kMaxBufferBytes) {
    return invalid_argument("config: the builder's buffers for max_num_batched_tokens = ",
                            c.max_num_batched_tokens, " and max_num_seqs = ", c.max_num_seqs,
                            " would take ", total_bytes, " bytes; expected <= ", kMaxBufferBytes);
  }
  if (c.max_model_len > kInt32Max) {
    return invalid_argument("config.max_model_len: expected <= ", kInt32Max, ", got ",
                            c.max_model_len);
  }
  return Status::Ok();
}

DerivedConfig derive_config(const BuilderConfig& c) {
  DerivedConfig d;
  d.decode_threshold = static_cast<int32_t>(decode_threshold_of(c));
  d.widens_images = c.widen_image_spans && c.max_image_tokens > 0;
  d.prefill_index_width = c.window_size + (d.widens_images ? c.max_image_tokens : 0);
  d.is_dspark = c.speculative_method == SpeculativeMethod::kDspark;
  if (d.is_dspark && c.noncausal_index_width != 0) {
    d.noncausal_index_width = c.noncausal_index_width;
  } else if (d.is_dspark) {
    // A non-causal row holds min(prefix, W) + query_len <= W + theta entries; the reference's
    // round_up(W + k, 64) alone truncates rows when W + k is a multiple of 64.
    d.noncausal_index_width =
        std::max(reference_noncausal_width(c.window_size, c.num_speculative_tokens),
                 static_cast<int32_t>(formulas::round_up(c.window_size + d.decode_threshold, 64)));
  }
  if (c.compress_ratios.empty()) {
    d.layer_types.insert(LayerType::kSwaOnly);
  } else {
    for (int32_t r : c.compress_ratios) d.layer_types.insert(layer_type_for_ratio(r, "").value());
  }
  return d;
}

}  // namespace sparse_swa
