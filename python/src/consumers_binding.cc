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

CompressedTopk topk_from(const TopkArgs& a, const CallPlace& call, std::string_view table_name,
                         std::string_view size_name) {
  CompressedTopk t;
  t.cache.compress_ratio = int32_from_python(a.compress_ratio, "compress_ratio");
  if (!a.block_table.is_none()) {
    t.cache.block_table =
        index_rows(import_at(a.block_table, table_name, call), table_name, call.space());
  }
  if (!a.block_size.is_none()) t.cache.block_size = int32_from_python(a.block_size, size_name);
  if (!a.decode_local.is_none()) {
    t.decode_local =
        index_rows(import_at(a.decode_local, "decode_local", call), "decode_local", call.space());
  }
  if (!a.decode_global.is_none() || !a.decode_global_lens.is_none()) {
    if (a.decode_global.is_none() || a.decode_global_lens.is_none()) {
      raise_value_error("decode_global: expected decode_global and decode_global_lens together");
    }
    const MatrixView<const int32_t> g = index_rows(
        import_at(a.decode_global, "decode_global", call), "decode_global", call.space());
    const auto lens =
        vector_of<int32_t>(import_at(a.decode_global_lens, "decode_global_lens", call),
                           "decode_global_lens", Elem::kInt32);
    if (static_cast<int64_t>(lens.size()) != g.rows) {
      raise_value_error(str_cat("decode_global_lens: expected ", g.rows,
                                " entries (the rows of decode_global), got ", lens.size()));
    }
    t.decode_global = {g.data,   lens.data(), g.rows,      static_cast<int32_t>(g.cols),
                       g.stride, 0,           call.space()};
  }
  if (!a.prefill_local.is_none()) {
    t.prefill_local = index_rows(import_at(a.prefill_local, "prefill_local", call), "prefill_local",
                                 call.space());
  }
  return t;
}

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

}  // namespace

MixedMatrixForm mixed_form_from(nb::handle value) {
  auto form = parse_mixed_matrix_form(string_from_python(value, "form"));
  throw_if_error(form.status());
  return form.value();
}

Status topk_names(const Status& status, std::string_view table_name, std::string_view size_name) {
  return renamed_fields(status, {{"topk.cache.block_table", table_name},
                                 {"topk.cache.block_size", size_name},
                                 {"topk.cache.compress_ratio", "compress_ratio"},
                                 {"topk.decode_local", "decode_local"},
                                 {"topk.decode_global", "decode_global"},
                                 {"topk.prefill_local", "prefill_local"},
                                 {"topk.cache", table_name}});
}

