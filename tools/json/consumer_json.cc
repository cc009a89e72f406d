// SPDX-License-Identifier: Apache-2.0
// JSON of the consumer-side matrices of one step; see consumer_json.h.
#include "json/consumer_json.h"

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "sparse_swa/consumers.h"

namespace sparse_swa {

namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr const char* kSwaOnlyNote =
    "SWA-only layer (compress ratio 1): a batch file has no indexer top-k, so no matrix holds "
    "compressed entries";

OrderedJson int_list(std::span<const int32_t> values) {
  OrderedJson out = OrderedJson::array();
  for (int32_t v : values) out.push_back(v);
  return out;
}

// An owned host index matrix; the stride is the width (a multiple of 4 where it must be).
struct OwnedRows {
  OwnedRows(int64_t rows, int32_t width, int32_t window)
      : rows(rows), width(width), window(window), data(rows * width, -1), lens(rows, 0) {}
  IndexView view() {
    return {data.data(), lens.data(), rows, width, width, window, MemorySpace::kHost};
  }
  OrderedJson rows_json() const {
    OrderedJson out = OrderedJson::array();
    for (int64_t i = 0; i < rows; ++i) {
      out.push_back(int_list(std::span<const int32_t>(data.data() + i * width, width)));
    }
    return out;
  }
  int64_t rows;
  int32_t width;
  int32_t window;
  std::vector<int32_t> data;  // [rows, width] int32, -1 = empty
  std::vector<int32_t> lens;  // [rows]
};

OrderedJson policy_json(const DispatchPolicy& policy) {
  OrderedJson out = OrderedJson::object();
  out["layout"] = index_layout_name(policy.layout);
  out["reads_prefill_rows"] = policy.reads_prefill_rows;
  out["accepts"] = policy.describe();
  return out;
}

// [T, round_up(S + P, 4)] with P = 0 on an SWA-only layer, plus the exact SWA valid counts.
StatusOr<OrderedJson> mixed_json(const ConsumerStep& step) {
  const CompressedTopk swa_only;  // compress ratio 1: no compressed part
  const MixedMatrixShape shape = mixed_matrix_shape(step.md, swa_only);
  OwnedRows out(step.md.num_tokens, shape.row_width, step.md.window_size);
  std::vector<int32_t> swa_lens(static_cast<size_t>(step.md.num_tokens), 0);
  SPARSE_SWA_RETURN_IF_ERROR(build_mixed_matrix(step, swa_only, out.view(), swa_lens));
  OrderedJson json = OrderedJson::object();
  json["width"] = shape.row_width;
  json["swa_width"] = shape.swa_width;
  json["indices"] = out.rows_json();
  json["lens"] = int_list(out.lens);
  json["swa_lens"] = int_list(swa_lens);
  return json;
}

// CSR of one view, values buffer sized from the view's width (ragged_capacity), never lens.
StatusOr<OrderedJson> ragged_json(const ConstIndexView& view) {
  std::vector<int32_t> indptr(static_cast<size_t>(view.rows + 1), 0);
  std::vector<int32_t> values(static_cast<size_t>(ragged_capacity(view)), -1);
  const RaggedView out{indptr.data(), static_cast<int64_t>(indptr.size()), values.data(),
                       static_cast<int64_t>(values.size()), MemorySpace::kHost};
  SPARSE_SWA_RETURN_IF_ERROR(to_ragged(view, out));
  OrderedJson json = OrderedJson::object();
  json["indptr"] = int_list(indptr);
  json["indices"] = int_list(std::span<const int32_t>(values.data(), indptr.back()));
  return json;
}

// One entry per chunk of the SWA-only chunk plan: workspace-relative rows of its tokens.
StatusOr<OrderedJson> combined_prefill_json(const ConsumerStep& step) {
  OrderedJson json = OrderedJson::array();
  if (!step.md.has_prefill()) return json;
  auto plan = prefill_chunk_plan(step.md, kConsumerChunkCompressRatio, kConsumerChunkSize);
  SPARSE_SWA_RETURN_IF_ERROR(plan.status());
  for (const ChunkPlanEntry& chunk : plan.value()) {
    auto shape = combined_prefill_shape(step.md, chunk, /*prefill_topk=*/0);
    SPARSE_SWA_RETURN_IF_ERROR(shape.status());
    OwnedRows out(shape->rows, shape->width, step.md.window_size);
    SPARSE_SWA_RETURN_IF_ERROR(build_combined_prefill(step, chunk, kConsumerChunkCompressRatio,
                                                      /*prefill_local=*/{}, out.view()));
    OrderedJson item = OrderedJson::object();
    item["chunk"] = {chunk.start, chunk.end, chunk.compressed_width, chunk.total_width};
    item["width"] = shape->width;
    item["rows"] = out.rows_json();
    item["lens"] = int_list(out.lens);
    json.push_back(std::move(item));
  }
  return json;
}

// validate_config's verdict; the first rejected tuple is named on its own for scripts.
OrderedJson dispatch_json(const BuilderConfig& config, const DispatchPolicy& policy,
                          const DeploymentShape& shape) {
  const Status status = validate_config(config, policy, shape);
  OrderedJson json = OrderedJson::object();
  json["heads"] = shape.heads;
  json["accepted"] = status.ok();
  json["first_rejected"] = nullptr;
  json["message"] = status.ok() ? OrderedJson(nullptr) : OrderedJson(status.message());
  if (status.ok()) return json;
  auto tuples = enumerate_dispatch_tuples(config, policy, shape);
  if (!tuples.ok()) return json;  // an invalid config or shape: the message says which
  for (const TupleCheck& t : tuples.value()) {
    if (!t.accepted) {
      json["first_rejected"] = t.source + ": " + to_string(t.tuple);
      break;
    }
  }
  return json;
}

}  // namespace

StatusOr<OrderedJson> consumer_to_json(std::string_view consumer, const BuilderConfig& config,
                                       const SwaMetadata& md, const BatchInput& batch,
                                       const DeploymentShape& shape) {
  auto policy = builtin_policy(consumer);
  SPARSE_SWA_RETURN_IF_ERROR(policy.status());
  if (md.space != MemorySpace::kHost) {
    return invalid_argument(
        "metadata: expected host memory (space kHost), got device views; copy the metadata to "
        "the host before building the consumer matrices");
  }
  const ConsumerStep step{md, batch, config.block_size};

  OrderedJson out = OrderedJson::object();
  out["name"] = policy->name;
  out["policy"] = policy_json(policy.value());
  out["note"] = kSwaOnlyNote;
  auto mixed = mixed_json(step);
  SPARSE_SWA_RETURN_IF_ERROR(mixed.status());
  out["mixed"] = std::move(mixed).value();
  auto ragged = ragged_json(md.decode_swa);
  SPARSE_SWA_RETURN_IF_ERROR(ragged.status());
  out["ragged"] = std::move(ragged).value();
  auto prefill_ragged = ragged_json(md.prefill_swa);
  SPARSE_SWA_RETURN_IF_ERROR(prefill_ragged.status());
  out["prefill_ragged"] = std::move(prefill_ragged).value();
  auto combined = combined_prefill_json(step);
  SPARSE_SWA_RETURN_IF_ERROR(combined.status());
  out["combined_prefill"] = std::move(combined).value();
  out["dispatch"] = dispatch_json(config, policy.value(), shape);
  return out;
}

}  // namespace sparse_swa
