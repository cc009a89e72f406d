// SPDX-License-Identifier: Apache-2.0
#include "builder_binding.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "batch_arrays.h"
#include "call_arrays.h"
#include "config_binding.h"
#include "metadata_binding.h"
#include "python_values.h"
#include "status_exceptions.h"

namespace sparse_swa::python {

namespace {

// The library names the BatchInput fields ("batch.seq_lens[0]"); Python names the arguments.
Status argument_names(const Status& status) {
  return renamed_fields(status, {{"batch.query_start_loc_host", "query_start_loc_cpu"},
                                 {"batch.seq_lens_host", "seq_lens_cpu"},
                                 {"batch.", ""}});
}

class PyMetadataBuilder {
  struct BackendState;  // one backend's builder, its build count and stream (below)

 public:
  PyMetadataBuilder(nb::handle config, nb::handle device, nb::handle cuda_stream,
                    nb::object tile_sched_factory)
      : config_(config_from_object(config)),
        cuda_stream_(reinterpret_cast<void*>(
            static_cast<uintptr_t>(int_from_python(cuda_stream, "cuda_stream", 0, INT64_MAX)))),
        tile_sched_factory_(std::move(tile_sched_factory)) {
    throw_if_error(validate_config(config_));
    derived_ = derive_config(config_);
    if (!tile_sched_factory_.is_none() && !PyCallable_Check(tile_sched_factory_.ptr())) {
      raise_value_error("tile_sched_factory: expected None or a callable");
    }
    if (device.is_none()) return;
    const std::string name = string_from_python(device, "device");
    if (name == "cpu") {
      backend(Device::kCpu);
    } else if (name == "cuda") {
      backend(Device::kCuda);
    } else {
      raise_value_error(
          str_cat("device: expected None, \"cpu\" or \"cuda\", got ", value_text(device)));
    }
  }

  // A build's arguments imported and checked, the backend chosen and on the call's stream.
  struct PreparedBuild {
    ImportedBatch batch;
    BackendState* state = nullptr;
    BatchInput input;
    InputArray replay;  // kept alive until the build returns: the builder copies it
    BatchObjects objects;
  };

  PreparedBuild prepare(BatchObjects objects, nb::handle image_spans, nb::handle replay_start,
                        nb::handle stream, std::string_view replay_name = "replay_start") {
    PreparedBuild p;
    p.batch = import_batch(objects);
    p.state = &backend_at(p.batch.place);
    use_stream(*p.state, p.batch, objects, stream);
    spans_ = image_spans_from_python(image_spans);
    p.input = p.batch.input;
    p.input.image_spans = spans_;
    if (!replay_start.is_none()) {
      p.replay = import_array(replay_start, replay_name);
      expect_place(p.replay, replay_name, p.batch.place, "like query_start_loc");
      p.input.replay_start = int32_vector(p.replay, replay_name);
      if (p.input.replay_start.size() != p.input.seq_lens.size()) {
        // An empty array would read as "not given": name the length here.
        raise_value_error(str_cat(replay_name, ": expected num_reqs = ", p.input.seq_lens.size(),
                                  " entries (one per request; None for no replay), got ",
                                  p.input.replay_start.size()));
      }
    }
    p.objects = std::move(objects);
    return p;
  }

  // The metadata of a prepared build that `md` now holds.
  PyMetadata finish(nb::handle self, PreparedBuild& p, const SwaMetadata& md) {
    BackendState& b = *p.state;
    PyMetadata out;
    out.md = md;
    out.generation = ++*b.generation;
    out.backend_generation = b.generation;
    out.builder = nb::borrow(self);
    out.impl = b.impl.get();
    out.block_size = config_.block_size;
    out.place = p.batch.place;
    out.cuda_stream = cuda_stream_;
    out.device_framework = p.batch.device_framework;
    out.host_framework = p.batch.host_framework;
    out.inputs = std::move(p.objects);
    refresh_tile_sched(out);
    return out;
  }

  PyMetadata build(nb::handle self, BatchObjects objects, nb::handle image_spans,
                   nb::handle replay_start, nb::handle stream) {
    PreparedBuild p = prepare(std::move(objects), image_spans, replay_start, stream);
    SwaMetadata md;
    throw_if_error(argument_names(p.state->impl->build(p.input, &md)));
    return finish(self, p, md);
  }