namespace {

// (indices [T, S + P] int32, lens [T] int32, swa_lens [T] int32) of one layer: SWA-only by
// default, or with the layer's compressed top-k.
std::tuple<nb::object, nb::object, nb::object> mixed_matrix(const PyMetadata& m,
                                                            const TopkArgs& args,
                                                            nb::handle form_obj,
                                                            nb::handle stream) {
  const MixedMatrixForm form = mixed_form_from(form_obj);
  const ImportedBatch batch = import_step_batch(m);
  const ConsumerStep step{m.md, batch.input, m.block_size};
  const CallPlace call = output_place(m);
  const CompressedTopk topk = topk_from(args, call);
  const MixedMatrixShape shape = mixed_matrix_shape(m.md, topk);
  const auto rows = static_cast<size_t>(m.md.num_tokens);
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
  throw_if_error(topk_names(build_mixed_matrix(step, topk, form, out,
                                               {static_cast<int32_t*>(swa_lens.data), rows},
                                               stream_from(stream, call, m.cuda_stream))));
  return {indices.array, lens.array, swa_lens.array};
}

using ChunkTuple = std::tuple<int64_t, int64_t, int64_t, int64_t>;

// [(chunk (start, end, N, M), rows [n, width] int32, lens [n] int32)] of one layer: SWA-only
// (compress_ratio 1) or with its prefill top-k `prefill_local` [>= Tp, TOP_K].
nb::list combined_prefill(const PyMetadata& m, nb::handle compress_ratio_obj,
                          nb::handle chunk_size_obj, nb::handle prefill_local_obj,
                          nb::handle stream) {
  const int32_t compress_ratio = int32_from_python(compress_ratio_obj, "compress_ratio");
  const int64_t chunk_size = int_from_python(chunk_size_obj, "chunk_size", INT64_MIN, INT64_MAX);
  const ImportedBatch batch = import_step_batch(m);
  const ConsumerStep step{m.md, batch.input, m.block_size};
  auto plan = prefill_chunk_plan(m.md, compress_ratio, chunk_size);
  throw_if_error(plan.status());
  const CallPlace call = output_place(m);
  MatrixView<const int32_t> prefill_local;
  if (!prefill_local_obj.is_none()) {
    prefill_local = index_rows(import_at(prefill_local_obj, "prefill_local", call), "prefill_local",
                               call.space());
  }
  void* cuda_stream = stream_from(stream, call, m.cuda_stream);
  nb::list result;
  for (const ChunkPlanEntry& chunk : plan.value()) {
    auto shape = combined_prefill_shape(m.md, chunk, static_cast<int32_t>(prefill_local.cols));
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
    throw_if_error(
        build_combined_prefill(step, chunk, compress_ratio, prefill_local, out, cuda_stream));
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
      [](const PyMetadata& m, nb::handle compress_ratio, nb::handle block_table,
         nb::handle block_size, nb::handle decode_local, nb::handle decode_global,
         nb::handle decode_global_lens, nb::handle prefill_local, nb::handle form,
         nb::handle stream) {
        return mixed_matrix(m,
                            {compress_ratio, block_table, block_size, decode_local, decode_global,
                             decode_global_lens, prefill_local},
                            form, stream);
      },
      nb::is_method(), nb::scope(cls), nb::name("mixed_matrix"), nb::kw_only(),
      nb::arg("compress_ratio").none() = 1, nb::arg("block_table") = nb::none(),
      nb::arg("block_size") = nb::none(), nb::arg("decode_local") = nb::none(),
      nb::arg("decode_global") = nb::none(), nb::arg("decode_global_lens") = nb::none(),
      nb::arg("prefill_local") = nb::none(), nb::arg("form") = "flashinfer_sm100",
      nb::arg("stream") = nb::none(),
      "The FlashInfer SM100 mixed matrix of one layer, as new arrays where the metadata lives\n"
      "(host, or the CUDA device, computed there on `stream`: None = torch's current stream\n"
      "for torch metadata, else the builder's cuda_stream): (indices [num_tokens, row_width]\n"
      "int32 (-1 = empty/skip), lens [num_tokens] int32 (the SWA section S + the compressed\n"
      "count; W + spill + the compressed count for a re-laid DSpark row), swa_lens [num_tokens]\n"
      "int32 (the row's SWA entries)). form \"flashinfer_sm100\" (default) re-lays DSpark\n"
      "(non-causal) decode rows for the SM100 kernel: the token's causal part from column 0,\n"
      "the rest of the block from column W, its compressed entries right after (ValueError when\n"
      "that needs more than S columns); \"verbatim\" copies every decode row as built. SWA-only\n"
      "by default; a compressed layer (compress_ratio 2, 4 or 128) also takes its compressed\n"
      "cache's block_table [>= num_reqs, blocks] int32 and block_size, the decode top-k\n"
      "(decode_local [>= Td, topk] local indices for C2A/C4A, or decode_global [>= Td, width]\n"
      "+ decode_global_lens for C128A) and prefill_local [>= Tp, TOP_K]. Prefill rows start no\n"
      "earlier than the build's replay_start (bounded replay). Metadata of the builder's last\n"
      "build() only.");
  cls.attr("combined_prefill") = nb::cpp_function(
      &combined_prefill, nb::is_method(), nb::scope(cls), nb::name("combined_prefill"),
      nb::arg("compress_ratio").none() = 1, nb::arg("chunk_size").none() = 4, nb::kw_only(),
      nb::arg("prefill_local") = nb::none(), nb::arg("stream") = nb::none(),
      "FlashMLA sparse prefill rows per chunk of get_prefill_chunk_plan(compress_ratio,\n"
      "chunk_size): a list of ((start, end, N, M), rows [n, width] int32 indexing the chunk's\n"
      "gathered workspace (the request's compressed entries, then its SWA tokens), lens [n]\n"
      "int32), where the metadata lives (device: on `stream`, as mixed_matrix). A compressed\n"
      "layer passes its prefill top-k prefill_local [>= Tp, TOP_K] int32 (local indices). SWA\n"
      "windows start no earlier than the build's replay_start and stay inside the gathered\n"
      "range (prefill_gather_lens).");
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
