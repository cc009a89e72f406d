// SPDX-License-Identifier: Apache-2.0
// What `sparse-swa build` does with one batch file, shared by the CLI, the tests and the
// benchmarks: parse, build on a backend (CUDA: device copies in, the metadata copied back, the
// device error taken), run the file's chunk plan requests and write the JSON contract.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "json/batch_json.h"
#include "sparse_swa/metadata_builder.h"
#include "testing/step_builder.h"

namespace sparse_swa::testing {

struct BatchRun {
  BatchFile file;
  std::unique_ptr<StepBuilder> builder;  // owns the buffers `md` points into
  SwaMetadata md;                        // host metadata, whatever the backend
  std::vector<ChunkPlanResult> plans;
  nlohmann::ordered_json json;  // metadata_to_json(md, plans): the contract's object
};

// The first error of the pipeline (a message naming the field), or its result.
StatusOr<BatchRun> run_batch(BatchFile file, Backend backend = Backend::kCpu);
// read_batch_file(path) ("-" reads stdin), then run_batch.
StatusOr<BatchRun> run_batch_file(const std::string& path, Backend backend = Backend::kCpu);
// parse_batch_file(text), then run_batch.
StatusOr<BatchRun> run_batch_text(std::string_view text, Backend backend = Backend::kCpu);

}  // namespace sparse_swa::testing
