// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: arbitrary bytes -> the JSON batch reader -> the CPU builder -> the chunk
// plans -> the JSON writer, the path of `sparse-swa build`. Every input must end either in an
// INVALID_ARGUMENT whose message starts with the field path, or in metadata that the independent
// checker (metadata_invariants.h) accepts. A second build of the same batch must give the same
// values at the same addresses, and update_draft_decode_rows must keep the checker's rules.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "json/batch_json.h"
#include "metadata_invariants.h"
#include "sparse_swa/metadata_builder.h"

namespace {

using namespace sparse_swa;

// The builder sizes its buffers from the config (up to 2^31-element index buffers are valid);
// configs past this budget are skipped so that the fuzzer's RSS limit means a real leak.
constexpr int64_t kMaxBuilderBytes = int64_t{64} << 20;

[[noreturn]] void report(const char* stage, const std::string& detail) {
  std::fprintf(stderr, "fuzz_batch_json: %s: %s\n", stage, detail.c_str());
  std::abort();
}

// An error from the reader, the config or the builder: INVALID_ARGUMENT naming the field.
void check_error(const Status& s, const char* stage) {
  if (s.code() != StatusCode::kInvalidArgument) {
    report(stage, "expected INVALID_ARGUMENT, got " + s.to_string());
  }
  static constexpr std::string_view kFields[] = {"batch file: ", "config", "batch",
                                                 "chunk_plan_requests"};
  for (std::string_view field : kFields) {
    if (s.message().starts_with(field)) return;
  }
  report(stage, "the message does not start with a field path: " + s.message());
}

// An upper bound of the bytes MetadataBuilder::create() allocates for a valid config.
int64_t builder_bytes(const BuilderConfig& c) {
  const int64_t theta = 1 + 2 * int64_t{c.num_speculative_tokens};
  const int64_t noncausal = std::max<int64_t>(c.window_size + theta + 64, c.noncausal_index_width);
  const int64_t row_ints =
      int64_t{c.window_size} + (c.window_size + c.max_image_tokens) + noncausal + 8;
  return 4 * (int64_t{c.max_num_batched_tokens} * row_ints + 4 * int64_t{c.max_num_seqs} + 4);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = parse_batch_file(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!file.ok()) {
    check_error(file.status(), "parse_batch_file");
    return 0;
  }
  const BuilderConfig& config = file->config;
  if (Status s = validate_config(config); !s.ok()) {
    check_error(s, "validate_config");
    return 0;
  }
  if (builder_bytes(config) > kMaxBuilderBytes) return 0;
  auto created = MetadataBuilder::create(config, Backend::kCpu);
  if (!created.ok())
    report("create", "a config validate_config accepts failed: " + created.status().to_string());
  MetadataBuilder& builder = *created.value();

  const BatchInput batch = file->batch_input();
  SwaMetadata md;
  if (Status s = builder.build(batch, &md); !s.ok()) {
    check_error(s, "build");
    return 0;
  }
  if (std::string err = fuzz::check_metadata(config, batch, md); !err.empty()) {
    report("build", err);
  }

  auto plans = run_chunk_plans(md, file->chunk_plan_requests);
  if (plans.ok()) {
    for (const ChunkPlanResult& p : plans.value()) {
      const int64_t ratio = p.request.compress_ratio;
      std::string err = fuzz::check_chunk_plan(
          md, ratio, p.request.chunk_size, p.request.has_compressed.value_or(ratio > 1), p.plan);
      if (!err.empty()) report("prefill_chunk_plan", err);
    }
  } else {
    check_error(plans.status(), "run_chunk_plans");
  }
  auto json = metadata_to_json(md, plans.ok() ? plans.value() : std::vector<ChunkPlanResult>{});
  if (!json.ok()) report("metadata_to_json", json.status().to_string());
  if (dump_python_style(json.value()).empty()) report("dump_python_style", "empty output");

  // The same batch again: same values, same buffers (build() allocates nothing).
  const fuzz::MetadataCopy first = fuzz::copy_metadata(md);
  SwaMetadata again;
  if (Status s = builder.build(batch, &again); !s.ok()) report("second build", s.to_string());
  if (!(fuzz::copy_metadata(again) == first)) report("second build", "different metadata");
  if (again.decode_swa.data != md.decode_swa.data ||
      again.prefill_swa.data != md.prefill_swa.data ||
      again.token_to_req_indices.data() != md.token_to_req_indices.data()) {
    report("second build", "buffer addresses moved");
  }

  // The draft-loop update over the same batch: the build's mode and replay_start, the padding
  // decode tokens mapped to the last request.
  if (Status s = builder.update_draft_decode_rows(batch, &again); !s.ok()) {
    report("update_draft_decode_rows", s.to_string());
  }
  if (std::string err = fuzz::check_metadata(config, batch, again, /*after_draft_update=*/true);
      !err.empty()) {
    report("update_draft_decode_rows", err);
  }
  return 0;
}
