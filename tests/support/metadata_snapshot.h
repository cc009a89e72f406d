// SPDX-License-Identifier: Apache-2.0
// Host copies of a build's outputs, to compare two builds (or two backends) field by field and
// to check that a failed build wrote nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "sparse_swa/metadata.h"

namespace sparse_swa::testing {

// Row i of an index view: all `width` entries, valid prefix and -1 tail alike (host views).
std::vector<int32_t> row_of(const ConstIndexView& view, int64_t i);
// lens[0, rows) of an index view (host views).
std::vector<int32_t> lens_of(const ConstIndexView& view);
std::vector<int32_t> to_vector(std::span<const int32_t> s);

// Every field of one build's metadata (the field list of sparse_swa/metadata_fields.h), copied
// to host values in the list's order: a scalar is one value, an array its entries, an index view
// four entries: <name>.width, <name>.window, <name>.rows ([rows, width]) and <name>.lens.
struct MetadataSnapshot {
  struct Entry {
    std::string name;
    bool scalar = false;
    std::vector<int64_t> values;
    int64_t width = 0;  // a view's rows: the row width (differences name [row][column])
    std::string text;   // the layer type set, as sorted names
  };
  std::vector<Entry> entries;

  // The values of the entry named `name` ("decode_swa.lens", "token_to_req_indices").
  std::vector<int64_t>& at(std::string_view name);
  const std::vector<int64_t>& at(std::string_view name) const;
  // The same values as int32 (every array of the metadata holds int32 or uint8).
  std::vector<int32_t> ints(std::string_view name) const;
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
