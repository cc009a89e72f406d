// SPDX-License-Identifier: Apache-2.0
// The JSON batch format of `sparse-swa build` (docs/semantics.md#batch-files) and the JSON form
// of the metadata it prints. Shared by the CLI, the tests and the fuzzers.
//
// Input:  {"config": {...}, "batch": {...}, "chunk_plan_requests": [...]} (the reference
//         script's batch file; strictly typed, and an unknown key in config, batch or a chunk
//         plan request is an error naming the nearest known key).
// Output: the keys, key order and number formatting of the reference's `run` output, so the
//         two can be diffed as text.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sparse_swa/batch.h"
#include "sparse_swa/config.h"
#include "sparse_swa/metadata.h"
#include "sparse_swa/status.h"

namespace sparse_swa {

// Resource limits of the reader, checked before the text is parsed (and, for a file whose size
// is known, before it is read): larger files and deeper nesting are INVALID_ARGUMENT.
inline constexpr size_t kMaxBatchFileBytes = size_t{256} << 20;  // 256 MiB
// The format nests 5 levels deep (batch.image_spans["r"][i] = [start, end]).
inline constexpr int kMaxJsonDepth = 64;

// One entry of "chunk_plan_requests".
struct ChunkPlanRequest {
  int32_t compress_ratio = 1;
  int32_t chunk_size = 1;
  std::optional<bool> has_compressed;  // echoed in the output only when the file gave it
};

// A request and the plan prefill_chunk_plan() computed for it.
struct ChunkPlanResult {
  ChunkPlanRequest request;
  std::vector<ChunkPlanEntry> plan;
};

// A parsed batch file. Owns every array; batch_input() returns views into them.
struct BatchFile {
  BuilderConfig config;
  std::vector<int32_t> query_start_loc;  // [num_reqs + 1]
  std::vector<int32_t> seq_lens;         // [num_reqs]
  std::vector<int32_t> block_table;      // [block_table_rows, block_table_cols] row-major
  int64_t block_table_rows = 0;
  int64_t block_table_cols = 0;
  std::vector<int64_t> slot_mapping;  // [num_tokens], -1 = padding
  bool causal = true;
  std::vector<ImageSpan> image_spans;  // sorted by request, then by position in the file
  std::vector<int32_t> replay_start;   // [num_reqs], or empty (not given)
  std::vector<ChunkPlanRequest> chunk_plan_requests;

  // Host views into this object; valid while it lives and is not modified.
  BatchInput batch_input() const;
};

// Parses and type-checks a batch file. Errors name the field path, the expected and the actual
// value ("batch.seq_lens[1]: expected an integer, got 2.5"); malformed JSON gives nlohmann's
// position message. Semantic rules (window coverage, spans vs seq_lens, ...) are the builder's.
// Text over kMaxBatchFileBytes or nested deeper than kMaxJsonDepth is rejected before parsing.
StatusOr<BatchFile> parse_batch_file(std::string_view json_text);

// A batch file of `config` and a host batch (its arrays copied; no chunk plan requests).
BatchFile batch_file_of(const BuilderConfig& config, const BatchInput& host_batch);
// The file as the JSON parse_batch_file() reads: {"config", "batch", "chunk_plan_requests"}.
nlohmann::ordered_json batch_file_to_json(const BatchFile& file);
// Reads `path` ("-" = stdin) and parses it; every message starts with the path. A file over
// kMaxBatchFileBytes is rejected from its size, before it is read (stdin: once that much is read).
StatusOr<BatchFile> read_batch_file(const std::string& path);
// The text of `path` as read_batch_file() reads it, within kMaxBatchFileBytes.
StatusOr<std::string> read_json_text(const std::string& path);
// Any JSON document within the reader's limits (size, depth); `source` starts every message.
StatusOr<nlohmann::json> parse_json_text(std::string_view text, std::string_view source);

// Runs prefill_chunk_plan() for every request (host metadata only).
StatusOr<std::vector<ChunkPlanResult>> run_chunk_plans(
    const SwaMetadata& md, const std::vector<ChunkPlanRequest>& requests);

// The output object, keys in the contract's order. `md` must be host metadata (md.space ==
// kHost); device metadata is rejected until a device-to-host copy helper exists.
StatusOr<nlohmann::ordered_json> metadata_to_json(const SwaMetadata& md,
                                                  const std::vector<ChunkPlanResult>& plans);

// One line in Python's json.dumps() style (", " and ": " separators, ASCII only), the format the
// reference script prints. No trailing newline.
std::string dump_python_style(const nlohmann::ordered_json& value);

}  // namespace sparse_swa
