// SPDX-License-Identifier: Apache-2.0
#include "testing/batch_run.h"

#include <utility>

namespace sparse_swa::testing {

StatusOr<BatchRun> run_batch(BatchFile file, Backend backend) {
  BatchRun run;
  run.file = std::move(file);
  auto builder = StepBuilder::create(run.file.config, backend);
  SPARSE_SWA_RETURN_IF_ERROR(builder.status());
  run.builder = std::move(builder).value();
  SPARSE_SWA_RETURN_IF_ERROR(run.builder->build(run.file.batch_input(), &run.md));
  auto plans = run_chunk_plans(run.md, run.file.chunk_plan_requests);
  SPARSE_SWA_RETURN_IF_ERROR(plans.status());
  run.plans = std::move(plans).value();
  auto json = metadata_to_json(run.md, run.plans);
  SPARSE_SWA_RETURN_IF_ERROR(json.status());
  run.json = std::move(json).value();
  return run;
}

StatusOr<BatchRun> run_batch_file(const std::string& path, Backend backend) {
  auto file = read_batch_file(path);
  SPARSE_SWA_RETURN_IF_ERROR(file.status());
  return run_batch(std::move(file).value(), backend);
}

StatusOr<BatchRun> run_batch_text(std::string_view text, Backend backend) {
  auto file = parse_batch_file(text);
  SPARSE_SWA_RETURN_IF_ERROR(file.status());
  return run_batch(std::move(file).value(), backend);
}

}  // namespace sparse_swa::testing
