// Host copies of a build's outputs, to compare two builds (or two backends) field by field and
// to check that a failed build wrote nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sparse_swa/metadata.h"

namespace sparse_swa::testing {

// Row i of an index view: all `width` entries, valid prefix and -1 tail alike (host views).
std::vector<int32_t> row_of(const ConstIndexView& view, int64_t i);
// lens[0, rows) of an index view (host views).
std::vector<int32_t> lens_of(const ConstIndexView& view);
std::vector<int32_t> to_vector(std::span<const int32_t> s);

// Every output field of one build, copied to host vectors.
struct MetadataSnapshot {
  bool causal = true;
  int32_t num_reqs = 0;
  int32_t num_tokens = 0;
  int32_t num_decodes = 0;
  int32_t num_prefills = 0;
  int32_t num_decode_tokens = 0;
  int32_t num_prefill_tokens = 0;
  int32_t max_decode_query_len = 0;
  std::vector<int32_t> token_to_req;  // [T]
  std::vector<uint8_t> is_valid;      // [T]
  int32_t decode_width = 0;
  int32_t decode_window = 0;
  std::vector<int32_t> decode_rows;  // [Td, decode_width]
  std::vector<int32_t> decode_lens;  // [Td]
  int32_t prefill_width = 0;
  int32_t prefill_window = 0;
  std::vector<int32_t> prefill_rows;  // [Tp, prefill_width]
  std::vector<int32_t> prefill_lens;  // [Tp]
  bool has_image = false;
  std::vector<int32_t> left_visible;   // [T] when has_image
  std::vector<int32_t> right_visible;  // [T] when has_image
  std::vector<int32_t> gather_lens;    // [Rp]
  std::vector<int32_t> prefill_seq_lens_host;
  std::vector<int32_t> prefill_query_lens_host;
  std::vector<std::string> tile_schedulers;  // sorted names
};

// Copies `bytes` from a metadata view into host memory (a cudaMemcpy for device views).
using CopyToHost = std::function<void(void* dst, const void* src, size_t bytes)>;

// Snapshot of host metadata (CPU backend). For device metadata pass a copy function; the
// *_host spans and scalars are read directly.
MetadataSnapshot snapshot(const SwaMetadata& md);
MetadataSnapshot snapshot(const SwaMetadata& md, const CopyToHost& copy_to_host);

// Empty when equal, else the first difference, e.g. "decode_rows[3][5]: 12 vs 13".
std::string first_difference(const MetadataSnapshot& a, const MetadataSnapshot& b);

// The builder's persistent buffers seen through one host metadata's views, `capacity` rows each
// (capacity = max_num_batched_tokens): rows past the view's row count are included, so a build
// that scribbles beyond the current step is caught too.
struct BufferImage {
  std::vector<int32_t> decode_rows;   // [capacity, decode width]
  std::vector<int32_t> decode_lens;   // [capacity]
  std::vector<int32_t> prefill_rows;  // [capacity, prefill width]
  std::vector<int32_t> prefill_lens;  // [capacity]
  std::vector<int32_t> token_to_req;  // [capacity]
  std::vector<uint8_t> is_valid;      // [capacity]
  bool operator==(const BufferImage&) const = default;
};
BufferImage capture_buffers(const SwaMetadata& md, int32_t capacity);

}  // namespace sparse_swa::testing
