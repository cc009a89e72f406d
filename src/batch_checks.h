// SPDX-License-Identifier: Apache-2.0
// Host-side batch checks and the decode/prefill split, shared by the CPU and CUDA backends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "sparse_swa/batch.h"
#include "sparse_swa/config.h"
#include "sparse_swa/metadata.h"
#include "sparse_swa/status.h"

namespace sparse_swa::detail {

struct StepSplit {
  int32_t num_decodes = 0;
  int32_t num_prefills = 0;
  int32_t num_decode_tokens = 0;
  int32_t num_prefill_tokens = 0;
  int32_t max_query_len = 0;  // over the host query lengths, 0 when there are no requests
  // The query length every decode request shares, 0 when they differ or there are none (a
  // hint for the CUDA kernel's token-to-request mapping).
  int32_t decode_query_len = 0;
};

// The reference's split_decodes_and_prefills with its defaults (short extends count as
// decodes): requests before the first one with query_len > theta are decodes.
StepSplit split_decodes_and_prefills(std::span<const int32_t> query_start_loc_host,
                                     int32_t num_tokens, int32_t decode_threshold);

// The host copies a backend plans with: the explicit *_host spans when given, else the arrays.
std::span<const int32_t> host_query_start_loc(const BatchInput& b);
std::span<const int32_t> host_seq_lens(const BatchInput& b);

// The checks that read no array element: sizes against the config and each other, the block
// table's shape, replay_start's length, the causal flag.
Status check_batch_shape(const BuilderConfig& config, const DerivedConfig& derived,
                         const BatchInput& batch);

// replay_start (when given) against the arrays, which must have passed check_batch:
// 0 <= replay_start[r] <= seq_lens[r] - query_len(r). Host arrays only.
Status check_replay_start(const BatchInput& batch);

// Checks everything visible through host memory: sizes, query_start_loc, seq_lens >= query
// lengths, block-table shape and coverage, the causal flag, and (for the CPU backend, where
// `arrays_on_host`) that the host copies given equal their arrays, element by element, plus
// slot_mapping values and replay_start. With `split`, also fills the step's split
// (split_decodes_and_prefills of the host copies), from the same pass over the requests.
Status check_batch(const BuilderConfig& config, const DerivedConfig& derived,
                   const BatchInput& batch, bool arrays_on_host, StepSplit* split = nullptr);

// Image spans grouped by request (CSR), each request's spans sorted by start.
//   indptr [num_reqs + 1], starts/ends [capacity]
struct SpanCsr {
  int32_t* indptr = nullptr;
  int32_t* starts = nullptr;
  int32_t* ends = nullptr;
  int32_t capacity = 0;
  int32_t count = 0;
};
// Validates the spans (request exists, 0 <= start <= end < seq_len, length <= Mi, no overlap)
// and fills `csr`. No spans is always valid; any span with max_image_tokens = 0 is an error.
Status build_span_csr(std::span<const ImageSpan> spans, std::span<const int32_t> seq_lens_host,
                      int32_t max_image_tokens, SpanCsr* csr);

// The fields of a step's metadata that both backends fill alike: split, counts, chunk-plan
// constants, tile schedulers. The views are each backend's own.
SwaMetadata step_metadata_scalars(const BuilderConfig& config, const DerivedConfig& derived,
                                  const BatchInput& batch, const StepSplit& split,
                                  MemorySpace space);

// Host planning copies of the prefill requests (from the host copies the split used):
//   seq_lens [num_prefills], query_lens [num_prefills]
void fill_prefill_host_plan(const BatchInput& batch, const StepSplit& split, int32_t* seq_lens,
                            int32_t* query_lens);

// What update_draft_decode_rows takes from the last build, kept by the builder itself.
struct DraftUpdateRecord {
  // The build's decode_swa.data and .lens (null before a build): they identify its metadata;
  // the backend rewrites its own buffers.
  const int32_t* decode_rows = nullptr;
  const int32_t* decode_lens = nullptr;
  int32_t decode_width = 0;
  bool noncausal = false;  // the build wrote DSpark non-causal decode rows
  int32_t num_reqs = 0;
  int32_t num_tokens = 0;
  int32_t num_decodes = 0;
  int32_t num_decode_tokens = 0;
};

// update_draft_decode_rows: `md` must be the metadata of the build `last` records (views in
// `space`, the same decode rows and counts) and `batch` must have that build's shape.
Status check_draft_update_target(const SwaMetadata* md, const DraftUpdateRecord& last,
                                 MemorySpace space, const BatchInput& batch);
// The batch of a draft update: its arrays are authoritative (the engine advanced them in place)
// and its host copies are not read (they may still hold the build's values; only their sizes
// are checked). Host arrays (`arrays_on_host`) are checked as check_batch checks them; device
// arrays only by shape (the kernel checks their values).
Status check_draft_update_batch(const BuilderConfig& config, const DerivedConfig& derived,
                                const BatchInput& batch, bool arrays_on_host);

// The buffers a builder writes that the caller can see (the metadata's views), sorted by
// address, so that a batch array overlapping one of them (an output of an earlier build passed
// back as an input) is rejected instead of being overwritten while the builder still reads it.
class OwnedBuffers {
 public:
  // Call for every buffer (empty ones are skipped), then seal() once.
  void add(const void* data, size_t bytes, const char* name);
  void seal();
  // The name of the buffer [data, data + bytes) overlaps, or nullptr.
  const char* overlapping(const void* data, size_t bytes) const;

 private:
  struct Range {
    uintptr_t begin;
    uintptr_t end;
    const char* name;
  };
  std::vector<Range> ranges_;  // disjoint, sorted by begin (and so by end)
};

// Every array of `batch` (the block table as far as its first num_reqs rows reach) must lie
// outside `owned`.
Status check_batch_outside(const BatchInput& batch, const OwnedBuffers& owned);

}  // namespace sparse_swa::detail