  void update_draft(nb::handle self, PyMetadata& md, BatchObjects objects, nb::handle stream) {
    if (md.impl == nullptr) {
      raise_value_error("metadata: expected the metadata returned by build(), got a copy()");
    }
    if (!md.builder.is(self)) {
      raise_value_error("metadata: expected metadata built by this MetadataBuilder");
    }
    if (*md.backend_generation != md.generation) {
      raise_value_error(str_cat("metadata: expected the metadata of this builder's last build() (",
                                *md.backend_generation, " on ", backend_name(md.impl->backend()),
                                "), got build ", md.generation));
    }
    objects.causal = md.md.causal;
    const ImportedBatch batch = import_batch(objects);
    if (!(batch.place == md.place)) {
      raise_value_error(str_cat("query_start_loc: expected device ", place_name(md.place),
                                " like the metadata's build, got ", place_name(batch.place)));
    }
    use_stream(backend(batch.place.device), batch, objects, stream);
    throw_if_error(argument_names(md.impl->update_draft_decode_rows(batch.input, &md.md)));
    md.inputs = std::move(objects);
    refresh_tile_sched(md);
    md.flashinfer_sparse_index_cache.clear();
  }

  const BuilderConfig& config() const { return config_; }
  const DerivedConfig& derived() const { return derived_; }
  uintptr_t cuda_stream() const { return reinterpret_cast<uintptr_t>(cuda_stream_); }
  std::vector<std::string> backends() const {
    std::vector<std::string> names;
    if (cpu_.impl) names.emplace_back("cpu");
    if (cuda_.impl) names.emplace_back("cuda");
    return names;
  }

 private:
  struct BackendState {
    std::unique_ptr<MetadataBuilder> impl;
    std::shared_ptr<uint64_t> generation = std::make_shared<uint64_t>(0);
    int device_id = -1;      // CUDA: the device of the first build's arrays (-1: none yet)
    void* stream = nullptr;  // CUDA: the stream the backend enqueues on now
  };

  BackendState& backend(Device device) {
    BackendState& b = device == Device::kCpu ? cpu_ : cuda_;
    if (!b.impl) {
      auto created = MetadataBuilder::create(
          config_, device == Device::kCpu ? sparse_swa::Backend::kCpu : sparse_swa::Backend::kCuda,
          cuda_stream_);
      throw_if_error(created.status());
      b.impl = std::move(created).value();
      b.stream = cuda_stream_;
    }
    return b;
  }

  BackendState& backend_at(const Place& place) {
    BackendState& b = backend(place.device);
    if (place.device == Device::kCuda) {
      if (b.device_id < 0) b.device_id = place.device_id;
      if (b.device_id != place.device_id) {
        raise_value_error(str_cat("query_start_loc: expected device cuda:", b.device_id,
                                  " (where this builder's CUDA buffers live), got ",
                                  place_name(place)));
      }
    }
    return b;
  }

  // Points the CUDA backend at the call's stream (stream_from: torch's current stream for torch
  // arrays, else the creation-time cuda_stream).
  void use_stream(BackendState& b, const ImportedBatch& batch, const BatchObjects& objects,
                  nb::handle stream) {
    if (batch.place.device != Device::kCuda) return;
    CallPlace call;
    call.place = batch.place;
    call.anchor = "query_start_loc";
    call.framework = batch.device_framework;
    call.anchor_obj = objects.query_start_loc;
    void* s = stream_from(stream, call, cuda_stream_);
    if (s != b.stream) {
      b.impl->set_cuda_stream(s);
      b.stream = s;
    }
  }

  // Fresh holders per step, as the reference makes them: the factory's object (an engine passes
  // its FlashMLA get_mla_metadata) or, without one, the layer type name.
  void refresh_tile_sched(PyMetadata& md) const {
    md.tile_sched.clear();
    for (const std::string& name : md.md.tile_schedulers.sorted_names()) {
      md.tile_sched[name.c_str()] =
          tile_sched_factory_.is_none() ? nb::object(nb::str(name.c_str())) : tile_sched_factory_();
    }
  }

