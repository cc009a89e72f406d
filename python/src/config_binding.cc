// SPDX-License-Identifier: Apache-2.0
#include "config_binding.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "python_values.h"
#include "status_exceptions.h"

namespace sparse_swa::python {

namespace {

constexpr std::string_view kFields[] = {"window_size",
                                        "block_size",
                                        "max_num_batched_tokens",
                                        "max_num_seqs",
                                        "max_model_len",
                                        "num_speculative_tokens",
                                        "speculative_method",
                                        "parallel_drafting",
                                        "model_runner_v2",
                                        "max_image_tokens",
                                        "widen_image_spans",
                                        "compress_ratios",
                                        "noncausal_index_width",
                                        "flashinfer_decode_lens"};

// `config: unknown field "windw_size" (did you mean "window_size"? expected one of ...)`, the
// batch-file reader's message for the same mistake.
[[noreturn]] void raise_unknown_field(const std::string& name) {
  std::string names;
  for (std::string_view f : kFields) names += str_cat(names.empty() ? "" : ", ", f);
  const std::string_view near = closest_name(name, kFields);
  const std::string hint = near.empty() ? "" : str_cat("did you mean \"", near, "\"? ");
  raise_value_error(
      str_cat("config: unknown field \"", name, "\" (", hint, "expected one of ", names, ")"));
}

SpeculativeMethod to_method(nb::handle value) {
  auto method = parse_speculative_method(string_from_python(value, "config.speculative_method"));
  throw_if_error(method.status());
  return method.value();
}

std::vector<int32_t> to_int32_list(nb::handle value, const std::string& field) {
  // A list, a tuple or a 1-D numpy integer array (np.array([1, 4]) from a loaded config).
  const bool numpy_vector = std::strcmp(Py_TYPE(value.ptr())->tp_name, "numpy.ndarray") == 0 &&
                            nb::len(nb::object(value.attr("shape"))) == 1;
  if (!PyList_Check(value.ptr()) && !PyTuple_Check(value.ptr()) && !numpy_vector) {
    raise_value_error(str_cat(field, ": expected a list of ints, got ", type_name_of(value)));
  }
  std::vector<int32_t> out;
  size_t i = 0;
  for (nb::handle item : value)
    out.push_back(int32_from_python(item, str_cat(field, "[", i++, "]")));
  return out;
}

void set_field(BuilderConfig& c, const std::string& name, nb::handle value) {
  const std::string field = "config." + name;
  if (name == "window_size") {
    c.window_size = int32_from_python(value, field);
  } else if (name == "block_size") {
    c.block_size = int32_from_python(value, field);
  } else if (name == "max_num_batched_tokens") {
    c.max_num_batched_tokens = int32_from_python(value, field);
  } else if (name == "max_num_seqs") {
    c.max_num_seqs = int32_from_python(value, field);
  } else if (name == "max_model_len") {
    c.max_model_len = int_from_python(value, field, INT64_MIN, INT64_MAX);
  } else if (name == "num_speculative_tokens") {
    c.num_speculative_tokens = int32_from_python(value, field);
  } else if (name == "speculative_method") {
    c.speculative_method = to_method(value);
  } else if (name == "parallel_drafting") {
    c.parallel_drafting = bool_from_python(value, field);
  } else if (name == "model_runner_v2") {
    c.model_runner_v2 = bool_from_python(value, field);
  } else if (name == "widen_image_spans") {
    c.widen_image_spans = bool_from_python(value, field);
  } else if (name == "flashinfer_decode_lens") {
    c.flashinfer_decode_lens = bool_from_python(value, field);
  } else if (name == "max_image_tokens") {
    c.max_image_tokens = int32_from_python(value, field);
  } else if (name == "compress_ratios") {
    c.compress_ratios = to_int32_list(value, field);
  } else if (name == "noncausal_index_width") {
    c.noncausal_index_width = int32_from_python(value, field);
  } else {
    raise_unknown_field(name);
  }
}

}  // namespace

BuilderConfig config_from_object(nb::handle obj) {
  if (nb::isinstance<BuilderConfig>(obj)) {
    if (!nb::inst_ready(obj)) {
      raise_value_error("config: expected an initialized BuilderConfig, got one made by __new__");
    }
    return nb::cast<BuilderConfig>(obj);
  }
  if (!nb::isinstance<nb::dict>(obj)) {
    raise_value_error(
        str_cat("config: expected a dict or sparse_swa.BuilderConfig, got ", type_name_of(obj)));
  }
  BuilderConfig config;
  for (auto [key, value] : nb::borrow<nb::dict>(obj)) {
    set_field(config, string_from_python(key, "config key"), value);
  }
  return config;
}

nb::dict config_to_dict(const BuilderConfig& c) {
  nb::dict d;
  d["window_size"] = c.window_size;
  d["block_size"] = c.block_size;
  d["max_num_batched_tokens"] = c.max_num_batched_tokens;
  d["max_num_seqs"] = c.max_num_seqs;
  d["max_model_len"] = c.max_model_len;
  d["num_speculative_tokens"] = c.num_speculative_tokens;
  d["speculative_method"] = speculative_method_name(c.speculative_method);
  d["parallel_drafting"] = c.parallel_drafting;
  d["max_image_tokens"] = c.max_image_tokens;
  d["compress_ratios"] = nb::cast(c.compress_ratios);
  d["noncausal_index_width"] = c.noncausal_index_width;
  d["model_runner_v2"] = c.model_runner_v2;
  d["widen_image_spans"] = c.widen_image_spans;
  d["flashinfer_decode_lens"] = c.flashinfer_decode_lens;
  return d;
}

// A read-write property whose setter takes any object and checks it like a dict entry, so a bad
// value is a ValueError naming config.NAME (never a TypeError with the signature).
template <typename Getter>
void def_field(nb::class_<BuilderConfig>& cls, const char* name, Getter getter, const char* doc) {
  cls.def_prop_rw(
      name, getter, [name](BuilderConfig& c, nb::handle value) { set_field(c, name, value); },
      nb::for_setter(nb::arg("value").none()), doc);
}

template <typename T>
void def_field(nb::class_<BuilderConfig>& cls, const char* name, T BuilderConfig::*member,
               const char* doc) {
  def_field(
      cls, name, [member](const BuilderConfig& c) { return c.*member; }, doc);
}

void bind_config(nb::module_& m) {
  nb::class_<BuilderConfig> cls(m, "BuilderConfig",
                                "Builder configuration, with the JSON config's field names.\n\n"
                                "Validated when a MetadataBuilder is made from it. Fields take\n"
                                "Python or numpy scalars; a value of another kind or range raises\n"
                                "ValueError naming the field.");
  cls.def(
         "__init__",
         [](BuilderConfig* self, nb::kwargs fields) {
           new (self) BuilderConfig();
           for (auto [key, value] : fields)
             set_field(*self, string_from_python(key, "field"), value);
         },
         "BuilderConfig(**fields): the fields by keyword (the JSON config's names), e.g.\n"
         "BuilderConfig(window_size=128, block_size=64, ...); unset fields keep their defaults.")
      .def_static(
          "from_dict",
          [](nb::handle d) {
            if (!nb::isinstance<nb::dict>(d)) {
              raise_value_error(str_cat("config: expected a dict, got ", describe(d)));
            }
            return config_from_object(d);
          },
          nb::arg("config").none(),
          "A BuilderConfig from a dict with the JSON config's field names.")
      .def("to_dict", &config_to_dict, "The config as a dict with the JSON config's field names.")
      .def("__repr__", [](const BuilderConfig& c) {
        return str_cat("BuilderConfig(", message_text(nb::repr(config_to_dict(c))), ")");
      });
  def_field(cls, "window_size", &BuilderConfig::window_size, "W >= 1, the logical sliding window.");
  def_field(cls, "block_size", &BuilderConfig::block_size, "B >= 1, tokens per SWA KV page.");
  def_field(cls, "max_num_batched_tokens", &BuilderConfig::max_num_batched_tokens,
            "Row capacity of every per-token buffer.");
  def_field(cls, "max_num_seqs", &BuilderConfig::max_num_seqs, "Request capacity.");
  def_field(cls, "max_model_len", &BuilderConfig::max_model_len, "Longest sequence, >= 1.");
  def_field(cls, "num_speculative_tokens", &BuilderConfig::num_speculative_tokens, "k >= 0.");
  def_field(
      cls, "speculative_method",
      [](const BuilderConfig& c) {
        return std::string(speculative_method_name(c.speculative_method));
      },
      "\"none\", \"mtp\" or \"dspark\".");
  def_field(cls, "parallel_drafting", &BuilderConfig::parallel_drafting,
            "theta = 1 + 2k instead of 1 + k (model runner V1); needs a speculative method.");
  def_field(cls, "model_runner_v2", &BuilderConfig::model_runner_v2,
            "The engine runs model runner V2: theta = 1 + k even with parallel_drafting.");
  def_field(cls, "max_image_tokens", &BuilderConfig::max_image_tokens,
            "Mi >= 0, the longest image span; widening vision checkpoints have prefill rows\n"
            "of W + Mi.");
  def_field(cls, "widen_image_spans", &BuilderConfig::widen_image_spans,
            "True (DeepSeek-V4 vision): image spans widen prefill windows. False\n"
            "(DeepSeek-V4.1 vision): plain causal windows of width W; image spans are ignored.");
  def_field(cls, "compress_ratios", &BuilderConfig::compress_ratios,
            "Each in {1, 2, 4, 128}; empty means [1].");
  def_field(cls, "noncausal_index_width", &BuilderConfig::noncausal_index_width,
            "DSpark non-causal row width; 0 derives it. Set it from a consumer's dispatch\n"
            "policy with sparse_swa.dispatch.choose_noncausal_width; must be >= W + theta.");
  def_field(cls, "flashinfer_decode_lens", &BuilderConfig::flashinfer_decode_lens,
            "Write flashinfer_decode_topk_lens / flashinfer_decode_seq_lens on non-causal\n"
            "(DSpark) steps, the FlashInfer DSpark decode's per-token lens.");
}

}  // namespace sparse_swa::python
