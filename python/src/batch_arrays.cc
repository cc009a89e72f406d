// SPDX-License-Identifier: Apache-2.0
#include "batch_arrays.h"

#include "python_values.h"
#include "sparse_swa/status.h"
#include "status_exceptions.h"

namespace sparse_swa::python {

namespace {

constexpr const char* kLikeQsl = "like query_start_loc";

InputArray import_on(nb::handle obj, const char* field, const Place& place, const char* why) {
  InputArray a = import_array(obj, field);
  expect_place(a, field, place, why);
  return a;
}

// The library reads an empty host copy as none given: an empty array where rows are expected
// must not pass for None.
void expect_host_copy_size(size_t size, size_t expected, std::string_view array) {
  if (size != expected) {
    raise_value_error(str_cat(array, "_cpu: expected ", expected, " entries (a host copy of ",
                              array, "; None for no copy), got ", size));
  }
}

}  // namespace

ImportedBatch import_batch(const BatchObjects& o) {
  ImportedBatch b;
  b.query_start_loc = import_array(o.query_start_loc, "query_start_loc");
  b.place = place_of(b.query_start_loc, "query_start_loc");
  b.seq_lens = import_on(o.seq_lens, "seq_lens", b.place, kLikeQsl);
  b.block_table = import_on(o.block_table, "block_table", b.place, kLikeQsl);
  b.slot_mapping = import_on(o.slot_mapping, "slot_mapping", b.place, kLikeQsl);
  b.device_framework = framework_of(o.query_start_loc);
  b.host_framework = b.device_framework;

  const bool on_device = b.place.device == Device::kCuda;
  const MemorySpace space = on_device ? MemorySpace::kDevice : MemorySpace::kHost;
  BatchInput& in = b.input;
  in.query_start_loc = int32_vector(b.query_start_loc, "query_start_loc");
  in.seq_lens = int32_vector(b.seq_lens, "seq_lens");
  in.block_table = int32_matrix(b.block_table, "block_table", space);
  in.slot_mapping = int64_vector(b.slot_mapping, "slot_mapping");
  in.causal = o.causal;

  if (on_device) {
    for (const auto& [obj, name] : {std::pair{&o.query_start_loc_cpu, "query_start_loc_cpu"},
                                    std::pair{&o.seq_lens_cpu, "seq_lens_cpu"}}) {
      if (obj->is_none()) {
        raise_value_error(
            str_cat(name,
                    ": required with cuda arrays (a host copy for the decode/prefill split and the "
                    "chunk plan; the binding makes no hidden device-to-host copy), got None"));
      }
    }
  }
  const Place host{Device::kCpu, 0};
  if (!o.query_start_loc_cpu.is_none()) {
    b.query_start_loc_cpu =
        import_on(o.query_start_loc_cpu, "query_start_loc_cpu", host, "(a host copy)");
    in.query_start_loc_host = int32_vector(b.query_start_loc_cpu, "query_start_loc_cpu");
    expect_host_copy_size(in.query_start_loc_host.size(), in.query_start_loc.size(),
                          "query_start_loc");
    b.host_framework = framework_of(o.query_start_loc_cpu);
  }
  if (!o.seq_lens_cpu.is_none()) {
    b.seq_lens_cpu = import_on(o.seq_lens_cpu, "seq_lens_cpu", host, "(a host copy)");
    in.seq_lens_host = int32_vector(b.seq_lens_cpu, "seq_lens_cpu");
    expect_host_copy_size(in.seq_lens_host.size(), in.seq_lens.size(), "seq_lens");
  }
  return b;
}

std::vector<ImageSpan> image_spans_from_python(nb::handle spans) {
  std::vector<ImageSpan> out;
  if (spans.is_none()) return out;
  if (!nb::isinstance<nb::dict>(spans)) {
    raise_value_error(
        str_cat("image_spans: expected None or a dict {request index: [(start, end), ...]}, got ",
                type_name_of(spans)));
  }
  for (auto [key, list] : nb::borrow<nb::dict>(spans)) {
    const int32_t request = int32_from_python(key, "image_spans key");
    const std::string field = str_cat("image_spans[", request, "]");
    if (!PyList_Check(list.ptr()) && !PyTuple_Check(list.ptr())) {
      raise_value_error(
          str_cat(field, ": expected a list of (start, end) pairs, got ", type_name_of(list)));
    }
    size_t i = 0;
    for (nb::handle pair : list) {
      const std::string item = str_cat(field, "[", i++, "]");
      if ((!PyList_Check(pair.ptr()) && !PyTuple_Check(pair.ptr())) || nb::len(pair) != 2) {
        raise_value_error(str_cat(item, ": expected a (start, end) pair, got ", describe(pair)));
      }
      out.push_back({request, int32_from_python(pair[0], item + " start"),
                     int32_from_python(pair[1], item + " end")});
    }
  }
  return out;
}

}  // namespace sparse_swa::python
