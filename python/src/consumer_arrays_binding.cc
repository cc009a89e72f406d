// SPDX-License-Identifier: Apache-2.0
#include "consumer_arrays_binding.h"

#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <climits>
#include <cstdint>
#include <optional>
#include <span>
#include <tuple>
#include <vector>

#include "array_input.h"
#include "call_arrays.h"
#include "consumers_binding.h"
#include "python_values.h"
#include "sparse_swa/consumers.h"
#include "status_exceptions.h"

namespace sparse_swa::python {

namespace {

// What mixed_matrix and combined_prefill both read (consumers.h ConsumerStep), named as
// SwaMetadata's attributes: the batch (query_start_loc [R + 1], seq_lens [R], block_table
// [>= R, blocks] int32, the SWA block_size), the token map (token_to_req_indices [T] int32,
// is_valid_token [T] bool or uint8), the split (num_decodes; Td = the rows of
// decode_swa_indices, Tp = T - Td), the SWA rows, the gather lens, the image visibility and
// the bounded replay's starts (replay_start [>= R] int32, None = no replay).
struct StepArgs {
  nb::handle query_start_loc, seq_lens, block_table, block_size, token_to_req_indices,
      is_valid_token, num_decodes, decode_swa_indices, decode_swa_lens, prefill_swa_indices,
      prefill_swa_lens, prefill_swa_width, prefill_gather_lens, prefill_left_visible,
      prefill_right_visible, window_size;
  nb::handle replay_start = nb::none();
};

// Views into the arrays a CallPlace keeps alive.
struct Step {
  SwaMetadata md;
  BatchInput batch;
  int32_t block_size = 0;
};

// A count of entries as the library's int32, or a ValueError naming the array.
int32_t count32(size_t n, std::string_view field) {
  if (n > static_cast<size_t>(INT32_MAX)) {
    raise_value_error(str_cat(field, ": expected at most ", INT32_MAX, " entries, got ", n));
  }
  return static_cast<int32_t>(n);
}

std::span<const int32_t> int32_array(nb::handle obj, std::string_view field,
                                     const CallPlace& call) {
  return vector_of<int32_t>(import_at(obj, field, call), field, Elem::kInt32);
}

// SwaMetadata exports is_valid_token as bool; uint8 0/1 is the library's own type.
std::span<const uint8_t> valid_flags(nb::handle obj, const CallPlace& call) {
  const InputArray& a = import_at(obj, "is_valid_token", call);
  const FlatMatrix m = flat_matrix(a, "is_valid_token", {Elem::kBool, Elem::kUint8}, 1);
  return vector_of<uint8_t>(a, "is_valid_token", m.elem);
}

// Index rows [rows, W] or [rows, 1, W] int32 and their lens [rows] int32: the width is the
// array's, the library checks lens against it.
ConstIndexView index_view(nb::handle rows_obj, const char* rows_name, nb::handle lens_obj,
                          const char* lens_name, int32_t window, const CallPlace& call) {
  const MatrixView<const int32_t> m =
      index_rows(import_at(rows_obj, rows_name, call), rows_name, call.space());
  const std::span<const int32_t> lens = int32_array(lens_obj, lens_name, call);
  if (static_cast<int64_t>(lens.size()) != m.rows) {
    raise_value_error(str_cat(lens_name, ": expected ", m.rows, " entries (the rows of ", rows_name,
                              "), got ", lens.size()));
  }
  return {m.data,   lens.data(), m.rows,      static_cast<int32_t>(m.cols),
          m.stride, window,      call.space()};
}

// True when both optional arguments are given, false when neither is; one alone is an error.
bool given_together(nb::handle a, const char* a_name, nb::handle b, const char* b_name) {
  if (a.is_none() != b.is_none()) {
    raise_value_error(str_cat(a_name, ": expected ", a_name, " and ", b_name,
                              " together (or neither), got only ", a.is_none() ? b_name : a_name));
  }
  return !a.is_none();
}

// The library's views over the step arguments, at the place of query_start_loc (the anchor:
// outputs are made in its framework).
Step import_step(const StepArgs& a, CallPlace* call) {
  Step s;
  BatchInput& b = s.batch;
  SwaMetadata& md = s.md;
  b.query_start_loc = vector_of<int32_t>(import_anchor(a.query_start_loc, "query_start_loc", call),
                                         "query_start_loc", Elem::kInt32);
  b.seq_lens = int32_array(a.seq_lens, "seq_lens", *call);
  b.block_table =
      index_rows(import_at(a.block_table, "block_table", *call), "block_table", call->space());
  s.block_size = int32_from_python(a.block_size, "block_size");

  md.space = call->space();
  md.window_size = int32_from_python(a.window_size, "window_size");
  md.num_reqs = count32(b.seq_lens.size(), "seq_lens");
  md.token_to_req_indices = int32_array(a.token_to_req_indices, "token_to_req_indices", *call);
  md.is_valid_token = valid_flags(a.is_valid_token, *call);
  md.num_tokens = count32(md.token_to_req_indices.size(), "token_to_req_indices");
  const int32_t num_decodes = int32_from_python(a.num_decodes, "num_decodes");
  if (num_decodes < 0 || num_decodes > md.num_reqs) {
    raise_value_error(str_cat("num_decodes: expected 0..", md.num_reqs,
                              " (the requests of seq_lens), got ", num_decodes));
  }
  md.num_decodes = num_decodes;
  md.num_prefills = md.num_reqs - num_decodes;  // the builder's split: every other request

  md.decode_swa = index_view(a.decode_swa_indices, "decode_swa_indices", a.decode_swa_lens,
                             "decode_swa_lens", md.window_size, *call);
  if (md.decode_swa.rows > md.num_tokens) {
    raise_value_error(str_cat("decode_swa_indices: expected at most ", md.num_tokens,
                              " rows (the entries of token_to_req_indices), got ",
                              md.decode_swa.rows));
  }
  md.num_decode_tokens = static_cast<int32_t>(md.decode_swa.rows);
  md.num_prefill_tokens = md.num_tokens - md.num_decode_tokens;

  std::optional<int32_t> prefill_width;
  if (!a.prefill_swa_width.is_none()) {
    prefill_width = int32_from_python(a.prefill_swa_width, "prefill_swa_width");
    if (*prefill_width < 0) {
      raise_value_error(str_cat("prefill_swa_width: expected >= 0, got ", *prefill_width));
    }
  }
  if (given_together(a.prefill_swa_indices, "prefill_swa_indices", a.prefill_swa_lens,
                     "prefill_swa_lens")) {
    md.prefill_swa = index_view(a.prefill_swa_indices, "prefill_swa_indices", a.prefill_swa_lens,
                                "prefill_swa_lens", md.window_size, *call);
    if (prefill_width && *prefill_width != md.prefill_swa.width) {
      raise_value_error(str_cat("prefill_swa_width: expected the width of prefill_swa_indices ",
                                md.prefill_swa.width, ", got ", *prefill_width));
    }
  } else {  // no prefill rows: the width alone (the builder's, whatever the batch)
    const int32_t w = prefill_width.value_or(0);
    md.prefill_swa = {nullptr, nullptr, 0, w, w, md.window_size, md.space};
  }
  if (!a.prefill_gather_lens.is_none()) {
    md.prefill_gather_lens = int32_array(a.prefill_gather_lens, "prefill_gather_lens", *call);
  }
  if (given_together(a.prefill_left_visible, "prefill_left_visible", a.prefill_right_visible,
                     "prefill_right_visible")) {
    md.left_visible = int32_array(a.prefill_left_visible, "prefill_left_visible", *call);
    md.right_visible = int32_array(a.prefill_right_visible, "prefill_right_visible", *call);
  }
  // The library checks its length (>= num_reqs) and, where a window is recomputed, its values.
  if (!a.replay_start.is_none()) {
    md.replay_start = int32_array(a.replay_start, "replay_start", *call);
  }
  return s;
}

// The library names SwaMetadata's and BatchInput's members; Python names the arguments.
Status step_names(const Status& status) {
  return renamed_fields(
      status,
      {{"metadata.decode_swa.lens", "decode_swa_lens"},
       {"metadata.prefill_swa.lens", "prefill_swa_lens"},
       {"metadata.decode_swa", "decode_swa_indices"},
       {"metadata.prefill_swa", "prefill_swa_indices"},
       {"metadata.left_visible/right_visible", "prefill_left_visible/prefill_right_visible"},
       {"metadata.left_visible / right_visible", "prefill_left_visible / prefill_right_visible"},
       {"metadata.prefill_gather_lens", "prefill_gather_lens"},
       {"metadata.replay_start", "replay_start"},
       {"metadata.prefill_seq_lens_host", "prefill_seq_lens_cpu"},
       {"metadata.prefill_query_lens_host", "prefill_query_lens_cpu"},
       {"prefill_seq_lens_host", "prefill_seq_lens_cpu"},
       {"prefill_query_lens_host", "prefill_query_lens_cpu"},
       {"metadata.token_to_req_indices", "token_to_req_indices"},
       {"metadata.window_size", "window_size"},
       {"metadata.max_model_len", "max_model_len"},
       {"metadata.max_num_batched_tokens", "max_num_batched_tokens"},
       {"batch: expected the metadata's", "query_start_loc: expected the"},
       {"batch.block_table", "block_table"},
       {"batch.query_start_loc", "query_start_loc"},
       {"batch.seq_lens", "seq_lens"},
       {"step.block_size", "block_size"},
       {"chunk_plan.compress_ratio", "compress_ratio"},
       {"chunk_plan.chunk_size", "chunk_size"}});
}

// (indices [T, row_width] int32, lens [T] int32, swa_lens [T] int32): md.mixed_matrix().
std::tuple<nb::object, nb::object, nb::object> mixed_matrix_arrays(
    const StepArgs& args, nb::handle causal, nb::handle max_decode_query_len,
    const TopkArgs& topk_args, nb::handle form_obj, nb::handle stream) {
  const MixedMatrixForm form = mixed_form_from(form_obj);
  CallPlace call;
  Step s = import_step(args, &call);
  s.md.causal = bool_from_python(causal, "causal");
  s.md.max_decode_query_len = int32_from_python(max_decode_query_len, "max_decode_query_len");
  const CompressedTopk topk =
      topk_from(topk_args, call, "compressed_block_table", "compressed_block_size");
  const ConsumerStep step{s.md, s.batch, s.block_size};
  const MixedMatrixShape shape = mixed_matrix_shape(s.md, topk);
  const auto rows = static_cast<size_t>(s.md.num_tokens);
  const NewArray indices =
      new_array(call, Elem::kInt32, {rows, static_cast<size_t>(shape.row_width)}, "indices",
                "token_to_req_indices", 0xff);
  const NewArray lens = new_array(call, Elem::kInt32, {rows}, "lens", "token_to_req_indices");
  const NewArray swa_lens =
      new_array(call, Elem::kInt32, {rows}, "swa_lens", "token_to_req_indices");
  const IndexView out{static_cast<int32_t*>(indices.data),
                      static_cast<int32_t*>(lens.data),
                      s.md.num_tokens,
                      shape.row_width,
                      shape.row_width,
                      s.md.window_size,
                      call.space()};
  throw_if_error(topk_names(step_names(build_mixed_matrix(
                                step, topk, form, out, {static_cast<int32_t*>(swa_lens.data), rows},
                                stream_from(stream, call, nullptr))),
                            "compressed_block_table", "compressed_block_size"));
  return {indices.array, lens.array, swa_lens.array};
}

// One chunk of the plan and the rows of `out` it wrote: (start, end, N, M, row_start, row_end).
using PlanRow = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;

// md.combined_prefill() into one [>= rows, width] matrix: chunk after chunk, so that row i is
// prefill token num_decode_tokens + i. Rows past the chunks' tokens (padding) are left as given.
std::vector<PlanRow> combined_prefill_arrays(const StepArgs& args, nb::handle seq_lens_cpu,
                                             nb::handle query_lens_cpu, nb::handle max_model_len,
                                             nb::handle max_num_batched_tokens,
                                             nb::handle compress_ratio_obj,
                                             nb::handle chunk_size_obj,
                                             nb::handle prefill_local_obj, nb::handle out_obj,
                                             nb::handle out_lens_obj, nb::handle stream) {
  CallPlace call;
  Step s = import_step(args, &call);
  SwaMetadata& md = s.md;
  const int32_t compress_ratio = int32_from_python(compress_ratio_obj, "compress_ratio");
  const int64_t chunk_size = int_from_python(chunk_size_obj, "chunk_size", INT64_MIN, INT64_MAX);
  md.max_model_len = int_from_python(max_model_len, "max_model_len", INT64_MIN, INT64_MAX);
  md.max_num_batched_tokens = int32_from_python(max_num_batched_tokens, "max_num_batched_tokens");
  // The chunk plan's host copies (never read on the device).
  InputArray seq_host, query_host;
  if (given_together(seq_lens_cpu, "prefill_seq_lens_cpu", query_lens_cpu,
                     "prefill_query_lens_cpu")) {
    const Place host{Device::kCpu, 0};
    seq_host = import_array(seq_lens_cpu, "prefill_seq_lens_cpu");
    expect_place(seq_host, "prefill_seq_lens_cpu", host, "(a host copy)");
    query_host = import_array(query_lens_cpu, "prefill_query_lens_cpu");
    expect_place(query_host, "prefill_query_lens_cpu", host, "(a host copy)");
    md.prefill_seq_lens_host = int32_vector(seq_host, "prefill_seq_lens_cpu");
    md.prefill_query_lens_host = int32_vector(query_host, "prefill_query_lens_cpu");
  }
  auto plan = prefill_chunk_plan(md, compress_ratio, chunk_size);
  throw_if_error(step_names(plan.status()));
  MatrixView<const int32_t> prefill_local;
  if (!prefill_local_obj.is_none()) {
    prefill_local = index_rows(import_at(prefill_local_obj, "prefill_local", call), "prefill_local",
                               call.space());
  }
  const FlatMatrix o =
      flat_matrix(import_writable_at(out_obj, "out", call), "out", {Elem::kInt32}, 2);
  if (o.cols > INT32_MAX) {
    raise_value_error(str_cat("out: expected a width <= ", INT32_MAX, ", got ", o.cols));
  }
  const auto out_lens = vector_of<int32_t>(import_writable_at(out_lens_obj, "out_lens", call),
                                           "out_lens", Elem::kInt32);
  if (static_cast<int64_t>(out_lens.size()) != o.rows) {
    raise_value_error(str_cat("out_lens: expected ", o.rows, " entries (the rows of out), got ",
                              out_lens.size()));
  }
  // Every chunk's shape first: the plan's checks fail before anything is written.
  std::vector<int32_t> chunk_rows;
  int64_t total = 0;
  for (const ChunkPlanEntry& chunk : plan.value()) {
    auto shape = combined_prefill_shape(md, chunk, static_cast<int32_t>(prefill_local.cols));
    throw_if_error(step_names(shape.status()));
    chunk_rows.push_back(shape->rows);
    total += shape->rows;
  }
  if (total > o.rows) {
    raise_value_error(str_cat("out: expected >= ", total,
                              " rows (the prefill tokens of the plan's chunks), got ", o.rows));
  }
  const ConsumerStep step{md, s.batch, s.block_size};
  void* cuda_stream = stream_from(stream, call, nullptr);
  std::vector<PlanRow> result;
  int64_t row = 0;
  for (size_t c = 0; c < chunk_rows.size(); ++c) {
    const ChunkPlanEntry& chunk = plan.value()[c];
    const IndexView view{static_cast<int32_t*>(o.data) + row * o.stride,
                         const_cast<int32_t*>(out_lens.data()) + row,
                         o.rows - row,
                         static_cast<int32_t>(o.cols),
                         o.stride,
                         md.window_size,
                         call.space()};
    throw_if_error(step_names(
        build_combined_prefill(step, chunk, compress_ratio, prefill_local, view, cuda_stream)));
    result.emplace_back(chunk.start, chunk.end, chunk.compressed_width, chunk.total_width, row,
                        row + chunk_rows[c]);
    row += chunk_rows[c];
  }
  return result;
}

// (out [n, topk] int32, out_lens [n] int32): compressed_topk_to_global(md, ...).
std::tuple<nb::object, nb::object> compressed_topk_arrays(
    nb::handle token_to_req_indices, nb::handle is_valid_token, nb::handle num_reqs_obj,
    nb::handle first_token_obj, nb::handle local_obj, nb::handle block_table_obj,
    nb::handle block_size_obj, nb::handle compress_ratio_obj, nb::handle stream) {
  CallPlace call;
  SwaMetadata md;
  md.token_to_req_indices =
      vector_of<int32_t>(import_anchor(token_to_req_indices, "token_to_req_indices", &call),
                         "token_to_req_indices", Elem::kInt32);
  md.space = call.space();
  md.is_valid_token = valid_flags(is_valid_token, call);
  md.num_tokens = count32(md.token_to_req_indices.size(), "token_to_req_indices");
  md.num_reqs = int32_from_python(num_reqs_obj, "num_reqs");
  if (md.num_reqs < 0) raise_value_error(str_cat("num_reqs: expected >= 0, got ", md.num_reqs));
  // The mapping reads the token map and num_reqs, never the decode/prefill split: all tokens
  // count as decode tokens, which the library's count checks accept.
  md.num_decode_tokens = md.num_tokens;
  const int32_t first_token = int32_from_python(first_token_obj, "first_token");
  CompressedCache cache;
  cache.block_size = int32_from_python(block_size_obj, "block_size");
  cache.compress_ratio = int32_from_python(compress_ratio_obj, "compress_ratio");
  const MatrixView<const int32_t> local =
      index_rows(import_at(local_obj, "local", call), "local", call.space());
  cache.block_table =
      index_rows(import_at(block_table_obj, "block_table", call), "block_table", call.space());
  const auto rows = static_cast<size_t>(local.rows);
  const NewArray out =
      new_array(call, Elem::kInt32, {rows, static_cast<size_t>(local.cols)}, "out", "local", 0xff);
  const NewArray lens = new_array(call, Elem::kInt32, {rows}, "out_lens", "local");
  const IndexView view{static_cast<int32_t*>(out.data),
                       static_cast<int32_t*>(lens.data),
                       local.rows,
                       static_cast<int32_t>(local.cols),
                       local.cols,
                       0,
                       call.space()};
  throw_if_error(renamed_fields(compressed_topk_to_global(md, first_token, local, cache, view,
                                                          stream_from(stream, call, nullptr)),
                                {{"local_topk", "local"},
                                 {"cache.block_table", "block_table"},
                                 {"cache.block_size", "block_size"},
                                 {"cache.compress_ratio", "compress_ratio"},
                                 {"metadata.token_to_req_indices", "token_to_req_indices"}}));
  return {out.array, lens.array};
}

}  // namespace

void bind_consumer_arrays(nb::module_& m) {
  m.def(
      "_compressed_topk_to_global_arrays",
      [](nb::handle token_to_req_indices, nb::handle is_valid_token, nb::handle num_reqs,
         nb::handle first_token, nb::handle local, nb::handle block_table, nb::handle block_size,
         nb::handle compress_ratio, nb::handle stream) {
        return compressed_topk_arrays(token_to_req_indices, is_valid_token, num_reqs, first_token,
                                      local, block_table, block_size, compress_ratio, stream);
      },
      nb::arg("token_to_req_indices").none(), nb::arg("is_valid_token").none(),
      nb::arg("num_reqs").none(), nb::arg("first_token").none(), nb::arg("local").none(),
      nb::arg("block_table").none(), nb::arg("block_size").none(), nb::arg("compress_ratio").none(),
      nb::kw_only(), nb::arg("stream") = nb::none(),
      "compressed_topk_to_global(md, first_token, local, block_table, block_size,\n"
      "compress_ratio) over the metadata's token map (token_to_req_indices [T] int32,\n"
      "is_valid_token [T] bool or uint8) and num_reqs: (out [n, topk] int32, out_lens [n] int32)\n"
      "where token_to_req_indices lives. The torch op sparse_swa::compressed_topk_to_global.");
  m.def(
      "_mixed_matrix_arrays",
      [](nb::handle query_start_loc, nb::handle seq_lens, nb::handle block_table,
         nb::handle block_size, nb::handle token_to_req_indices, nb::handle is_valid_token,
         nb::handle num_decodes, nb::handle decode_swa_indices, nb::handle decode_swa_lens,
         nb::handle prefill_swa_indices, nb::handle prefill_swa_lens, nb::handle prefill_swa_width,
         nb::handle prefill_gather_lens, nb::handle prefill_left_visible,
         nb::handle prefill_right_visible, nb::handle window_size, nb::handle causal,
         nb::handle max_decode_query_len, nb::handle compress_ratio,
         nb::handle compressed_block_table, nb::handle compressed_block_size,
         nb::handle decode_local, nb::handle decode_global, nb::handle decode_global_lens,
         nb::handle prefill_local, nb::handle form, nb::handle replay_start, nb::handle stream) {
        const StepArgs step{query_start_loc,       seq_lens,
                            block_table,           block_size,
                            token_to_req_indices,  is_valid_token,
                            num_decodes,           decode_swa_indices,
                            decode_swa_lens,       prefill_swa_indices,
                            prefill_swa_lens,      prefill_swa_width,
                            prefill_gather_lens,   prefill_left_visible,
                            prefill_right_visible, window_size,
                            replay_start};
        const TopkArgs topk{compress_ratio, compressed_block_table, compressed_block_size,
                            decode_local,   decode_global,          decode_global_lens,
                            prefill_local};
        return mixed_matrix_arrays(step, causal, max_decode_query_len, topk, form, stream);
      },
      nb::arg("query_start_loc").none(), nb::arg("seq_lens").none(), nb::arg("block_table").none(),
      nb::arg("block_size").none(), nb::arg("token_to_req_indices").none(),
      nb::arg("is_valid_token").none(), nb::arg("num_decodes").none(),
      nb::arg("decode_swa_indices").none(), nb::arg("decode_swa_lens").none(),
      nb::arg("prefill_swa_indices").none(), nb::arg("prefill_swa_lens").none(),
      nb::arg("prefill_swa_width").none(), nb::arg("prefill_gather_lens").none(),
      nb::arg("prefill_left_visible").none(), nb::arg("prefill_right_visible").none(),
      nb::arg("window_size").none(), nb::kw_only(), nb::arg("causal") = true,
      nb::arg("max_decode_query_len") = 1, nb::arg("compress_ratio").none() = 1,
      nb::arg("compressed_block_table") = nb::none(), nb::arg("compressed_block_size") = nb::none(),
      nb::arg("decode_local") = nb::none(), nb::arg("decode_global") = nb::none(),
      nb::arg("decode_global_lens") = nb::none(), nb::arg("prefill_local") = nb::none(),
      nb::arg("form") = "flashinfer_sm100", nb::arg("replay_start") = nb::none(),
      nb::arg("stream") = nb::none(),
      "md.mixed_matrix(...) over the step's arrays (SwaMetadata's attribute names; the\n"
      "compressed cache's block table and block size as compressed_block_table and\n"
      "compressed_block_size): (indices [T, row_width], lens [T], swa_lens [T]) int32 where\n"
      "query_start_loc lives. causal=False marks DSpark decode rows, which form\n"
      "\"flashinfer_sm100\" re-lays; max_decode_query_len (default 1) bounds the blocks.\n"
      "replay_start ([>= num_reqs] int32, md.replay_start; None = no replay) clamps the\n"
      "recomputed prefill windows. The torch op sparse_swa::mixed_matrix.");
  m.def(
      "_combined_prefill_arrays",
      [](nb::handle query_start_loc, nb::handle seq_lens, nb::handle block_table,
         nb::handle block_size, nb::handle token_to_req_indices, nb::handle is_valid_token,
         nb::handle num_decodes, nb::handle decode_swa_indices, nb::handle decode_swa_lens,
         nb::handle prefill_swa_indices, nb::handle prefill_swa_lens, nb::handle prefill_swa_width,
         nb::handle prefill_gather_lens, nb::handle prefill_left_visible,
         nb::handle prefill_right_visible, nb::handle window_size, nb::handle prefill_seq_lens_cpu,
         nb::handle prefill_query_lens_cpu, nb::handle max_model_len,
         nb::handle max_num_batched_tokens, nb::handle compress_ratio, nb::handle chunk_size,
         nb::handle prefill_local, nb::handle out, nb::handle out_lens, nb::handle replay_start,
         nb::handle stream) {
        const StepArgs step{query_start_loc,       seq_lens,
                            block_table,           block_size,
                            token_to_req_indices,  is_valid_token,
                            num_decodes,           decode_swa_indices,
                            decode_swa_lens,       prefill_swa_indices,
                            prefill_swa_lens,      prefill_swa_width,
                            prefill_gather_lens,   prefill_left_visible,
                            prefill_right_visible, window_size,
                            replay_start};
        return combined_prefill_arrays(step, prefill_seq_lens_cpu, prefill_query_lens_cpu,
                                       max_model_len, max_num_batched_tokens, compress_ratio,
                                       chunk_size, prefill_local, out, out_lens, stream);
      },
      nb::arg("query_start_loc").none(), nb::arg("seq_lens").none(), nb::arg("block_table").none(),
      nb::arg("block_size").none(), nb::arg("token_to_req_indices").none(),
      nb::arg("is_valid_token").none(), nb::arg("num_decodes").none(),
      nb::arg("decode_swa_indices").none(), nb::arg("decode_swa_lens").none(),
      nb::arg("prefill_swa_indices").none(), nb::arg("prefill_swa_lens").none(),
      nb::arg("prefill_swa_width").none(), nb::arg("prefill_gather_lens").none(),
      nb::arg("prefill_left_visible").none(), nb::arg("prefill_right_visible").none(),
      nb::arg("window_size").none(), nb::arg("prefill_seq_lens_cpu").none(),
      nb::arg("prefill_query_lens_cpu").none(), nb::arg("max_model_len").none(),
      nb::arg("max_num_batched_tokens").none(), nb::kw_only(), nb::arg("compress_ratio").none() = 1,
      nb::arg("chunk_size").none() = 4, nb::arg("prefill_local") = nb::none(),
      nb::arg("out").none(), nb::arg("out_lens").none(), nb::arg("replay_start") = nb::none(),
      nb::arg("stream") = nb::none(),
      "md.combined_prefill(compress_ratio, chunk_size, prefill_local=...) over the step's\n"
      "arrays (SwaMetadata's attribute names; prefill_seq_lens_cpu / prefill_query_lens_cpu\n"
      "host arrays), written chunk after chunk into out [>= rows, width] int32 and out_lens\n"
      "[rows] int32 (row i = prefill token num_decode_tokens + i; rows past the chunks' tokens\n"
      "are left as given). replay_start ([>= num_reqs] int32, md.replay_start; None = no\n"
      "replay): a window starts no earlier. Returns the plan: [(start, end, N, M, row_start,\n"
      "row_end)]. The torch op sparse_swa::combined_prefill.");
}

}  // namespace sparse_swa::python
