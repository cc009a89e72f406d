// SPDX-License-Identifier: Apache-2.0
#include "consumers_binding.h"

#include <nanobind/stl/tuple.h>

#include <climits>
#include <optional>
#include <tuple>

#include "array_input.h"
#include "batch_arrays.h"
#include "call_arrays.h"
#include "metadata_binding.h"
#include "python_values.h"
#include "sparse_swa/consumers.h"
#include "status_exceptions.h"

namespace sparse_swa::python {

namespace {

// The batch of the builder's last build(), re-imported (host or device, like the metadata).
ImportedBatch import_step_batch(const PyMetadata& m) {
  if (m.impl == nullptr) {
    raise_value_error("metadata: expected the metadata returned by build(), got a copy()");
  }
  m.expect_current();
  BatchObjects objects = m.inputs;
  objects.causal = m.md.causal;
  return import_batch(objects);
}

// Outputs of a consumer: where the metadata lives, in the framework of its arrays.
CallPlace output_place(const PyMetadata& m) {
  CallPlace call;
  call.place = m.place;
  call.anchor = "metadata";
  call.framework = m.device_framework;
  call.anchor_obj = m.inputs.query_start_loc;
  return call;
}

// (indices [T, S + P] int32, lens [T] int32, swa_lens [T] int32) of an SWA-only layer.
std::tuple<nb::object, nb::object, nb::object> mixed_matrix(const PyMetadata& m,
                                                            nb::handle stream) {
  const ImportedBatch batch = import_step_batch(m);
  const ConsumerStep step{m.md, batch.input, m.block_size};
  const CompressedTopk topk;  // SWA-only: compress_ratio 1, no compressed inputs
  const MixedMatrixShape shape = mixed_matrix_shape(m.md, topk);
  const auto rows = static_cast<size_t>(m.md.num_tokens);
  const CallPlace call = output_place(m);
  const NewArray indices =
      new_array(call, Elem::kInt32, {rows, static_cast<size_t>(shape.row_width)}, "metadata",
                "metadata", 0xff);
  const NewArray lens = new_array(call, Elem::kInt32, {rows}, "metadata", "metadata");
  const NewArray swa_lens = new_array(call, Elem::kInt32, {rows}, "metadata", "metadata");
  const IndexView out{static_cast<int32_t*>(indices.data),
                      static_cast<int32_t*>(lens.data),
                      m.md.num_tokens,
                      shape.row_width,
                      shape.row_width,
                      m.md.window_size,
                      call.space()};
  throw_if_error(build_mixed_matrix(step, topk, out, {static_cast<int32_t*>(swa_lens.data), rows},
                                    stream_from(stream, call, m.cuda_stream)));
  return {indices.array, lens.array, swa_lens.array};
}

using ChunkTuple = std::tuple<int64_t, int64_t, int64_t, int64_t>;

// [(chunk (start, end, N, M), rows [n, width] int32, lens [n] int32)] for an SWA-only layer.
nb::list combined_prefill(const PyMetadata& m, nb::handle compress_ratio_obj,
                          nb::handle chunk_size_obj, nb::handle stream) {
  const int64_t compress_ratio =
      int_from_python(compress_ratio_obj, "compress_ratio", INT64_MIN, INT64_MAX);
  const int64_t chunk_size = int_from_python(chunk_size_obj, "chunk_size", INT64_MIN, INT64_MAX);
  if (compress_ratio != 1) {
    raise_status(
        unimplemented("compress_ratio: only 1 (SWA-only layers, no indexer top-k) is "
                      "bound, got ",
                      compress_ratio));
  }
  const ImportedBatch batch = import_step_batch(m);
  const ConsumerStep step{m.md, batch.input, m.block_size};
  auto plan = prefill_chunk_plan(m.md, compress_ratio, chunk_size);
  throw_if_error(plan.status());
  const CallPlace call = output_place(m);
  void* cuda_stream = stream_from(stream, call, m.cuda_stream);
  nb::list result;
  for (const ChunkPlanEntry& chunk : plan.value()) {
    auto shape = combined_prefill_shape(m.md, chunk, /*prefill_topk=*/0);
    throw_if_error(shape.status());
    const CombinedPrefillShape s = shape.value();
    const NewArray rows =
        new_array(call, Elem::kInt32, {static_cast<size_t>(s.rows), static_cast<size_t>(s.width)},
                  "chunk", "chunk", 0xff);
    const NewArray lens =
        new_array(call, Elem::kInt32, {static_cast<size_t>(s.rows)}, "chunk", "chunk");
    const IndexView out{static_cast<int32_t*>(rows.data),
                        static_cast<int32_t*>(lens.data),
                        s.rows,
                        s.width,
                        s.width,
                        m.md.window_size,
                        call.space()};
    throw_if_error(build_combined_prefill(step, chunk, static_cast<int32_t>(compress_ratio),
                                          MatrixView<const int32_t>{}, out, cuda_stream));
    const ChunkTuple t{chunk.start, chunk.end, chunk.compressed_width, chunk.total_width};
    result.append(nb::make_tuple(t, rows.array, lens.array));
  }
  return result;
}

// (out [rows, W] int32, out_lens [rows] int32): the compressed top-k of tokens first_token ..
// first_token + rows - 1 mapped to global compressed slots (consumers.h, 1.).
std::tuple<nb::object, nb::object> compressed_topk_to_global_arrays(
    nb::handle metadata_obj, nb::handle first_token_obj, nb::handle local_obj,
    nb::handle block_table_obj, nb::handle block_size_obj, nb::handle compress_ratio_obj,
    nb::handle out_obj, nb::handle out_lens_obj, nb::handle stream) {
  if (!nb::isinstance<PyMetadata>(metadata_obj) || !nb::inst_ready(metadata_obj)) {
    raise_value_error(str_cat("metadata: expected the SwaMetadata returned by build(), got ",
                              describe(metadata_obj)));
  }
  const PyMetadata& m = nb::cast<const PyMetadata&>(metadata_obj);
  if (m.impl == nullptr) {
    raise_value_error("metadata: expected the metadata returned by build(), got a copy()");
  }
  m.expect_current();
  const int32_t first_token = int32_from_python(first_token_obj, "first_token");
  CompressedCache cache;
  cache.block_size = int32_from_python(block_size_obj, "block_size");
  cache.compress_ratio = int32_from_python(compress_ratio_obj, "compress_ratio");
  CallPlace call = output_place(m);
  const MatrixView<const int32_t> local =
      index_rows(import_at(local_obj, "local", call), "local", call.space());
  cache.block_table =
      index_rows(import_at(block_table_obj, "block_table", call), "block_table", call.space());
  const auto rows = static_cast<size_t>(local.rows);
  nb::object out, lens;
  IndexView view{nullptr,    nullptr,          local.rows,  static_cast<int32_t>(local.cols),
                 local.cols, m.md.window_size, call.space()};
  if (out_obj.is_none()) {
    const NewArray a =
        new_array(call, Elem::kInt32, {rows, static_cast<size_t>(local.cols)}, "out", "local");
    out = a.array;
    view.data = static_cast<int32_t*>(a.data);
  } else {
    const FlatMatrix o =
        flat_matrix(import_writable_at(out_obj, "out", call), "out", {Elem::kInt32}, 2);
    if (o.cols > INT32_MAX) {
      raise_value_error(str_cat("out: expected a width <= ", INT32_MAX, ", got ", o.cols));
    }
    out = nb::borrow(out_obj);
    view = {static_cast<int32_t*>(o.data),
            nullptr,
            o.rows,
            static_cast<int32_t>(o.cols),
            o.stride,
            m.md.window_size,
            call.space()};
  }
  if (out_lens_obj.is_none()) {
    const NewArray a =
        new_array(call, Elem::kInt32, {static_cast<size_t>(view.rows)}, "out_lens", "local");
    lens = a.array;
    view.lens = static_cast<int32_t*>(a.data);
  } else {
    const auto l = vector_of<int32_t>(import_writable_at(out_lens_obj, "out_lens", call),
                                      "out_lens", Elem::kInt32);
    if (static_cast<int64_t>(l.size()) != view.rows) {
      raise_value_error(
          str_cat("out_lens: expected ", view.rows, " entries (the rows of out), got ", l.size()));
    }
    lens = nb::borrow(out_lens_obj);
    view.lens = const_cast<int32_t*>(l.data());
  }
  throw_if_error(renamed_fields(compressed_topk_to_global(m.md, first_token, local, cache, view,
                                                          stream_from(stream, call, m.cuda_stream)),
                                {{"local_topk", "local"},
                                 {"cache.block_table", "block_table"},
                                 {"cache.block_size", "block_size"},
                                 {"cache.compress_ratio", "compress_ratio"}}));
  return {out, lens};
}

// (indptr [rows + 1] int32, flat int32) of any [rows, W] or [rows, 1, W] index array: host
// flat is the packed prefix [indptr[-1]]; device flat has the capacity rows x W (reading the
// packed length back would need a sync), its valid prefix indptr[-1].
std::tuple<nb::object, nb::object> to_ragged_arrays(nb::handle indices_obj, nb::handle lens_obj,
                                                    nb::handle stream_obj) {
  CallPlace call;
  const InputArray& indices_array = import_anchor(indices_obj, "indices", &call);
  const MatrixView<const int32_t> m = index_rows(indices_array, "indices", call.space());
  const std::span<const int32_t> lens =
      vector_of<int32_t>(import_at(lens_obj, "lens", call), "lens", Elem::kInt32);
  if (static_cast<int64_t>(lens.size()) != m.rows) {
    raise_value_error(
        str_cat("lens: expected ", m.rows, " entries (the rows of indices), got ", lens.size()));
  }
  const ConstIndexView view{m.data,   lens.data(), m.rows,      static_cast<int32_t>(m.cols),
                            m.stride, 0,           call.space()};
  // Everything to_ragged checks, before the rows x width values are allocated.
  throw_if_error(renamed_fields(check_index_view(view, "indices"), {{"indices.lens", "lens"}}));
  const int64_t capacity = ragged_capacity(view);
  if (capacity > INT32_MAX) {
    raise_value_error(str_cat("indices: expected rows x width <= ", INT32_MAX,
                              " (the int32 indptr), got ", m.rows, " x ", m.cols, " = ", capacity));
  }
  const auto rows = static_cast<size_t>(m.rows);
  const NewArray indptr = new_array(call, Elem::kInt32, {rows + 1}, "indices", "indices");
  const NewArray values =
      new_array(call, Elem::kInt32, {static_cast<size_t>(capacity)}, "indices", "indices");
  const RaggedView out{static_cast<int32_t*>(indptr.data), static_cast<int64_t>(rows + 1),
                       static_cast<int32_t*>(values.data), capacity, call.space()};
  throw_if_error(to_ragged(view, out, stream_from(stream_obj, call, nullptr)));
  if (call.on_device()) return {indptr.array, values.array};
  // The packed prefix: a view of `values` that keeps it alive.
  const int32_t packed = static_cast<const int32_t*>(indptr.data)[rows];
  nb::object flat = values.array[nb::slice(nb::int_(0), nb::int_(packed), nb::none())];
  return {indptr.array, flat};
}

}  // namespace

void bind_consumers(nb::module_& m) {
  nb::handle cls = nb::type<PyMetadata>();
  cls.attr("mixed_matrix") = nb::cpp_function(
      &mixed_matrix, nb::is_method(), nb::scope(cls), nb::name("mixed_matrix"), nb::kw_only(),
      nb::arg("stream") = nb::none(),
      "The FlashInfer SM100 mixed matrix of an SWA-only layer, as new arrays where the\n"
      "metadata lives (host, or the CUDA device, computed there on `stream`: None = torch's\n"
      "current stream for torch metadata, else the builder's cuda_stream): (indices\n"
      "[num_tokens, row_width] int32 (-1 = empty/skip), lens [num_tokens] int32 (the whole\n"
      "SWA section S), swa_lens [num_tokens] int32 (exact valid SWA count)). Metadata of\n"
      "the builder's last build() only.");
  cls.attr("combined_prefill") = nb::cpp_function(
      &combined_prefill, nb::is_method(), nb::scope(cls), nb::name("combined_prefill"),
      nb::arg("compress_ratio").none() = 1, nb::arg("chunk_size").none() = 4, nb::kw_only(),
      nb::arg("stream") = nb::none(),
      "FlashMLA sparse prefill rows per chunk of get_prefill_chunk_plan(compress_ratio,\n"
      "chunk_size), SWA-only (compress_ratio 1): a list of ((start, end, N, M),\n"
      "rows [n, width] int32 indexing the chunk's gathered workspace, lens [n] int32), where\n"
      "the metadata lives (device: on `stream`, as mixed_matrix). Other ratios raise\n"
      "NotImplementedError.");
  m.def("compressed_topk_to_global", &compressed_topk_to_global_arrays, nb::arg("metadata").none(),
        nb::arg("first_token").none(), nb::arg("local").none(), nb::arg("block_table").none(),
        nb::arg("block_size").none(), nb::arg("compress_ratio").none(), nb::kw_only(),
        nb::arg("out") = nb::none(), nb::arg("out_lens") = nb::none(),
        nb::arg("stream") = nb::none(),
        "The FlashMLA decode extra_indices: the compressed top-k local [n, topk] int32 of tokens\n"
        "first_token .. first_token + n - 1 of the metadata's last build() mapped to global\n"
        "compressed slots: out[i][j] = block_table[r][l // block_size] * block_size +\n"
        "l % block_size for l = local[i][j] >= 0, else -1; out_lens[i] = entries >= 0; invalid\n"
        "tokens get -1 and 0. block_table [>= num_reqs, max_blocks] int32 is the compressed\n"
        "cache's, block_size its entries per block, compress_ratio 2, 4 or 128. Returns (out\n"
        "[n, topk] int32, out_lens [n] int32), written into out= / out_lens= when given (out\n"
        "may be wider: its extra columns become -1). Arrays live where the metadata does;\n"
        "device work runs on `stream` (as mixed_matrix).");
  m.def("to_ragged", &to_ragged_arrays, nb::arg("indices").none(), nb::arg("lens").none(),
        nb::kw_only(), nb::arg("stream") = nb::none(),
        "CSR form of an index matrix: indices [rows, width] or the builder's [rows, 1, width]\n"
        "int32 (unit column stride), lens [rows] int32 with 0 <= lens <= width -> (indptr\n"
        "[rows + 1] int32, flat int32), row i's first lens[i] entries packed. Host arrays: flat\n"
        "is [indptr[-1]]. CUDA arrays (run on `stream`, see sparse_attention): flat has the\n"
        "capacity rows x width, its valid prefix indptr[-1] (no sync to read it). Capacity\n"
        "comes from the width (rows x width <= 2**31 - 1, checked before allocating).");
}

}  // namespace sparse_swa::python
