// SPDX-License-Identifier: Apache-2.0
// Dispatch-width policy: what a consumer kernel accepts, so that the producer emits exactly the
// widths the consumer can run (a width the kernel library never instantiated aborts inside it)
// and a configuration that no kernel can serve fails at start-up, naming the shape
// (docs/semantics.md#dispatch-policy).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sparse_swa/config.h"
#include "sparse_swa/status.h"

namespace sparse_swa {

// One kernel launch shape.
struct DispatchTuple {
  int32_t heads = 0;                  // query heads the kernel runs with (after padding)
  int32_t topk = 0;                   // SWA index row width (mixed layout: the whole row)
  int32_t page_block_size = 0;        // tokens per SWA KV page
  int32_t extra_topk = 0;             // compressed index row width; 0 = no compressed cache
  int32_t extra_page_block_size = 0;  // compressed entries per page; 0 = no compressed cache
  bool operator==(const DispatchTuple&) const = default;
};
// "heads 64, topk 192, page_block_size 64, extra_topk 512, extra_page_block_size 64"
std::string to_string(const DispatchTuple& t);

// The accepted values of one field: an explicit list, or every multiple of `multiple` in
// [min, max].
struct AcceptedValues {
  std::vector<int32_t> values;  // non-empty: exactly these
  int32_t multiple = 1;
  int32_t min = 1;
  int32_t max = std::numeric_limits<int32_t>::max();

  static AcceptedValues any() { return {}; }
  static AcceptedValues list(std::vector<int32_t> v) { return {std::move(v)}; }
  static AcceptedValues multiple_of(int32_t m) { return {{}, m}; }

  bool accepts(int32_t v) const;
  std::optional<int32_t> smallest_at_least(int32_t v) const;
  // "{128, 192, 256}", "multiples of 64", "any".
  std::string describe() const;
};

// A set of accepted tuples: the product of its fields. The extra_* fields are only checked when
// the tuple has a compressed cache (extra_topk > 0); every kernel accepts "no compressed cache".
struct DispatchRule {
  AcceptedValues heads;
  AcceptedValues topk;
  AcceptedValues page_block_size;
  AcceptedValues extra_topk;
  AcceptedValues extra_page_block_size;

  bool accepts(const DispatchTuple& t) const;
  std::string describe() const;
};

// How the kernel reads the indices, which decides the tuples a configuration produces.
enum class IndexLayout {
  kSeparate,  // SWA rows (topk) and compressed rows (extra_topk) as two matrices
  kMixed,     // one [T, S + P] matrix (build_mixed_matrix): topk = its row width, no extra
  kRagged,    // CSR (to_ragged): topk = the dense row width it was packed from
};
const char* index_layout_name(IndexLayout layout);

struct DispatchPolicy {
  std::string name;
  IndexLayout layout = IndexLayout::kSeparate;
  // True when the prefill SWA rows (W + Mi wide) go to a kernel of this policy too; false when
  // only decode rows do (prefill goes through the workspace combine).
  bool reads_prefill_rows = false;
  // Accepted iff some rule accepts (and the predicate, when set). No rules and no predicate
  // accepts nothing.
  std::vector<DispatchRule> rules;
  std::function<bool(const DispatchTuple&)> predicate;  // optional, e.g. a library's envelope
  std::string predicate_description;
  int32_t max_topk = 1 << 20;  // choose_width never searches past this

  bool accepts(const DispatchTuple& t) const;
  std::string describe() const;
};

// Built-in policies, as data (docs/semantics.md#dispatch-policy):
//   flashmla_sparse_decode   heads 64: topk and extra_topk multiples of 64; heads 128: of 128
//   flashinfer_sm120_decode  topk in {128, 192, 256, 512, 1024} x heads {8, 16, 32, 64, 128},
//                            extra_topk multiples of 64 (64-entry tiles)
//   flashinfer_sm100         mixed layout, heads {8, 16, 32, 64, 128}, any row multiple of 4
//   rocm_ragged              ragged layout, anything
//   sparse_swa               our own kernels, anything
std::vector<std::string> builtin_policy_names();
StatusOr<DispatchPolicy> builtin_policy(std::string_view name);

// The smallest width >= needed that `policy` accepts with the other fields of `shape` (its topk
// is ignored; heads or page_block_size 0 match any rule, extra_topk 0 means no compressed
// cache). The columns past `needed` are -1 and masked by lens. Error: lists the accepted widths.
StatusOr<int32_t> choose_width(int32_t needed, const DispatchPolicy& policy,
                               const DispatchTuple& shape = {});

// Deployment facts a BuilderConfig does not hold.
struct DeploymentShape {
  int32_t heads = 64;             // query heads per rank as the kernel runs them
  int32_t attn_block_size = 256;  // main-model KV block; compressed page = this / ratio
  int32_t indexer_topk = 512;     // C2A/C4A indexer top-k (decode extra_topk, prefill TOP_K)
};

// One tuple a configuration can produce and whether the policy accepts it.
struct TupleCheck {
  std::string source;  // "decode causal swaonly", "decode non-causal (dspark) c4a", ...
  DispatchTuple tuple;
  bool accepted = false;
};

// Every tuple `config` can make `policy`'s kernels see, per layer type: causal decode rows (W;
// MTP drafts included), DSpark non-causal rows (Wn), and, when the policy reads prefill rows,
// prefill rows (W + Mi on vision configs). Mixed layout: one row width per decode width. C128A
// extra_topk = round_up(ceil(max_model_len / 128), 128). Errors: invalid config or shape.
StatusOr<std::vector<TupleCheck>> enumerate_dispatch_tuples(const BuilderConfig& config,
                                                            const DispatchPolicy& policy,
                                                            const DeploymentShape& shape);
// Fails naming the first tuple the policy rejects ("dispatch policy flashmla_sparse_decode
// rejects decode non-causal (dspark) swaonly: heads 128, topk 192, ...; accepted: ...").
Status validate_config(const BuilderConfig& config, const DispatchPolicy& policy,
                       const DeploymentShape& shape);

// For BuilderConfig::noncausal_index_width: the non-causal (DSpark) row width the policy
// accepts, >= W + decode threshold (the widest row a draft block can produce;
// docs/semantics.md#dspark-width).
StatusOr<int32_t> choose_noncausal_width(const BuilderConfig& config, const DispatchPolicy& policy,
                                         const DeploymentShape& shape);

}  // namespace sparse_swa
