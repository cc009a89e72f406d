// SPDX-License-Identifier: Apache-2.0
#include "metadata_binding.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "array_output.h"
#include "python_values.h"
#include "sparse_swa/metadata_fields.h"
#include "status_exceptions.h"

namespace sparse_swa::python {

namespace {

nb::object export_index_rows(const ArrayOut& out, const ConstIndexView& v) {
  const auto rows = static_cast<size_t>(v.rows);
  return export_array<int32_t>(out, v.data, {rows, 1, static_cast<size_t>(v.width)},
                               {v.row_stride, v.row_stride, 1});
}

template <typename T>
nb::object export_vector(const ArrayOut& out, const T* data, size_t n) {
  return export_array<T>(out, data, {n}, {1});
}

template <typename T>
using Member = std::remove_cvref_t<T>;

// Calls f(field, member) for field `index` of the field list.
template <typename Md, typename F>
void visit_field(Md& md, size_t index, F&& f) {
  size_t i = 0;
  for_each_metadata_field(md, [&](const MetadataField& field, auto& value) {
    if (i++ == index) f(field, value);
  });
}

// The Python arrays of the field list, under the reference's names: one per array field, two
// per index view (<name>_indices, <name>_lens).
struct PyArray {
  size_t field = 0;
  bool lens = false;  // an index view's lens (else its rows)
  std::string name;
  std::string doc;
};

const std::vector<PyArray>& py_arrays() {
  static const std::vector<PyArray>* arrays = [] {
    auto* out = new std::vector<PyArray>();  // never freed: nanobind keeps the names
    const SwaMetadata md;
    size_t i = 0;
    for_each_metadata_field(md, [&](const MetadataField& f, const auto& value) {
      using T = Member<decltype(value)>;
      const size_t index = i++;
      if (f.reference == nullptr) return;
      const std::string name = f.reference;
      if constexpr (std::is_same_v<T, ConstIndexView>) {
        out->push_back({index, false, name + "_indices", f.doc});
        out->push_back({index, true, name + "_lens", "The lens of " + name + "_indices."});
      } else if constexpr (std::is_same_v<T, std::span<const int32_t>> ||
                           std::is_same_v<T, std::span<const uint8_t>>) {
        out->push_back({index, false, name, f.doc});
      }
    });
    return out;
  }();
  return *arrays;
}

// The scalar fields with a reference name: (field index, name, doc).
struct PyScalar {
  size_t field = 0;
  const char* name = nullptr;
  const char* doc = nullptr;
};

std::vector<PyScalar> py_scalars() {
  std::vector<PyScalar> out;
  const SwaMetadata md;
  size_t i = 0;
  for_each_metadata_field(md, [&](const MetadataField& f, const auto& value) {
    using T = Member<decltype(value)>;
    const size_t index = i++;
    if (f.reference == nullptr) return;
    if constexpr (!std::is_same_v<T, ConstIndexView> &&
                  !std::is_same_v<T, std::span<const int32_t>> &&
                  !std::is_same_v<T, std::span<const uint8_t>>) {
      out.push_back({index, f.reference, f.doc});
    }
  });
  return out;
}

nb::object make_array(const PyMetadata& m, size_t which) {
  const PyArray& a = py_arrays()[which];
  const ArrayOut dev{m.device_framework, m.place, m.builder};
  const ArrayOut host{m.host_framework, Place{Device::kCpu, 0}, m.builder};
  nb::object result = nb::none();
  visit_field(m.md, a.field, [&](const MetadataField& f, const auto& value) {
    using T = Member<decltype(value)>;
    if (!field_present(m.md, f.presence)) return;
    const ArrayOut& out = f.host ? host : dev;
    if constexpr (std::is_same_v<T, ConstIndexView>) {
      result = a.lens ? export_vector(out, value.lens, static_cast<size_t>(value.rows))
                      : export_index_rows(out, value);
    } else if constexpr (std::is_same_v<T, std::span<const int32_t>>) {
      result = export_vector(out, value.data(), value.size());
    } else if constexpr (std::is_same_v<T, std::span<const uint8_t>>) {
      // uint8 0/1 in the library; bool has the same size and representation.
      result = export_vector(out, reinterpret_cast<const bool*>(value.data()), value.size());
    }
  });
  return result;
}

// A scalar field's value (0 while the field is absent, as in the reference).
nb::object scalar(const PyMetadata& m, size_t field) {
  nb::object result = nb::none();
  visit_field(m.md, field, [&](const MetadataField& f, const auto& value) {
    using T = Member<decltype(value)>;
    if constexpr (std::is_same_v<T, LayerTypeSet>) {
      result = nb::cast(value.sorted_names());
    } else if constexpr (std::is_same_v<T, bool>) {
      result = nb::bool_(value);
    } else if constexpr (std::is_integral_v<T>) {
      result = nb::int_(field_present(m.md, f.presence) ? value : T{0});
    }
  });
  return result;
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

nb::object PyMetadata::array(size_t which) {
  if (arrays.empty()) arrays.resize(py_arrays().size());
  nb::object& slot = arrays[which];
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
  c.arrays.resize(py_arrays().size());
  for (size_t i = 0; i < c.arrays.size(); ++i) c.arrays[i] = copy_array(array(i));
  // The chunk plan reads the host arrays: own them. No other view of `c.md` is read again.
  for_each_metadata_field(c.md, [&](const MetadataField& f, auto& value) {
    using T = Member<decltype(value)>;
    if constexpr (std::is_same_v<T, ConstIndexView>) {
      value.data = value.lens = nullptr;
    } else if constexpr (std::is_same_v<T, std::span<const int32_t>>) {
      if (f.host) {
        const std::vector<int32_t>& own =
            c.owned_host_arrays.emplace_back(value.begin(), value.end());
        value = {own.data(), own.size()};
      } else {
        value = {};
      }
    } else if constexpr (std::is_same_v<T, std::span<const uint8_t>>) {
      value = {};
    }
  });
  for (auto [key, value] : tile_sched) c.tile_sched[key] = value;
  for (auto [key, value] : flashinfer_sparse_index_cache) {
    c.flashinfer_sparse_index_cache[key] = value;
  }
  return c;
}

void bind_metadata(nb::module_& m) {
  auto cls =
      nb::class_<PyMetadata>(
          m, "SwaMetadata",
          "One step's SWA metadata, with the reference DeepseekSparseSWAMetadata's field names.\n\n"
          "Arrays alias the builder's persistent buffers: they are valid until the builder's next\n"
          "build() (which overwrites them in place, as the reference's buffers are) and keep the\n"
          "builder alive. Use copy() for a snapshot that later builds do not touch. Arrays come "
          "back\n"
          "in the framework of the inputs (numpy in, numpy out; torch in, torch out) and on their\n"
          "device; the *_cpu arrays are always host arrays.")
          .def_prop_ro("block_size", [](const PyMetadata& x) { return x.block_size; })
          .def_prop_ro(
              "window_size", [](const PyMetadata& x) { return x.md.window_size; },
              "W, the builder's window, also on steps without prefill tokens.")
          .def_prop_ro(
              "prefill_swa_width", [](const PyMetadata& x) { return x.md.prefill_swa.width; },
              "Row width of prefill_swa_indices (W + max_image_tokens), also on steps without\n"
              "prefill tokens: the mixed matrix's SWA section is max(decode_swa_width, this).")
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
          .def_prop_ro("prefill_seq_lens", &prefill_seq_lens,
                       "seq_lens[num_decodes:] (a view of the caller's array), or None.")
          // The caller's inputs, as the reference metadata carries them.
          .def_prop_ro("query_start_loc",
                       [](const PyMetadata& x) { return x.inputs.query_start_loc; })
          .def_prop_ro("query_start_loc_cpu",
                       [](const PyMetadata& x) { return x.inputs.query_start_loc_cpu; })
          .def_prop_ro("seq_lens", [](const PyMetadata& x) { return x.inputs.seq_lens; })
          .def_prop_ro("seq_lens_cpu", [](const PyMetadata& x) { return x.inputs.seq_lens_cpu; })
          .def_prop_ro("block_table", [](const PyMetadata& x) { return x.inputs.block_table; })
          .def_prop_ro("slot_mapping", [](const PyMetadata& x) { return x.inputs.slot_mapping; })
          // FlashMLA tile-scheduler holders, one per layer type the model uses (None when Td == 0).
          .def_prop_ro("tile_sched_swaonly",
                       [](const PyMetadata& x) { return tile_sched(x, "swaonly"); })
          .def_prop_ro("tile_sched_c4a", [](const PyMetadata& x) { return tile_sched(x, "c4a"); })
          .def_prop_ro("tile_sched_c128a",
                       [](const PyMetadata& x) { return tile_sched(x, "c128a"); })
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
  // The field list's scalars and arrays, under the reference's names.
  for (const PyScalar& f : py_scalars()) {
    cls.def_prop_ro(
        f.name, [field = f.field](const PyMetadata& x) { return scalar(x, field); }, f.doc);
  }
  for (size_t i = 0; i < py_arrays().size(); ++i) {
    const PyArray& a = py_arrays()[i];
    cls.def_prop_ro(
        a.name.c_str(), [i](PyMetadata& x) { return x.array(i); }, a.doc.c_str());
  }
}

}  // namespace sparse_swa::python
