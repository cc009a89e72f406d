// SPDX-License-Identifier: Apache-2.0
#include "consumers_binding.h"

#include <nanobind/stl/tuple.h>

#include <climits>
#include <optional>
#include <tuple>

#include "array_input.h"
#include "batch_arrays.h"
#include "metadata_binding.h"
#include "python_values.h"
#include "sparse_swa/consumers.h"
#include "status_exceptions.h"

namespace sparse_swa::python {

namespace {

// The metadata of the builder's last build() on the host, with its batch views re-imported.
struct HostStep {
  ImportedBatch batch;
  ConsumerStep step;
};

ImportedBatch import_host_batch(const PyMetadata& m) {
  if (m.impl == nullptr) {
    raise_value_error("metadata: expected the metadata returned by build(), got a copy()");
  }
  m.expect_current();
  if (m.md.space != MemorySpace::kHost) {
    raise_status(
        unimplemented("metadata: the consumers are bound for host (cpu) metadata only, "
                      "got device ",
                      place_name(m.place)));
  }
  BatchObjects objects = m.inputs;
  objects.causal = m.md.causal;
  return import_batch(objects);
}

// (indices [T, S + P] int32, lens [T] int32, swa_lens [T] int32) of an SWA-only layer.
std::tuple<nb::object, nb::object, nb::object> mixed_matrix(const PyMetadata& m) {
  const ImportedBatch batch = import_host_batch(m);
  const ConsumerStep step{m.md, batch.input, m.block_size};
  const CompressedTopk topk;  // SWA-only: compress_ratio 1, no compressed inputs
  const MixedMatrixShape shape = mixed_matrix_shape(m.md, topk);
  const auto rows = static_cast<size_t>(m.md.num_tokens);
  auto [indices, data] =
      new_host_array<int32_t>("metadata", {rows, static_cast<size_t>(shape.row_width)}, -1);
  auto [lens, lens_data] = new_host_array<int32_t>("metadata", {rows}, 0);
  auto [swa_lens, swa_lens_data] = new_host_array<int32_t>("metadata", {rows}, 0);
  const IndexView out{data,
                      lens_data,
                      m.md.num_tokens,
                      shape.row_width,
                      shape.row_width,
                      m.md.window_size,
                      MemorySpace::kHost};
  throw_if_error(build_mixed_matrix(step, topk, out, {swa_lens_data, rows}));
  return {indices, lens, swa_lens};
}

using ChunkTuple = std::tuple<int64_t, int64_t, int64_t, int64_t>;

// [(chunk (start, end, N, M), rows [n, width] int32, lens [n] int32)] for an SWA-only layer.
nb::list combined_prefill(const PyMetadata& m, nb::handle compress_ratio_obj,
                          nb::handle chunk_size_obj) {
  const int64_t compress_ratio =
      int_from_python(compress_ratio_obj, "compress_ratio", INT64_MIN, INT64_MAX);
  const int64_t chunk_size = int_from_python(chunk_size_obj, "chunk_size", INT64_MIN, INT64_MAX);
  if (compress_ratio != 1) {
    raise_status(
        unimplemented("compress_ratio: only 1 (SWA-only layers, no indexer top-k) is "
                      "bound, got ",
                      compress_ratio));
  }
  const ImportedBatch batch = import_host_batch(m);
  const ConsumerStep step{m.md, batch.input, m.block_size};
  auto plan = prefill_chunk_plan(m.md, compress_ratio, chunk_size);
  throw_if_error(plan.status());
  nb::list result;
  for (const ChunkPlanEntry& chunk : plan.value()) {
    auto shape = combined_prefill_shape(m.md, chunk, /*prefill_topk=*/0);
    throw_if_error(shape.status());
    const CombinedPrefillShape s = shape.value();
    auto [rows, data] = new_host_array<int32_t>(
        "chunk", {static_cast<size_t>(s.rows), static_cast<size_t>(s.width)}, -1);
    auto [lens, lens_data] = new_host_array<int32_t>("chunk", {static_cast<size_t>(s.rows)}, 0);
    const IndexView out{
        data, lens_data, s.rows, s.width, s.width, m.md.window_size, MemorySpace::kHost};
    throw_if_error(build_combined_prefill(step, chunk, static_cast<int32_t>(compress_ratio),
                                          MatrixView<const int32_t>{}, out));
    const ChunkTuple t{chunk.start, chunk.end, chunk.compressed_width, chunk.total_width};
    result.append(nb::make_tuple(t, rows, lens));
  }
  return result;
}

// (indptr [rows + 1] int32, flat [indptr[-1]] int32) of any host [rows, width] index array.
std::tuple<nb::object, nb::object> to_ragged_arrays(nb::handle indices_obj, nb::handle lens_obj) {
  const InputArray indices_array = import_array(indices_obj, "indices");
  const InputArray lens_array = import_array(lens_obj, "lens");
  if (place_of(indices_array, "indices").device != Device::kCpu) {
    raise_status(unimplemented("indices: to_ragged is bound for host (cpu) arrays only"));
  }
  expect_place(lens_array, "lens", Place{}, "like indices");
  const MatrixView<const int32_t> m = int32_matrix(indices_array, "indices", MemorySpace::kHost);
  const std::span<const int32_t> lens = int32_vector(lens_array, "lens");
  if (static_cast<int64_t>(lens.size()) != m.rows) {
    raise_value_error(
        str_cat("lens: expected ", m.rows, " entries (the rows of indices), got ", lens.size()));
  }
  if (m.cols > INT32_MAX) {
    raise_value_error(
        str_cat("indices: expected a width (columns) <= ", INT32_MAX, ", got ", m.cols));
  }
  const ConstIndexView view{
      m.data, lens.data(), m.rows, static_cast<int32_t>(m.cols), m.stride, 0, MemorySpace::kHost};
  // Everything to_ragged checks, before the rows x width values are allocated.
  throw_if_error(check_index_view(view, "indices"));
  const int64_t capacity = ragged_capacity(view);
  if (capacity > INT32_MAX) {
    raise_value_error(str_cat("indices: expected rows x width <= ", INT32_MAX,
                              " (the int32 indptr), got ", m.rows, " x ", m.cols, " = ", capacity));
  }
  const auto rows = static_cast<size_t>(m.rows);
  auto [indptr, indptr_data] = new_host_array<int32_t>("indices", {rows + 1}, 0);
  auto [values, values_data] =
      new_host_array<int32_t>("indices", {static_cast<size_t>(capacity)}, -1);
  const RaggedView out{indptr_data, static_cast<int64_t>(rows + 1), values_data, capacity,
                       MemorySpace::kHost};
  throw_if_error(to_ragged(view, out));
  // The packed prefix: a view of `values` that keeps it alive.
  nb::object flat = values[nb::slice(nb::int_(0), nb::int_(indptr_data[rows]), nb::none())];
  return {indptr, flat};
}

}  // namespace

void bind_consumers(nb::module_& m) {
  nb::handle cls = nb::type<PyMetadata>();
  cls.attr("mixed_matrix") = nb::cpp_function(
      &mixed_matrix, nb::is_method(), nb::scope(cls), nb::name("mixed_matrix"),
      "The FlashInfer SM100 mixed matrix of an SWA-only layer, as new host arrays:\n"
      "(indices [num_tokens, row_width] int32 (-1 = empty/skip), lens [num_tokens] int32\n"
      "(the whole SWA section S), swa_lens [num_tokens] int32 (exact valid SWA count)).\n"
      "Host (cpu) metadata of the builder's last build() only; device metadata raises\n"
      "NotImplementedError.");
  cls.attr("combined_prefill") = nb::cpp_function(
      &combined_prefill, nb::is_method(), nb::scope(cls), nb::name("combined_prefill"),
      nb::arg("compress_ratio").none() = 1, nb::arg("chunk_size").none() = 4,
      "FlashMLA sparse prefill rows per chunk of get_prefill_chunk_plan(compress_ratio,\n"
      "chunk_size), SWA-only (compress_ratio 1): a list of ((start, end, N, M),\n"
      "rows [n, width] int32 indexing the chunk's gathered workspace, lens [n] int32).\n"
      "Host metadata only; other ratios raise NotImplementedError.");
  m.def("to_ragged", &to_ragged_arrays, nb::arg("indices").none(), nb::arg("lens").none(),
        "CSR form of a host index matrix: indices [rows, width] int32 (unit column stride),\n"
        "lens [rows] int32 with 0 <= lens <= width -> (indptr [rows + 1] int32, flat\n"
        "[indptr[-1]] int32), row i's first lens[i] entries packed. Capacity comes from the\n"
        "width (rows x width <= 2**31 - 1, checked before anything is allocated). Device\n"
        "arrays raise NotImplementedError.");
}

}  // namespace sparse_swa::python