  BuilderConfig config_;
  DerivedConfig derived_;
  void* cuda_stream_ = nullptr;
  nb::object tile_sched_factory_;
  BackendState cpu_, cuda_;
  std::vector<ImageSpan> spans_;  // reused across builds
};

// The metadata argument of the draft update: a SwaMetadata, or ValueError naming it.
PyMetadata& metadata_from(nb::handle obj) {
  if (!nb::isinstance<PyMetadata>(obj)) {
    raise_value_error(
        str_cat("metadata: expected the SwaMetadata returned by build(), got ", describe(obj)));
  }
  if (!nb::inst_ready(obj)) {
    raise_value_error(
        "metadata: expected the SwaMetadata returned by build(), got one made by "
        "__new__");
  }
  return nb::cast<PyMetadata&>(obj);
}

BatchObjects batch_objects(nb::object qsl, nb::object seq, nb::object bt, nb::object slots,
                           bool causal, nb::object qsl_cpu, nb::object seq_cpu) {
  return {std::move(qsl),     std::move(seq),     std::move(bt), std::move(slots),
          std::move(qsl_cpu), std::move(seq_cpu), causal};
}

nb::object or_default(nb::object given, const nb::object& fallback) {
  return given.is_none() ? fallback : given;
}

// The list argument `name` (a list or tuple) with n entries.
nb::sequence list_of(nb::handle obj, const char* name, size_t n) {
  if (!PyList_Check(obj.ptr()) && !PyTuple_Check(obj.ptr())) {
    raise_value_error(str_cat(name, ": expected a list, got ", type_name_of(obj)));
  }
  if (nb::len(obj) != n) {
    raise_value_error(
        str_cat(name, ": expected one entry per builder (", n, "), got ", nb::len(obj)));
  }
  return nb::borrow<nb::sequence>(obj);
}

// MetadataBuilder.build_groups: every group's build, checked all before any is written, one
// launch on the CUDA backend (docs/design.md#one-build-for-several-groups).
nb::list build_groups(nb::handle builders, nb::object qsl, nb::object seq, nb::handle block_tables,
                      nb::handle slot_mappings, nb::handle causal, nb::handle image_spans,
                      nb::object qsl_cpu, nb::object seq_cpu, nb::handle replay_starts,
                      nb::handle stream) {
  if (!PyList_Check(builders.ptr()) && !PyTuple_Check(builders.ptr())) {
    raise_value_error(
        str_cat("builders: expected a list of MetadataBuilder, got ", type_name_of(builders)));
  }
  const size_t n = nb::len(builders);
  if (n == 0 || n > static_cast<size_t>(kMaxBuildGroups)) {
    raise_value_error(str_cat("builders: expected 1..", kMaxBuildGroups, " builders, got ", n));
  }
  const nb::sequence tables = list_of(block_tables, "block_tables", n);
  const nb::sequence slots = list_of(slot_mappings, "slot_mappings", n);
  const bool is_causal = bool_from_python(causal, "causal");
  std::vector<PyMetadataBuilder*> py(n);
  std::vector<nb::handle> selves(n);
  for (size_t g = 0; g < n; ++g) {
    selves[g] = builders[g];
    if (!nb::isinstance<PyMetadataBuilder>(selves[g]) || !nb::inst_ready(selves[g])) {
      raise_value_error(
          str_cat("builders[", g, "]: expected a MetadataBuilder, got ", describe(selves[g])));
    }
    py[g] = &nb::cast<PyMetadataBuilder&>(selves[g]);
  }
  std::vector<PyMetadataBuilder::PreparedBuild> prepared;
  prepared.reserve(n);
  std::vector<MetadataBuilder*> impls(n);
  std::vector<BatchInput> inputs(n);
  for (size_t g = 0; g < n; ++g) {
    nb::handle replay = nb::none();
    if (!replay_starts.is_none()) replay = list_of(replay_starts, "replay_starts", n)[g];
    prepared.push_back(
        py[g]->prepare(batch_objects(qsl, seq, tables[g], slots[g], is_causal, qsl_cpu, seq_cpu),
                       image_spans, replay, stream, str_cat("replay_starts[", g, "]")));
    impls[g] = prepared[g].state->impl.get();
    inputs[g] = prepared[g].input;
  }
  std::vector<SwaMetadata> mds(n);
  throw_if_error(argument_names(MetadataBuilder::build_groups(impls, inputs, mds)));
  nb::list out;
  for (size_t g = 0; g < n; ++g) out.append(py[g]->finish(selves[g], prepared[g], mds[g]));
  return out;
}

}  // namespace

void bind_builder(nb::module_& m) {
  nb::class_<PyMetadataBuilder>(
      m, "MetadataBuilder", nb::is_weak_referenceable(),
      "The per-step SWA metadata builder (the reference DeepseekSparseSWAMetadataBuilder).\n\n"
      "config: a dict with the JSON config's field names, or a BuilderConfig. ValueError\n"
      "    naming the field when it is invalid.\n"
      "device: None (create each backend at its first build), \"cpu\" or \"cuda\" (create that\n"
      "    backend now, e.g. before CUDA graph capture; cuda uses the current CUDA device).\n"
      "cuda_stream: the default cudaStream_t (an int) of calls made with stream=None on\n"
      "    arrays that are not torch tensors (torch tensors default to torch's current\n"
      "    stream); 0 = the legacy default stream. Every call may pass its own stream=.\n"
      "tile_sched_factory: called once per present layer type per build for the\n"
      "    tile_sched_* fields (e.g. lambda: get_mla_metadata()[0]); None puts the layer\n"
      "    type name there instead.\n\n"
      "Not thread-safe: one builder serves one engine thread.")
      .def(
          "__init__",
          [](PyMetadataBuilder* self, nb::handle config, nb::handle device, nb::handle cuda_stream,
             nb::object factory) {
            new (self) PyMetadataBuilder(config, device, cuda_stream, std::move(factory));
          },
          nb::arg("config").none(), nb::kw_only(), nb::arg("device") = nb::none(),
          nb::arg("cuda_stream").none() = 0, nb::arg("tile_sched_factory") = nb::none())
      .def(
          "build",
          [](nb::handle self, nb::object qsl, nb::object seq, nb::object bt, nb::object slots,
             nb::handle causal, nb::handle image_spans, nb::object qsl_cpu, nb::object seq_cpu,
             nb::handle replay_start, nb::handle stream) {
            PyMetadataBuilder& b = nb::cast<PyMetadataBuilder&>(self);
            return b.build(self,
                           batch_objects(qsl, seq, bt, slots, bool_from_python(causal, "causal"),
                                         qsl_cpu, seq_cpu),
                           image_spans, replay_start, stream);
          },
          nb::arg("query_start_loc").none(), nb::arg("seq_lens").none(),
          nb::arg("block_table").none(), nb::arg("slot_mapping").none(),
          nb::arg("causal").none() = true, nb::arg("image_spans") = nb::none(),
          nb::arg("query_start_loc_cpu") = nb::none(), nb::arg("seq_lens_cpu") = nb::none(),
          nb::kw_only(), nb::arg("replay_start") = nb::none(), nb::arg("stream") = nb::none(),
          "Builds one step's metadata (decode requests first, as the scheduler orders them).\n\n"
          "query_start_loc: [num_reqs + 1] int32, 0 first, non-decreasing.\n"
          "seq_lens: [num_reqs] int32, context + query tokens after this step.\n"
          "block_table: [>= num_reqs, max_blocks] int32 page ids, unit column stride.\n"
          "slot_mapping: [num_tokens] int64 KV write slots, -1 = padding.\n"
          "causal: False for DSpark non-causal draft rows.\n"
          "image_spans: {request index: [(start, end), ...]} inclusive absolute positions.\n"
          "query_start_loc_cpu, seq_lens_cpu: host int32 copies of the same lengths, or None;\n"
          "    required with cuda arrays.\n"
          "replay_start: SWA bounded replay, [num_reqs] int32 beside the batch arrays (same\n"
          "    device): the first position of each request with window KV, 0 <= replay_start[r]\n"
          "    <= seq_lens[r] - query_len. Causal rows start no earlier and prefill gather lens\n"
          "    shrink; DSpark non-causal rows ignore it. None = zeros (metadata.replay_start\n"
          "    is then zeros).\n"
          "stream: the CUDA stream this build enqueues on: None = torch's current stream for\n"
          "    torch tensors, else the builder's cuda_stream; an int (cudaStream_t) or an object\n"
          "    with .cuda_stream or __cuda_stream__(). Ignored on the host.\n\n"
          "Host arrays run the CPU backend, cuda arrays the CUDA backend (RuntimeError when\n"
          "this build has none). Arrays are taken without copies: dtype, rank, layout and\n"
          "device mismatches raise ValueError naming the argument, as do invalid values.\n"
          "The result's arrays alias this builder's buffers until its next build().")
      .def_static("build_groups", &build_groups, nb::arg("builders").none(),
                  nb::arg("query_start_loc").none(), nb::arg("seq_lens").none(),
                  nb::arg("block_tables").none(), nb::arg("slot_mappings").none(),
                  nb::arg("causal").none() = true, nb::arg("image_spans") = nb::none(),
                  nb::arg("query_start_loc_cpu") = nb::none(), nb::arg("seq_lens_cpu") = nb::none(),
                  nb::kw_only(), nb::arg("replay_starts") = nb::none(),
                  nb::arg("stream") = nb::none(),
                  "One step's metadata for several KV-cache groups: a list whose entry g is\n"
                  "builders[g].build(query_start_loc, seq_lens, block_tables[g],\n"
                  "slot_mappings[g], ..., replay_start=replay_starts[g]), bit for bit. Every\n"
                  "group is checked before any is written; on cuda arrays all groups are\n"
                  "written by one kernel launch, on the call's stream. builders: 1..8 distinct\n"
                  "MetadataBuilders (their configs may differ in window, block size, ...).\n"
                  "block_tables, slot_mappings: one array per builder (the same object may\n"
                  "repeat). replay_starts: None, or one array or None per builder. Each\n"
                  "result belongs to its builder (builders[g].update_draft_decode_metadata).")
      .def(
          "update_draft_decode_metadata",
          [](nb::handle self, nb::handle metadata, nb::object seq, nb::object bt, nb::object slots,
             nb::object qsl, nb::object qsl_cpu, nb::object seq_cpu, nb::handle stream) {
            PyMetadata& md = metadata_from(metadata);
            const BatchObjects& in = md.inputs;
            BatchObjects objects = batch_objects(
                or_default(qsl, in.query_start_loc), or_default(seq, in.seq_lens),
                or_default(bt, in.block_table), or_default(slots, in.slot_mapping), in.causal,
                or_default(qsl_cpu, in.query_start_loc_cpu), or_default(seq_cpu, in.seq_lens_cpu));
            nb::cast<PyMetadataBuilder&>(self).update_draft(self, md, std::move(objects), stream);
          },
          nb::arg("metadata").none(), nb::kw_only(), nb::arg("seq_lens") = nb::none(),
          nb::arg("block_table") = nb::none(), nb::arg("slot_mapping") = nb::none(),
          nb::arg("query_start_loc") = nb::none(), nb::arg("query_start_loc_cpu") = nb::none(),
          nb::arg("seq_lens_cpu") = nb::none(), nb::arg("stream") = nb::none(),
          "The reference's update_draft_decode_metadata, between the draft loop's steps: after\n"
          "the engine advanced the arrays in place, recompute is_valid_token from slot_mapping\n"
          "(every token), token_to_req_indices of the decode tokens from query_start_loc\n"
          "(padding tokens map to the last request), and the decode rows in the build's mode:\n"
          "causal rows of the logical window W (never the row width) with the build's\n"
          "replay_start, or DSpark non-causal rows for a non-causal build. The FlashInfer\n"
          "decode lens are refreshed when the build wrote them. Each array is the one given\n"
          "here or, for None, the one the metadata was built from. The arrays are\n"
          "authoritative: the host copies (query_start_loc_cpu, seq_lens_cpu) are not read\n"
          "and may still hold the build's values. metadata must be this builder's last\n"
          "build().")
      .def(
          "update_draft_decode_rows",
          [](nb::handle self, nb::handle metadata, nb::object qsl, nb::object seq, nb::object bt,
             nb::object slots, nb::object qsl_cpu, nb::object seq_cpu, nb::handle stream) {
            PyMetadata& md = metadata_from(metadata);
            nb::cast<PyMetadataBuilder&>(self).update_draft(
                self, md, batch_objects(qsl, seq, bt, slots, md.md.causal, qsl_cpu, seq_cpu),
                stream);
          },
          nb::arg("metadata").none(), nb::arg("query_start_loc").none(), nb::arg("seq_lens").none(),
          nb::arg("block_table").none(), nb::arg("slot_mapping").none(),
          nb::arg("query_start_loc_cpu") = nb::none(), nb::arg("seq_lens_cpu") = nb::none(),
          nb::kw_only(), nb::arg("stream") = nb::none(),
          "update_draft_decode_metadata with the four batch arrays given explicitly.")
      .def_prop_ro(
          "config", [](const PyMetadataBuilder& b) { return b.config(); },
          "A copy of the BuilderConfig.")
      .def_prop_ro(
          "decode_threshold",
          [](const PyMetadataBuilder& b) { return b.derived().decode_threshold; },
          "theta = 1 + k, plus k with parallel_drafting unless model_runner_v2.")
      .def_prop_ro(
          "prefill_index_width",
          [](const PyMetadataBuilder& b) { return b.derived().prefill_index_width; },
          "W + max_image_tokens when widen_image_spans, else W.")
      .def_prop_ro(
          "noncausal_index_width",
          [](const PyMetadataBuilder& b) { return b.derived().noncausal_index_width; },
          "DSpark non-causal row width (0 without DSpark).")
      .def_prop_ro(
          "layer_types",
          [](const PyMetadataBuilder& b) { return b.derived().layer_types.sorted_names(); })
      .def_prop_ro("cuda_stream", &PyMetadataBuilder::cuda_stream)
      .def_prop_ro("backends", &PyMetadataBuilder::backends,
                   "The backends created so far (\"cpu\", \"cuda\").");
}

}  // namespace sparse_swa::python
