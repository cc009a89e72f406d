// SPDX-License-Identifier: Apache-2.0
// Builds one step's metadata with the CPU builder and prints the version and the decode lens:
// two decode requests of 3 and 10 tokens, window 4 -> lens 3 and 4.
#include <cstdint>
#include <cstdio>
#include <vector>

#include "sparse_swa/metadata_builder.h"
#include "sparse_swa/version.h"

int main() {
  sparse_swa::BuilderConfig config;
  config.window_size = 4;
  config.block_size = 4;
  config.max_num_batched_tokens = 8;
  config.max_num_seqs = 2;
  config.max_model_len = 16;
  auto builder = sparse_swa::MetadataBuilder::create(config, sparse_swa::Backend::kCpu);
  if (!builder.ok()) {
    std::fprintf(stderr, "create: %s\n", builder.status().message().c_str());
    return 1;
  }
  const std::vector<int32_t> query_start_loc = {0, 1, 2};
  const std::vector<int32_t> seq_lens = {3, 10};
  const std::vector<int32_t> block_table = {0, 1, 2, 3, 4, 5};  // [2, 3]
  const std::vector<int64_t> slot_mapping = {2, 4 * 3 + 9 % 4};
  sparse_swa::BatchInput batch;
  batch.query_start_loc = query_start_loc;
  batch.seq_lens = seq_lens;
  batch.block_table = {block_table.data(), 2, 3, 3};
  batch.slot_mapping = slot_mapping;
  sparse_swa::SwaMetadata md;
  const sparse_swa::Status status = (*builder)->build(batch, &md);
  if (!status.ok()) {
    std::fprintf(stderr, "build: %s\n", status.message().c_str());
    return 1;
  }
  std::printf("sparse_swa %s: decode_swa lens", sparse_swa::kVersionString);
  for (int64_t i = 0; i < md.decode_swa.rows; ++i) std::printf(" %d", md.decode_swa.lens[i]);
  std::printf("\n");
  return 0;
}
