// SPDX-License-Identifier: Apache-2.0
#include "sparse_swa/dispatch_policy.h"

#include <algorithm>

#include "common/int_limits.h"
#include "common/swa_formulas.h"
#include "sparse_swa/consumers.h"

namespace sparse_swa {

namespace {

std::string join(const std::vector<int32_t>& v) {
  std::string s = "{";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "}";
}

// The heads / page_block_size of a choose_width query match any rule when 0.
bool matches_query(const AcceptedValues& a, int32_t v) { return v == 0 || a.accepts(v); }

bool accepts_extra(const DispatchRule& r, const DispatchTuple& t) {
  if (t.extra_topk == 0) return true;  // no compressed cache
  return r.extra_topk.accepts(t.extra_topk) &&
         (t.extra_page_block_size == 0 || r.extra_page_block_size.accepts(t.extra_page_block_size));
}

const std::vector<int32_t> kFlashInferHeads = {8, 16, 32, 64, 128};

DispatchPolicy flashmla_sparse_decode() {
  DispatchPolicy p;
  p.name = "flashmla_sparse_decode";
  p.layout = IndexLayout::kSeparate;
  // B_TOPK is 64 for the 64-head kernel and 128 for the 128-head one; topk % B_TOPK == 0.
  for (int32_t heads : {64, 128}) {
    DispatchRule r;
    r.heads = AcceptedValues::list({heads});
    r.topk = AcceptedValues::multiple_of(heads);
    r.extra_topk = AcceptedValues::multiple_of(heads);
    p.rules.push_back(r);
  }
  return p;
}

DispatchPolicy flashinfer_sm120_decode() {
  DispatchPolicy p;
  p.name = "flashinfer_sm120_decode";
  p.layout = IndexLayout::kSeparate;
  DispatchRule r;
  r.heads = AcceptedValues::list(kFlashInferHeads);
  // Instantiated decode widths; the kernel library sends any other width of a small decode
  // batch to its prefill path, which aborts.
  r.topk = AcceptedValues::list({128, 192, 256, 512, 1024});
  r.extra_topk = AcceptedValues::multiple_of(64);  // 64-entry tiles
  p.rules.push_back(r);
  return p;
}

DispatchPolicy flashinfer_sm100() {
  DispatchPolicy p;
  p.name = "flashinfer_sm100";
  p.layout = IndexLayout::kMixed;
  p.reads_prefill_rows = true;
  DispatchRule r;
  r.heads = AcceptedValues::list(kFlashInferHeads);
  r.topk = AcceptedValues::multiple_of(4);  // rows start 16-byte aligned
  p.rules.push_back(r);
  return p;
}

DispatchPolicy any_width(std::string name, IndexLayout layout) {
  DispatchPolicy p;
  p.name = std::move(name);
  p.layout = layout;
  p.reads_prefill_rows = true;
  p.rules.push_back(DispatchRule{});
  return p;
}

}  // namespace

std::string to_string(const DispatchTuple& t) {
  return str_cat("heads ", t.heads, ", topk ", t.topk, ", page_block_size ", t.page_block_size,
                 ", extra_topk ", t.extra_topk, ", extra_page_block_size ",
                 t.extra_page_block_size);
}

bool AcceptedValues::accepts(int32_t v) const {
  if (!values.empty()) return std::find(values.begin(), values.end(), v) != values.end();
  return v >= min && v <= max && multiple > 0 && v % multiple == 0;
}

std::optional<int32_t> AcceptedValues::smallest_at_least(int32_t v) const {
  if (!values.empty()) {
    std::optional<int32_t> best;
    for (int32_t x : values) {
      if (x >= v && (!best || x < *best)) best = x;
    }
    return best;
  }
  if (multiple <= 0) return std::nullopt;
  const int64_t c = formulas::round_up(std::max<int64_t>({v, min, 1}), multiple);
  if (c > max || c > kInt32Max) return std::nullopt;
  return static_cast<int32_t>(c);
}

std::string AcceptedValues::describe() const {
  if (!values.empty()) return join(values);
  std::string s = multiple > 1 ? str_cat("multiples of ", multiple) : "any";
  if (min > 1) s += str_cat(" >= ", min);
  if (max < kInt32Max) s += str_cat(" <= ", max);
  return s;
}

bool DispatchRule::accepts(const DispatchTuple& t) const {
  return heads.accepts(t.heads) && topk.accepts(t.topk) &&
         page_block_size.accepts(t.page_block_size) && accepts_extra(*this, t);
}

std::string DispatchRule::describe() const {
  return str_cat("heads ", heads.describe(), ", topk ", topk.describe(), ", page_block_size ",
                 page_block_size.describe(), ", extra_topk ", extra_topk.describe(),
                 " (or none), extra_page_block_size ", extra_page_block_size.describe());
}

const char* index_layout_name(IndexLayout layout) {
  switch (layout) {
    case IndexLayout::kSeparate:
      return "separate";
    case IndexLayout::kMixed:
      return "mixed";
    case IndexLayout::kRagged:
      return "ragged";
  }
  return "unknown";
}

bool DispatchPolicy::accepts(const DispatchTuple& t) const {
  if (rules.empty() && !predicate) return false;
  const bool by_rules =
      rules.empty() ||
      std::any_of(rules.begin(), rules.end(), [&](const DispatchRule& r) { return r.accepts(t); });
  return by_rules && (!predicate || predicate(t));
}

std::string DispatchPolicy::describe() const {
  if (rules.empty() && !predicate) return "nothing";
  std::string s;
  for (size_t i = 0; i < rules.size(); ++i) s += (i ? "; " : "") + rules[i].describe();
  if (predicate) {
    s += (s.empty() ? "" : "; and ") +
         (predicate_description.empty() ? std::string("a predicate") : predicate_description);
  }
  return s;
}

std::vector<std::string> builtin_policy_names() {
  return {"flashmla_sparse_decode", "flashinfer_sm120_decode", "flashinfer_sm100", "rocm_ragged",
          "sparse_swa"};
}

StatusOr<DispatchPolicy> builtin_policy(std::string_view name) {
  if (name == "flashmla_sparse_decode") return flashmla_sparse_decode();
  if (name == "flashinfer_sm120_decode") return flashinfer_sm120_decode();
  if (name == "flashinfer_sm100") return flashinfer_sm100();
  if (name == "rocm_ragged") return any_width("rocm_ragged", IndexLayout::kRagged);
  if (name == "sparse_swa") return any_width("sparse_swa", IndexLayout::kSeparate);
  std::string known;
  for (const auto& n : builtin_policy_names()) known += (known.empty() ? "" : ", ") + n;
  return invalid_argument("consumer: expected one of ", known, ", got \"", name, "\"");
}

StatusOr<int32_t> choose_width(int32_t needed, const DispatchPolicy& policy,
                               const DispatchTuple& shape) {
  if (needed < 1) return invalid_argument("choose_width.needed: expected >= 1, got ", needed);
  // Rules whose other fields fit the query; their topk sets give the candidates.
  std::vector<const DispatchRule*> fitting;
  for (const DispatchRule& r : policy.rules) {
    if (matches_query(r.heads, shape.heads) &&
        matches_query(r.page_block_size, shape.page_block_size) && accepts_extra(r, shape)) {
      fitting.push_back(&r);
    }
  }
  auto query = [&](int32_t topk) {
    DispatchTuple t = shape;
    t.topk = topk;
    return t;
  };
  int32_t from = needed;
  while (from <= policy.max_topk) {
    std::optional<int32_t> best;
    if (policy.rules.empty() && policy.predicate) {
      best = from;  // a pure predicate: try every width
    }
    for (const DispatchRule* r : fitting) {
      const auto c = r->topk.smallest_at_least(from);
      if (c && (!best || *c < *best)) best = c;
    }
    if (!best || *best > policy.max_topk) break;
    if (!policy.predicate || policy.predicate(query(*best))) return *best;
    from = *best + 1;
  }
  std::string accepted;
  for (const DispatchRule* r : fitting) {
    accepted += (accepted.empty() ? "" : " or ") + r->topk.describe();
  }
  if (accepted.empty()) accepted = fitting.empty() && !policy.rules.empty() ? "none" : "";
  if (policy.predicate) {
    accepted += (accepted.empty() ? "" : ", restricted to ") + (policy.predicate_description.empty()
                                                                    ? std::string("a predicate")
                                                                    : policy.predicate_description);
  }
  if (accepted.empty()) accepted = "none";
  return invalid_argument("dispatch policy ", policy.name, ": no accepted topk width >= ", needed,
                          " (<= ", policy.max_topk, ") for heads ", shape.heads,
                          ", page_block_size ", shape.page_block_size, ", extra_topk ",
                          shape.extra_topk, "; accepted topk widths: ", accepted);
}

namespace {

struct LayerExtra {
  int32_t extra_topk = 0;
  int32_t extra_page_block_size = 0;
};

StatusOr<LayerExtra> layer_extra(LayerType type, const BuilderConfig& c, const DeploymentShape& s) {
  if (type == LayerType::kSwaOnly) return LayerExtra{};
  const int32_t ratio = type == LayerType::kC2A ? 2 : type == LayerType::kC4A ? 4 : 128;
  if (s.attn_block_size % ratio != 0) {
    return invalid_argument(
        "deployment.attn_block_size: expected a multiple of the compress "
        "ratio ",
        ratio, " (", layer_type_name(type), "), got ", s.attn_block_size);
  }
  LayerExtra e;
  e.extra_page_block_size = s.attn_block_size / ratio;
  if (type == LayerType::kC128A) {
    e.extra_topk =
        static_cast<int32_t>(formulas::round_up(formulas::ceil_div(c.max_model_len, 128), 128));
  } else {
    e.extra_topk = s.indexer_topk;
  }
  return e;
}

}  // namespace

StatusOr<std::vector<TupleCheck>> enumerate_dispatch_tuples(const BuilderConfig& config,
                                                            const DispatchPolicy& policy,
                                                            const DeploymentShape& shape) {
  SPARSE_SWA_RETURN_IF_ERROR(validate_config(config));
  if (shape.heads < 1)
    return invalid_argument("deployment.heads: expected >= 1, got ", shape.heads);
  if (shape.attn_block_size < 1) {
    return invalid_argument("deployment.attn_block_size: expected >= 1, got ",
                            shape.attn_block_size);
  }
  if (shape.indexer_topk < 1) {
    return invalid_argument("deployment.indexer_topk: expected >= 1, got ", shape.indexer_topk);
  }
  const DerivedConfig d = derive_config(config);
  struct DecodeRows {
    const char* what;
    int32_t width;
  };
  std::vector<DecodeRows> decode = {{"decode causal", config.window_size}};
  if (d.is_dspark) decode.push_back({"decode non-causal (dspark)", d.noncausal_index_width});
  const char* prefill_what = config.max_image_tokens > 0 ? "prefill vision (W + Mi)" : "prefill";

  std::vector<TupleCheck> out;
  auto add = [&](std::string source, DispatchTuple t) {
    out.push_back({std::move(source), t, policy.accepts(t)});
  };
  for (int i = 0; i < kNumLayerTypes; ++i) {
    const auto type = static_cast<LayerType>(i);
    if (!d.layer_types.contains(type)) continue;
    auto extra = layer_extra(type, config, shape);
    SPARSE_SWA_RETURN_IF_ERROR(extra.status());
    const std::string layer = layer_type_name(type);
    if (policy.layout == IndexLayout::kMixed) {
      // One matrix holds decode and prefill rows: S = max(decode width, W + Mi).
      for (const DecodeRows& rows : decode) {
        const MixedMatrixShape m = mixed_matrix_shape(std::max(rows.width, d.prefill_index_width),
                                                      extra->extra_topk, extra->extra_topk);
        add(str_cat("mixed matrix (", rows.what, ") ", layer),
            {shape.heads, m.row_width, config.block_size, 0, 0});
      }
      continue;
    }
    for (const DecodeRows& rows : decode) {
      add(str_cat(rows.what, " ", layer), {shape.heads, rows.width, config.block_size,
                                           extra->extra_topk, extra->extra_page_block_size});
    }
    if (policy.reads_prefill_rows) {
      add(str_cat(prefill_what, " ", layer), {shape.heads, d.prefill_index_width, config.block_size,
                                              extra->extra_topk, extra->extra_page_block_size});
    }
  }
  return out;
}

Status validate_config(const BuilderConfig& config, const DispatchPolicy& policy,
                       const DeploymentShape& shape) {
  auto tuples = enumerate_dispatch_tuples(config, policy, shape);
  SPARSE_SWA_RETURN_IF_ERROR(tuples.status());
  for (const TupleCheck& t : tuples.value()) {
    if (!t.accepted) {
      return invalid_argument("dispatch policy ", policy.name, " rejects ", t.source, ": ",
                              to_string(t.tuple), "; accepted: ", policy.describe());
    }
  }
  return Status::Ok();
}

StatusOr<int32_t> choose_noncausal_width(const BuilderConfig& config, const DispatchPolicy& policy,
                                         const DeploymentShape& shape) {
  SPARSE_SWA_RETURN_IF_ERROR(validate_config(config));
  const DerivedConfig d = derive_config(config);
  if (!d.is_dspark) {
    return invalid_argument(
        "config.speculative_method: expected dspark for a non-causal width, got ",
        speculative_method_name(config.speculative_method));
  }
  const int32_t needed =
      config.window_size + std::max(d.decode_threshold, config.num_speculative_tokens);
  return choose_width(needed, policy, {shape.heads, 0, config.block_size, 0, 0});
}

}  // namespace sparse_swa
