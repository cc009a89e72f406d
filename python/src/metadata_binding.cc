#include "metadata_binding.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <tuple>

#include "array_output.h"
#include "python_values.h"
#include "status_exceptions.h"

namespace sparse_swa::python {

namespace {

using A = MetadataArray;

nb::object export_index_rows(const ArrayOut& out, const ConstIndexView& v) {
  const auto rows = static_cast<size_t>(v.rows);
  return export_array<int32_t>(out, v.data, {rows, 1, static_cast<size_t>(v.width)},
                               {v.row_stride, v.row_stride, 1});
}

template <typename T>
nb::object export_vector(const ArrayOut& out, const T* data, size_t n) {
  return export_array<T>(out, data, {n}, {1});
}

nb::object export_ints(const ArrayOut& out, std::span<const int32_t> s) {
  return export_vector(out, s.data(), s.size());
}

nb::object make_array(const PyMetadata& m, A which) {
  const SwaMetadata& md = m.md;
  const ArrayOut dev{m.device_framework, m.place, m.builder};
  const ArrayOut host{m.host_framework, Place{Device::kCpu, 0}, m.builder};
  const bool prefill_tokens = md.num_prefill_tokens > 0;
  const bool prefill_reqs = md.num_prefills > 0;
  switch (which) {
    case A::kDecodeSwaIndices:
      return export_index_rows(dev, md.decode_swa);
    case A::kDecodeSwaLens:
      return export_vector(dev, md.decode_swa.lens, static_cast<size_t>(md.decode_swa.rows));
    case A::kPrefillSwaIndices:
      return prefill_tokens ? export_index_rows(dev, md.prefill_swa) : nb::none();
    case A::kPrefillSwaLens:
      return prefill_tokens
                 ? export_vector(dev, md.prefill_swa.lens, static_cast<size_t>(md.prefill_swa.rows))
                 : nb::none();
    case A::kLeftVisible:
      return md.has_image() ? export_ints(dev, md.left_visible) : nb::none();
    case A::kRightVisible:
      return md.has_image() ? export_ints(dev, md.right_visible) : nb::none();
    case A::kGatherLens:
      return prefill_reqs ? export_ints(dev, md.prefill_gather_lens) : nb::none();
    case A::kPrefillSeqLensCpu:
      return prefill_reqs ? export_ints(host, md.prefill_seq_lens_host) : nb::none();
    case A::kPrefillQueryLensCpu:
      return prefill_reqs ? export_ints(host, md.prefill_query_lens_host) : nb::none();
    case A::kTokenToReq:
      return export_ints(dev, md.token_to_req_indices);
    case A::kIsValidToken:
      // uint8 0/1 in the library; bool has the same size and representation.
      return export_vector(dev, reinterpret_cast<const bool*>(md.is_valid_token.data()),
                           md.is_valid_token.size());
    case A::kCount:
      break;
  }
  return nb::none();
}

template <A which>
nb::object get(PyMetadata& m) {
  return m.array(which);
}

nb::object tile_sched(const PyMetadata& m, const char* name) {
  return m.tile_sched.contains(name) ? nb::object(m.tile_sched[name]) : nb::none();
}

nb::object prefill_seq_lens(const PyMetadata& m) {
  if (m.md.num_prefills == 0) return nb::none();
  return m.inputs.seq_lens[nb::slice(nb::int_(m.md.num_decodes), nb::none(), nb::none())];
}

std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> chunk_plan(
    const PyMetadata& m, nb::handle compress_ratio, nb::handle prefill_chunk_size,
    nb::handle has_compressed) {
  const int64_t ratio = int_from_python(compress_ratio, "compress_ratio", INT64_MIN, INT64_MAX);
  const int64_t chunk =
      int_from_python(prefill_chunk_size, "prefill_chunk_size", INT64_MIN, INT64_MAX);
  std::optional<bool> compressed;
  if (!has_compressed.is_none()) compressed = bool_from_python(has_compressed, "has_compressed");
  m.expect_current();
  auto plan = prefill_chunk_plan(m.md, ratio, chunk, compressed);
  throw_if_error(plan.status());
  std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> out;
  out.reserve(plan.value().size());
  for (const ChunkPlanEntry& e : plan.value()) {
    out.emplace_back(e.start, e.end, e.compressed_width, e.total_width);
  }
  return out;
}

std::string repr(const PyMetadata& m) {
  const SwaMetadata& md = m.md;
  return str_cat(
      "SwaMetadata(backend=", m.impl ? backend_name(m.impl->backend()) : "copy",
      ", num_decodes=", md.num_decodes, ", num_prefills=", md.num_prefills,
      ", num_decode_tokens=", md.num_decode_tokens, ", num_prefill_tokens=", md.num_prefill_tokens,
      ", decode_swa_width=", md.decode_swa_width(), ", causal=", md.causal ? "True" : "False", ")");
}

}  // namespace

nb::object PyMetadata::array(MetadataArray which) {
  nb::object& slot = arrays[static_cast<int>(which)];
  if (!slot.is_valid()) slot = make_array(*this, which);
  return slot;
}

void PyMetadata::expect_current() const {
  if (impl == nullptr || *backend_generation == generation) return;
  raise_value_error(str_cat("metadata: expected the metadata of its builder's last build() (",
                            *backend_generation, "), got build ", generation));
}

PyMetadata PyMetadata::copy() {
  expect_current();
  PyMetadata c;
  c.md = md;
  c.builder = nb::none();
  c.generation = generation;
  c.block_size = block_size;
  c.place = place;
  c.device_framework = device_framework;
  c.host_framework = host_framework;
  c.inputs = inputs;
  for (int i = 0; i < static_cast<int>(A::kCount); ++i) {
    c.arrays[i] = copy_array(array(static_cast<A>(i)));
  }
  // The chunk plan reads the host lens: own them. No other view of `c.md` is read again.
  const size_t rp = md.prefill_seq_lens_host.size();
  c.owned_host_lens.assign(md.prefill_seq_lens_host.begin(), md.prefill_seq_lens_host.end());
  c.owned_host_lens.insert(c.owned_host_lens.end(), md.prefill_query_lens_host.begin(),
                           md.prefill_query_lens_host.end());
  c.md.prefill_seq_lens_host = {c.owned_host_lens.data(), rp};
  c.md.prefill_query_lens_host = {c.owned_host_lens.data() + rp, md.prefill_query_lens_host.size()};
  c.md.decode_swa.data = c.md.decode_swa.lens = nullptr;
  c.md.prefill_swa.data = c.md.prefill_swa.lens = nullptr;
  c.md.token_to_req_indices = {};
  c.md.is_valid_token = {};
  c.md.prefill_gather_lens = {};
  for (auto [key, value] : tile_sched) c.tile_sched[key] = value;
  for (auto [key, value] : flashinfer_sparse_index_cache) {
    c.flashinfer_sparse_index_cache[key] = value;
  }
  return c;
}

void bind_metadata(nb::module_& m) {
  nb::class_<PyMetadata>(
      m, "SwaMetadata",
      "One step's SWA metadata, with the reference DeepseekSparseSWAMetadata's field names.\n\n"
      "Arrays alias the builder's persistent buffers: they are valid until the builder's next\n"
      "build() (which overwrites them in place, as the reference's buffers are) and keep the\n"
      "builder alive. Use copy() for a snapshot that later builds do not touch. Arrays come back\n"
      "in the framework of the inputs (numpy in, numpy out; torch in, torch out) and on their\n"
      "device; the *_cpu arrays are always host arrays.")
      // Step shape.
      .def_prop_ro("num_decodes", [](const PyMetadata& x) { return x.md.num_decodes; })
      .def_prop_ro("num_prefills", [](const PyMetadata& x) { return x.md.num_prefills; })
      .def_prop_ro(
          "num_decode_tokens", [](const PyMetadata& x) { return x.md.num_decode_tokens; }, "Td.")
      .def_prop_ro(
          "num_prefill_tokens", [](const PyMetadata& x) { return x.md.num_prefill_tokens; }, "Tp.")
      .def_prop_ro("num_reqs", [](const PyMetadata& x) { return x.md.num_reqs; })
      .def_prop_ro(
          "num_tokens", [](const PyMetadata& x) { return x.md.num_tokens; },
          "T, CUDA-graph padding included.")
      .def_prop_ro("max_decode_query_len",
                   [](const PyMetadata& x) { return x.md.max_decode_query_len; })
      .def_prop_ro(
          "decode_swa_width", [](const PyMetadata& x) { return x.md.decode_swa_width(); },
          "Row width of decode_swa_indices: W (causal) or the DSpark non-causal width.")
      .def_prop_ro("causal", [](const PyMetadata& x) { return x.md.causal; })
      .def_prop_ro("block_size", [](const PyMetadata& x) { return x.block_size; })
      .def_prop_ro(
          "backend",
          [](const PyMetadata& x) -> nb::object {
            if (x.impl == nullptr) return nb::none();
            return nb::str(backend_name(x.impl->backend()));
          },
          "\"cpu\" or \"cuda\"; None for a copy().")
      .def_prop_ro(
          "is_current",
          [](const PyMetadata& x) {
            return x.backend_generation && *x.backend_generation == x.generation;
          },
          "True until the builder's next build() on the same backend.")
      // Index rows.
      .def_prop_ro("decode_swa_indices", &get<A::kDecodeSwaIndices>,
                   "[num_decode_tokens, 1, decode_swa_width] int32 slot ids, -1 = empty (the\n"
                   "reference's shape). Row i's valid entries are [0, decode_swa_lens[i]).")
      .def_prop_ro("decode_swa_lens", &get<A::kDecodeSwaLens>, "[num_decode_tokens] int32.")
      .def_prop_ro("prefill_swa_indices", &get<A::kPrefillSwaIndices>,
                   "[num_prefill_tokens, 1, W + max_image_tokens] int32, or None without prefill "
                   "tokens.")
      .def_prop_ro("prefill_swa_lens", &get<A::kPrefillSwaLens>,
                   "[num_prefill_tokens] int32, or None.")
      .def_prop_ro("prefill_left_visible", &get<A::kLeftVisible>,
                   "[num_tokens] int32 in-image left visibility by absolute token (decode rows 0), "
                   "or None unless the image path ran.")
      .def_prop_ro("prefill_right_visible", &get<A::kRightVisible>,
                   "[num_tokens] int32, or None (see prefill_left_visible).")
      .def_prop_ro("prefill_gather_lens", &get<A::kGatherLens>,
                   "[num_prefills] int32: query_len + min(prefix, W - 1), or None.")
      .def_prop_ro("prefill_seq_lens_cpu", &get<A::kPrefillSeqLensCpu>,
                   "[num_prefills] int32 host array, or None.")
      .def_prop_ro("prefill_query_lens_cpu", &get<A::kPrefillQueryLensCpu>,
                   "[num_prefills] int32 host array, or None.")
      .def_prop_ro("token_to_req_indices", &get<A::kTokenToReq>,
                   "[num_tokens] int32; padding tokens map to request 0.")
      .def_prop_ro("is_valid_token", &get<A::kIsValidToken>,
                   "[num_tokens] bool: slot_mapping >= 0.")
      .def_prop_ro("prefill_seq_lens", &prefill_seq_lens,
                   "seq_lens[num_decodes:] (a view of the caller's array), or None.")
      .def_prop_ro("prefill_window_size",
                   [](const PyMetadata& x) { return x.md.num_prefills > 0 ? x.md.window_size : 0; })
      .def_prop_ro("prefill_max_model_len",
                   [](const PyMetadata& x) -> int64_t {
                     return x.md.num_prefills > 0 ? x.md.max_model_len : 0;
                   })
      .def_prop_ro("prefill_max_num_batched_tokens",
                   [](const PyMetadata& x) {
                     return x.md.num_prefills > 0 ? x.md.max_num_batched_tokens : 0;
                   })
      // The caller's inputs, as the reference metadata carries them.
      .def_prop_ro("query_start_loc", [](const PyMetadata& x) { return x.inputs.query_start_loc; })
      .def_prop_ro("query_start_loc_cpu",
                   [](const PyMetadata& x) { return x.inputs.query_start_loc_cpu; })
      .def_prop_ro("seq_lens", [](const PyMetadata& x) { return x.inputs.seq_lens; })
      .def_prop_ro("seq_lens_cpu", [](const PyMetadata& x) { return x.inputs.seq_lens_cpu; })
      .def_prop_ro("block_table", [](const PyMetadata& x) { return x.inputs.block_table; })
      .def_prop_ro("slot_mapping", [](const PyMetadata& x) { return x.inputs.slot_mapping; })
      // FlashMLA tile-scheduler holders, one per layer type the model uses (None when Td == 0).
      .def_prop_ro(
          "tile_schedulers",
          [](const PyMetadata& x) { return x.md.tile_schedulers.sorted_names(); },
          "Sorted layer type names that need a tile-scheduler plan this step.")
      .def_prop_ro("tile_sched_swaonly",
                   [](const PyMetadata& x) { return tile_sched(x, "swaonly"); })
      .def_prop_ro("tile_sched_c4a", [](const PyMetadata& x) { return tile_sched(x, "c4a"); })
      .def_prop_ro("tile_sched_c128a", [](const PyMetadata& x) { return tile_sched(x, "c128a"); })
      .def_prop_ro("tile_sched_c1a", [](const PyMetadata& x) { return tile_sched(x, "c1a"); })
      .def_prop_ro("tile_sched_c2a", [](const PyMetadata& x) { return tile_sched(x, "c2a"); })
      .def_prop_ro(
          "flashinfer_sparse_index_cache",
          [](const PyMetadata& x) { return x.flashinfer_sparse_index_cache; },
          "A dict for consumers' per-step caches; cleared by the draft update.")
      .def("get_prefill_chunk_plan", &chunk_plan, nb::arg("compress_ratio").none(),
           nb::arg("prefill_chunk_size").none(), nb::arg("has_compressed") = nb::none(),
           "The reference's greedy prefill workspace plan: a list of (start, end, N, M) over\n"
           "the prefill requests, N the compressed width and M = N + max gather length.\n"
           "has_compressed defaults to compress_ratio > 1. ValueError for a ratio outside\n"
           "{1, 2, 4, 128}, prefill_chunk_size < 1 or metadata no longer current.")
      .def("copy", &PyMetadata::copy,
           "A snapshot whose arrays are owned copies (made by their own framework); later\n"
           "builds do not change it. A copy cannot be passed to the draft update.")
      .def("__repr__", &repr);
}

}  // namespace sparse_swa::python
