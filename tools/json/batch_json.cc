// SPDX-License-Identifier: Apache-2.0
#include "json/batch_json.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iostream>
#include <iterator>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>

#include "sparse_swa/metadata_fields.h"

namespace sparse_swa {

namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr size_t kMaxShownChars = 40;

// A JSON string, escaped to ASCII; invalid UTF-8 is replaced rather than thrown on.
template <typename J>
std::string quoted(const J& s) {
  return s.dump(-1, ' ', /*ensure_ascii=*/true, J::error_handler_t::replace);
}

// The actual value for a message: scalars as JSON text, containers by kind and size (never
// dumped whole: they may be huge or deeply nested).
std::string describe(const Json& v) {
  switch (v.type()) {
    case Json::value_t::array:
      return v.empty() ? "[]" : str_cat("an array of ", v.size(), " elements");
    case Json::value_t::object:
      return v.empty() ? "{}" : str_cat("an object with ", v.size(), " keys");
    case Json::value_t::string: {
      std::string s = quoted(v);
      if (s.size() > kMaxShownChars) s = s.substr(0, kMaxShownChars) + "...\" (truncated)";
      return s;
    }
    default:
      return v.dump();
  }
}

std::string range_text(int64_t lo, int64_t hi) {
  if (lo == kInt32Min && hi == kInt32Max) return "an int32 integer";
  if (lo == kInt64Min && hi == kInt64Max) return "an int64 integer";
  return str_cat("an integer in [", lo, ", ", hi, "]");
}

Status read_int(const Json& v, const std::string& path, int64_t lo, int64_t hi, int64_t* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) {
      return invalid_argument(path, ": expected ", range_text(lo, hi), ", got ", u);
    }
    *out = static_cast<int64_t>(u);
    return Status::Ok();
  }
  if (v.is_number_integer()) {
    const int64_t s = v.get<int64_t>();
    if (s < lo || s > hi) {
      return invalid_argument(path, ": expected ", range_text(lo, hi), ", got ", s);
    }
    *out = s;
    return Status::Ok();
  }
  return invalid_argument(path, ": expected an integer, got ", describe(v));
}

template <typename T>
Status read_int(const Json& v, const std::string& path, T* out) {
  int64_t value = 0;
  SPARSE_SWA_RETURN_IF_ERROR(
      read_int(v, path, std::numeric_limits<T>::min(), std::numeric_limits<T>::max(), &value));
  *out = static_cast<T>(value);
  return Status::Ok();
}

Status read_bool(const Json& v, const std::string& path, bool* out) {
  if (!v.is_boolean()) return invalid_argument(path, ": expected true or false, got ", describe(v));
  *out = v.get<bool>();
  return Status::Ok();
}

Status expect_array(const Json& v, const std::string& path) {
  if (!v.is_array()) return invalid_argument(path, ": expected an array, got ", describe(v));
  return Status::Ok();
}

Status expect_object(const Json& v, const std::string& path) {
  if (!v.is_object()) return invalid_argument(path, ": expected an object, got ", describe(v));
  return Status::Ok();
}

template <typename T>
Status read_int_array(const Json& v, const std::string& path, std::vector<T>* out) {
  SPARSE_SWA_RETURN_IF_ERROR(expect_array(v, path));
  out->resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    SPARSE_SWA_RETURN_IF_ERROR(read_int(v[i], str_cat(path, "[", i, "]"), &(*out)[i]));
  }
  return Status::Ok();
}

// Object members: `parent` is a checked object, `path` its dotted path ("config").
const Json* find(const Json& parent, const char* key) {
  const auto it = parent.find(key);
  return it == parent.end() ? nullptr : &*it;
}

Status require(const Json& parent, const std::string& path, const char* key, const char* what,
               const Json** out) {
  *out = find(parent, key);
  if (*out == nullptr) {
    return invalid_argument(path, ".", key, ": expected ", what,
                            ", got nothing (the field is required)");
  }
  return Status::Ok();
}

template <typename T>
Status required_int(const Json& parent, const std::string& path, const char* key, T* out) {
  const Json* v = nullptr;
  SPARSE_SWA_RETURN_IF_ERROR(require(parent, path, key, "an integer", &v));
  return read_int(*v, str_cat(path, ".", key), out);
}

template <typename T>
Status optional_int(const Json& parent, const std::string& path, const char* key, T* out) {
  const Json* v = find(parent, key);
  return v == nullptr ? Status::Ok() : read_int(*v, str_cat(path, ".", key), out);
}

Status optional_bool(const Json& parent, const std::string& path, const char* key, bool* out) {
  const Json* v = find(parent, key);
  return v == nullptr ? Status::Ok() : read_bool(*v, str_cat(path, ".", key), out);
}

// Every key of the object `v` at `path` is one of `known`: a misspelt optional field would
// otherwise be ignored without a word. Names the nearest known key when one is close.
Status check_known_keys(const Json& v, const char* path,
                        std::initializer_list<std::string_view> known) {
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string& key = it.key();
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    std::string names;
    for (std::string_view name : known) names += str_cat(names.empty() ? "" : ", ", name);
    const std::string_view near =
        closest_name(key, std::span<const std::string_view>(known.begin(), known.size()));
    const std::string hint = near.empty() ? "" : str_cat("did you mean \"", near, "\"? ");
    return invalid_argument(path, ": unknown field ", describe(Json(key)), " (", hint,
                            "expected one of ", names, ")");
  }
  return Status::Ok();
}

Status parse_config(const Json& c, BuilderConfig* config) {
  SPARSE_SWA_RETURN_IF_ERROR(expect_object(c, "config"));
  SPARSE_SWA_RETURN_IF_ERROR(check_known_keys(
      c, "config",
      {"window_size", "block_size", "max_num_batched_tokens", "max_num_seqs", "max_model_len",
       "num_speculative_tokens", "speculative_method", "parallel_drafting", "model_runner_v2",
       "max_image_tokens", "widen_image_spans", "noncausal_index_width", "flashinfer_decode_lens",
       "compress_ratios"}));
  SPARSE_SWA_RETURN_IF_ERROR(required_int(c, "config", "window_size", &config->window_size));
  SPARSE_SWA_RETURN_IF_ERROR(required_int(c, "config", "block_size", &config->block_size));
  SPARSE_SWA_RETURN_IF_ERROR(
      required_int(c, "config", "max_num_batched_tokens", &config->max_num_batched_tokens));
  SPARSE_SWA_RETURN_IF_ERROR(required_int(c, "config", "max_num_seqs", &config->max_num_seqs));
  int32_t max_model_len = 0;
  SPARSE_SWA_RETURN_IF_ERROR(required_int(c, "config", "max_model_len", &max_model_len));
  config->max_model_len = max_model_len;

  SPARSE_SWA_RETURN_IF_ERROR(
      optional_int(c, "config", "num_speculative_tokens", &config->num_speculative_tokens));
  if (const Json* m = find(c, "speculative_method")) {
    if (!m->is_string()) {
      return invalid_argument(
          "config.speculative_method: expected one of \"none\", \"mtp\", \"dspark\", got ",
          describe(*m));
    }
    auto method = parse_speculative_method(m->get_ref<const std::string&>());
    SPARSE_SWA_RETURN_IF_ERROR(method.status());
    config->speculative_method = method.value();
  }
  if (const Json* p = find(c, "parallel_drafting")) {
    SPARSE_SWA_RETURN_IF_ERROR(
        read_bool(*p, "config.parallel_drafting", &config->parallel_drafting));
  }
  SPARSE_SWA_RETURN_IF_ERROR(
      optional_bool(c, "config", "model_runner_v2", &config->model_runner_v2));
  SPARSE_SWA_RETURN_IF_ERROR(
      optional_int(c, "config", "max_image_tokens", &config->max_image_tokens));
  SPARSE_SWA_RETURN_IF_ERROR(
      optional_bool(c, "config", "widen_image_spans", &config->widen_image_spans));
  SPARSE_SWA_RETURN_IF_ERROR(
      optional_int(c, "config", "noncausal_index_width", &config->noncausal_index_width));
  SPARSE_SWA_RETURN_IF_ERROR(
      optional_bool(c, "config", "flashinfer_decode_lens", &config->flashinfer_decode_lens));
  config->compress_ratios = {1};
  if (const Json* r = find(c, "compress_ratios")) {
    SPARSE_SWA_RETURN_IF_ERROR(
        read_int_array(*r, "config.compress_ratios", &config->compress_ratios));
  }
  return Status::Ok();
}

// [rows][cols] -> flat row-major storage; ragged rows are an error (the reference's
// torch.tensor(block_table) cannot build them either).
Status parse_block_table(const Json& v, BatchFile* file) {
  SPARSE_SWA_RETURN_IF_ERROR(expect_array(v, "batch.block_table"));
  file->block_table_rows = static_cast<int64_t>(v.size());
  file->block_table_cols = 0;
  file->block_table.clear();
  for (size_t r = 0; r < v.size(); ++r) {
    const std::string row_path = str_cat("batch.block_table[", r, "]");
    if (!v[r].is_array()) {
      return invalid_argument(row_path, ": expected a row (an array of block ids), got ",
                              describe(v[r]));
    }
    if (r == 0) {
      file->block_table_cols = static_cast<int64_t>(v[r].size());
      file->block_table.reserve(v.size() * v[r].size());
    } else if (static_cast<int64_t>(v[r].size()) != file->block_table_cols) {
      return invalid_argument(row_path, ": expected ", file->block_table_cols,
                              " entries like batch.block_table[0] (rows must not be ragged), got ",
                              v[r].size());
    }
    for (size_t j = 0; j < v[r].size(); ++j) {
      int32_t id = 0;
      SPARSE_SWA_RETURN_IF_ERROR(read_int(v[r][j], str_cat(row_path, "[", j, "]"), &id));
      file->block_table.push_back(id);
    }
  }
  return Status::Ok();
}

// A request index key: optional '-' then decimal digits, as Python's int() reads the reference's
// keys (range checks are left to the caller).
bool parse_request_key(const std::string& key, int64_t* out) {
  const char* first = key.data();
  const char* last = key.data() + key.size();
  if (first == last) return false;
  const char* digits = *first == '-' ? first + 1 : first;
  if (digits == last || !std::all_of(digits, last, [](char ch) { return ch >= '0' && ch <= '9'; }))
    return false;
  const auto [end, ec] = std::from_chars(first, last, *out);
  return ec == std::errc() && end == last;
}

// {"<request>": [[start, end], ...]} -> spans sorted by request (then file order).
Status parse_image_spans(const Json& v, int64_t num_reqs, std::vector<ImageSpan>* spans) {
  SPARSE_SWA_RETURN_IF_ERROR(expect_object(v, "batch.image_spans"));
  std::vector<std::pair<int64_t, std::string>> keys;  // (request, key)
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string path = str_cat("batch.image_spans[", quoted(Json(it.key())), "]");
    int64_t request = 0;
    if (!parse_request_key(it.key(), &request)) {
      return invalid_argument(path, ": expected a request index (a decimal integer key), got ",
                              quoted(Json(it.key())));
    }
    if (request < 0 || request >= num_reqs) {
      return invalid_argument(path, ": expected a request index in [0, ", num_reqs,
                              ") (len(batch.seq_lens) = ", num_reqs, "), got ", request);
    }
    for (const auto& [other, other_key] : keys) {
      if (other == request) {
        return invalid_argument(path, ": request ", request, " already has spans under key ",
                                quoted(Json(other_key)));
      }
    }
    keys.emplace_back(request, it.key());
  }
  std::sort(keys.begin(), keys.end());
  spans->clear();
  for (const auto& [request, key] : keys) {
    const std::string path = str_cat("batch.image_spans[", quoted(Json(key)), "]");
    const Json& list = v[key];
    if (!list.is_array()) {
      return invalid_argument(path, ": expected a list of [start, end] spans, got ",
                              describe(list));
    }
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string span_path = str_cat(path, "[", i, "]");
      if (!list[i].is_array() || list[i].size() != 2) {
        return invalid_argument(span_path, ": expected [start, end], got ", describe(list[i]));
      }
      ImageSpan span;
      span.request = static_cast<int32_t>(request);
      SPARSE_SWA_RETURN_IF_ERROR(read_int(list[i][0], span_path + "[0]", &span.start));
      SPARSE_SWA_RETURN_IF_ERROR(read_int(list[i][1], span_path + "[1]", &span.end));
      spans->push_back(span);
    }
  }
  return Status::Ok();
}

Status parse_batch(const Json& b, BatchFile* file) {
  SPARSE_SWA_RETURN_IF_ERROR(expect_object(b, "batch"));
  SPARSE_SWA_RETURN_IF_ERROR(
      check_known_keys(b, "batch",
                       {"query_start_loc", "seq_lens", "block_table", "slot_mapping", "causal",
                        "image_spans", "replay_start"}));
  const Json* v = nullptr;
  SPARSE_SWA_RETURN_IF_ERROR(require(b, "batch", "query_start_loc", "an array of integers", &v));
  SPARSE_SWA_RETURN_IF_ERROR(read_int_array(*v, "batch.query_start_loc", &file->query_start_loc));
  SPARSE_SWA_RETURN_IF_ERROR(require(b, "batch", "seq_lens", "an array of integers", &v));
  SPARSE_SWA_RETURN_IF_ERROR(read_int_array(*v, "batch.seq_lens", &file->seq_lens));
  SPARSE_SWA_RETURN_IF_ERROR(require(b, "batch", "block_table", "an array of rows", &v));
  SPARSE_SWA_RETURN_IF_ERROR(parse_block_table(*v, file));
  SPARSE_SWA_RETURN_IF_ERROR(require(b, "batch", "slot_mapping", "an array of integers", &v));
  SPARSE_SWA_RETURN_IF_ERROR(read_int_array(*v, "batch.slot_mapping", &file->slot_mapping));
  SPARSE_SWA_RETURN_IF_ERROR(require(b, "batch", "causal", "true or false", &v));
  SPARSE_SWA_RETURN_IF_ERROR(read_bool(*v, "batch.causal", &file->causal));
  file->image_spans.clear();
  if (const Json* s = find(b, "image_spans")) {
    SPARSE_SWA_RETURN_IF_ERROR(
        parse_image_spans(*s, static_cast<int64_t>(file->seq_lens.size()), &file->image_spans));
  }
  file->replay_start.clear();
  if (const Json* r = find(b, "replay_start")) {
    SPARSE_SWA_RETURN_IF_ERROR(read_int_array(*r, "batch.replay_start", &file->replay_start));
  }
  return Status::Ok();
}

Status parse_chunk_plan_requests(const Json& v, std::vector<ChunkPlanRequest>* out) {
  SPARSE_SWA_RETURN_IF_ERROR(expect_array(v, "chunk_plan_requests"));
  out->clear();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string path = str_cat("chunk_plan_requests[", i, "]");
    SPARSE_SWA_RETURN_IF_ERROR(expect_object(v[i], path));
    SPARSE_SWA_RETURN_IF_ERROR(
        check_known_keys(v[i], path.c_str(), {"compress_ratio", "chunk_size", "has_compressed"}));
    ChunkPlanRequest req;
    SPARSE_SWA_RETURN_IF_ERROR(required_int(v[i], path, "compress_ratio", &req.compress_ratio));
    SPARSE_SWA_RETURN_IF_ERROR(required_int(v[i], path, "chunk_size", &req.chunk_size));
    if (const Json* h = find(v[i], "has_compressed")) {
      bool has = false;
      SPARSE_SWA_RETURN_IF_ERROR(read_bool(*h, path + ".has_compressed", &has));
      req.has_compressed = has;
    }
    out->push_back(req);
  }
  return Status::Ok();
}

Status check_file_size(uint64_t bytes, std::string_view source) {
  if (bytes > kMaxBatchFileBytes) {
    return invalid_argument(source, ": ", bytes, " bytes, more than the batch file limit of ",
                            kMaxBatchFileBytes, " bytes (256 MiB)");
  }
  return Status::Ok();
}

// The nesting depth of arrays and objects, outside strings, without parsing: a document nested
// deeper than kMaxJsonDepth is an error before nlohmann allocates a value per level.
Status check_json_depth(std::string_view text, std::string_view source) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (ch == '\\') {
        escaped = true;
      } else if (ch == '"') {
        in_string = false;
      }
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      if (++depth > kMaxJsonDepth) {
        return invalid_argument(source, ": JSON nested deeper than ", kMaxJsonDepth,
                                " levels (at byte ", i, ")");
      }
    } else if (ch == ']' || ch == '}') {
      --depth;  // unbalanced brackets are the parser's to report
    }
  }
  return Status::Ok();
}

}  // namespace

StatusOr<nlohmann::json> parse_json_text(std::string_view text, std::string_view source) {
  SPARSE_SWA_RETURN_IF_ERROR(check_file_size(text.size(), source));
  SPARSE_SWA_RETURN_IF_ERROR(check_json_depth(text, source));
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {  // parse errors, and numbers past the double range
    return with_printable_message(invalid_argument(source, ": malformed JSON: ", e.what()));
  }
}

namespace {

StatusOr<BatchFile> parse_named_raw(std::string_view text, std::string_view source) {
  auto parsed = parse_json_text(text, source);
  SPARSE_SWA_RETURN_IF_ERROR(parsed.status());
  const Json doc = std::move(parsed).value();
  if (!doc.is_object()) {
    return invalid_argument(source, ": expected a JSON object with \"config\" and \"batch\", got ",
                            describe(doc));
  }
  BatchFile file;
  for (const char* key : {"config", "batch"}) {
    if (find(doc, key) == nullptr) {
      return invalid_argument(key, ": expected an object, got nothing (the field is required)");
    }
  }
  SPARSE_SWA_RETURN_IF_ERROR(parse_config(doc["config"], &file.config));
  SPARSE_SWA_RETURN_IF_ERROR(parse_batch(doc["batch"], &file));
  if (const Json* r = find(doc, "chunk_plan_requests")) {
    SPARSE_SWA_RETURN_IF_ERROR(parse_chunk_plan_requests(*r, &file.chunk_plan_requests));
  }
  return file;
}

// Messages quote user text (keys, strings, the parser's excerpt): keep them printable and short,
// yet long enough for an unknown key's list of the known ones.
constexpr size_t kMaxMessageBytes = 512;

StatusOr<BatchFile> parse_named(std::string_view text, std::string_view source) {
  auto file = parse_named_raw(text, source);
  if (!file.ok()) {
    return Status(file.status().code(),
                  printable_excerpt(file.status().message(), kMaxMessageBytes));
  }
  return file;
}

template <typename T>
OrderedJson int_list(std::span<const T> values) {
  OrderedJson out = OrderedJson::array();
  for (T v : values) out.push_back(v);
  return out;
}

OrderedJson index_rows(const ConstIndexView& view) {
  OrderedJson out = OrderedJson::array();
  for (int64_t i = 0; i < view.rows; ++i) {
    out.push_back(int_list(std::span<const int32_t>(view.row(i), view.width)));
  }
  return out;
}

OrderedJson index_lens(const ConstIndexView& view) {
  return int_list(std::span<const int32_t>(view.lens, static_cast<size_t>(view.rows)));
}

void dump_to(const OrderedJson& v, std::string* out) {
  switch (v.type()) {
    case OrderedJson::value_t::array: {
      out->push_back('[');
      bool first = true;
      for (const auto& e : v) {
        if (!first) out->append(", ");
        first = false;
        dump_to(e, out);
      }
      out->push_back(']');
      return;
    }
    case OrderedJson::value_t::object: {
      out->push_back('{');
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out->append(", ");
        first = false;
        out->append(quoted(OrderedJson(it.key())));
        out->append(": ");
        dump_to(it.value(), out);
      }
      out->push_back('}');
      return;
    }
    case OrderedJson::value_t::string:
      out->append(quoted(v));
      return;
    default:
      out->append(v.dump());
      return;
  }
}

}  // namespace

BatchInput BatchFile::batch_input() const {
  static constexpr int32_t kNoBlocks[1] = {0};  // a non-null row pointer for 0-column tables
  BatchInput b;
  b.query_start_loc = query_start_loc;
  b.seq_lens = seq_lens;
  b.block_table = MatrixView<const int32_t>{block_table.empty() ? kNoBlocks : block_table.data(),
                                            block_table_rows, block_table_cols, block_table_cols,
                                            MemorySpace::kHost};
  b.slot_mapping = slot_mapping;
  b.causal = causal;
  b.image_spans = image_spans;
  b.replay_start = replay_start;
  return b;
}

StatusOr<BatchFile> parse_batch_file(std::string_view json_text) {
  return parse_named(json_text, "batch file");
}

BatchFile batch_file_of(const BuilderConfig& config, const BatchInput& b) {
  BatchFile f;
  f.config = config;
  f.query_start_loc.assign(b.query_start_loc.begin(), b.query_start_loc.end());
  f.seq_lens.assign(b.seq_lens.begin(), b.seq_lens.end());
  f.block_table_rows = b.block_table.rows;
  f.block_table_cols = b.block_table.cols;
  for (int64_t r = 0; r < b.block_table.rows; ++r) {
    f.block_table.insert(f.block_table.end(), b.block_table.row(r),
                         b.block_table.row(r) + b.block_table.cols);
  }
  f.slot_mapping.assign(b.slot_mapping.begin(), b.slot_mapping.end());
  f.causal = b.causal;
  f.image_spans.assign(b.image_spans.begin(), b.image_spans.end());
  f.replay_start.assign(b.replay_start.begin(), b.replay_start.end());
  std::stable_sort(f.image_spans.begin(), f.image_spans.end(),
                   [](const ImageSpan& x, const ImageSpan& y) { return x.request < y.request; });
  return f;
}

OrderedJson batch_file_to_json(const BatchFile& f) {
  const BuilderConfig& c = f.config;
  OrderedJson config = OrderedJson::object();
  config["window_size"] = c.window_size;
  config["block_size"] = c.block_size;
  config["max_num_batched_tokens"] = c.max_num_batched_tokens;
  config["max_num_seqs"] = c.max_num_seqs;
  config["max_model_len"] = c.max_model_len;
  config["num_speculative_tokens"] = c.num_speculative_tokens;
  config["speculative_method"] = speculative_method_name(c.speculative_method);
  config["parallel_drafting"] = c.parallel_drafting;
  config["max_image_tokens"] = c.max_image_tokens;
  config["compress_ratios"] = c.compress_ratios;
  // Fields the seed's reference has not: written only when they differ from the default.
  if (c.noncausal_index_width != 0) config["noncausal_index_width"] = c.noncausal_index_width;
  if (c.model_runner_v2) config["model_runner_v2"] = true;
  if (!c.widen_image_spans) config["widen_image_spans"] = false;
  if (c.flashinfer_decode_lens) config["flashinfer_decode_lens"] = true;
  OrderedJson batch = OrderedJson::object();
  batch["query_start_loc"] = f.query_start_loc;
  batch["seq_lens"] = f.seq_lens;
  OrderedJson table = OrderedJson::array();
  for (int64_t r = 0; r < f.block_table_rows; ++r) {
    const auto row = f.block_table.begin() + r * f.block_table_cols;
    table.push_back(std::vector<int32_t>(row, row + f.block_table_cols));
  }
  batch["block_table"] = std::move(table);
  batch["slot_mapping"] = f.slot_mapping;
  batch["causal"] = f.causal;
  if (!f.image_spans.empty()) {
    OrderedJson spans = OrderedJson::object();
    for (const ImageSpan& s : f.image_spans) {
      spans[std::to_string(s.request)].push_back({s.start, s.end});
    }
    batch["image_spans"] = std::move(spans);
  }
  if (!f.replay_start.empty()) batch["replay_start"] = f.replay_start;
  OrderedJson requests = OrderedJson::array();
  for (const ChunkPlanRequest& r : f.chunk_plan_requests) {
    OrderedJson item = OrderedJson::object();
    item["compress_ratio"] = r.compress_ratio;
    item["chunk_size"] = r.chunk_size;
    if (r.has_compressed) item["has_compressed"] = *r.has_compressed;
    requests.push_back(std::move(item));
  }
  OrderedJson out = OrderedJson::object();
  out["config"] = std::move(config);
  out["batch"] = std::move(batch);
  out["chunk_plan_requests"] = std::move(requests);
  return out;
}

StatusOr<std::string> read_json_text(const std::string& path) {
  // In 1 MiB pieces, at most the limit plus one byte: a longer stream is seen to be too long.
  auto read_capped = [](std::istream& in, std::string* text) {
    std::vector<char> piece(size_t{1} << 20);
    while (in && text->size() <= kMaxBatchFileBytes) {
      in.read(piece.data(), static_cast<std::streamsize>(
                                std::min(piece.size(), kMaxBatchFileBytes + 1 - text->size())));
      text->append(piece.data(), static_cast<size_t>(in.gcount()));
    }
  };
  std::string text;
  if (path == "-") {
    read_capped(std::cin, &text);
    if (std::cin.bad()) return invalid_argument(path, ": cannot read the batch file from stdin");
  } else {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
      return invalid_argument(path, ": cannot read the batch file (it is a directory)");
    }
    if (std::filesystem::is_regular_file(path, ec)) {
      const uintmax_t size = std::filesystem::file_size(path, ec);
      if (!ec) {
        SPARSE_SWA_RETURN_IF_ERROR(check_file_size(size, path));
        text.reserve(static_cast<size_t>(size));
      }
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return invalid_argument(path, ": cannot read the batch file (", std::strerror(errno), ")");
    }
    read_capped(in, &text);
    if (in.bad()) return invalid_argument(path, ": cannot read the batch file (read error)");
  }
  if (text.size() > kMaxBatchFileBytes) {  // a stream, or a file that grew
    return invalid_argument(path == "-" ? "<stdin>" : path, ": more than the batch file limit of ",
                            kMaxBatchFileBytes, " bytes (256 MiB)");
  }
  return text;
}

StatusOr<BatchFile> read_batch_file(const std::string& path) {
  auto text = read_json_text(path);
  SPARSE_SWA_RETURN_IF_ERROR(text.status());
  return parse_named(text.value(), path == "-" ? "<stdin>" : path);
}

StatusOr<std::vector<ChunkPlanResult>> run_chunk_plans(
    const SwaMetadata& md, const std::vector<ChunkPlanRequest>& requests) {
  std::vector<ChunkPlanResult> results;
  results.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const ChunkPlanRequest& req = requests[i];
    const std::string path = str_cat("chunk_plan_requests[", i, "]");
    SPARSE_SWA_RETURN_IF_ERROR(
        layer_type_for_ratio(req.compress_ratio, path + ".compress_ratio").status());
    if (req.chunk_size < 1) {
      return invalid_argument(path, ".chunk_size: expected >= 1, got ", req.chunk_size);
    }
    auto plan = prefill_chunk_plan(md, req.compress_ratio, req.chunk_size, req.has_compressed);
    SPARSE_SWA_RETURN_IF_ERROR(plan.status());
    results.push_back({req, std::move(plan).value()});
  }
  return results;
}

StatusOr<OrderedJson> metadata_to_json(const SwaMetadata& md,
                                       const std::vector<ChunkPlanResult>& plans) {
  if (md.space != MemorySpace::kHost) {
    return invalid_argument(
        "metadata: expected host memory (space kHost), got device views; copy the metadata to "
        "the host before writing JSON");
  }
  const int32_t td = md.num_decode_tokens, tp = md.num_prefill_tokens, t = md.num_tokens;
  if (td < 0 || tp < 0 || td + tp != t || md.decode_swa.rows != td ||
      md.token_to_req_indices.size() != static_cast<size_t>(t) ||
      md.is_valid_token.size() != static_cast<size_t>(t)) {
    return internal_error("metadata: inconsistent shapes (", t, " tokens, ", td, " decode, ", tp,
                          " prefill, ", md.decode_swa.rows, " decode rows)");
  }
  SPARSE_SWA_RETURN_IF_ERROR(check_index_view(md.decode_swa, "metadata.decode_swa"));
  if (md.has_prefill()) {
    SPARSE_SWA_RETURN_IF_ERROR(check_index_view(md.prefill_swa, "metadata.prefill_swa"));
    if (md.prefill_swa.rows != tp) {
      return internal_error("metadata.prefill_swa: expected ", tp, " rows, got ",
                            md.prefill_swa.rows);
    }
  }
  if (md.has_image() && (md.left_visible.size() < static_cast<size_t>(t) ||
                         md.right_visible.size() < md.left_visible.size())) {
    return internal_error("metadata.left_visible: expected ", t, " entries, got ",
                          md.left_visible.size());
  }

  // The contract's fields, in the field list's order (metadata_fields.h); absent arrays as null.
  OrderedJson out = OrderedJson::object();
  for_each_metadata_field(md, [&](const MetadataField& field, const auto& value) {
    using T = std::remove_cvref_t<decltype(value)>;
    if (!field.in_contract || !field_present(md, field.contract_key)) return;
    const bool present = field_present(md, field.presence);
    const std::string key = field.reference;
    if constexpr (std::is_same_v<T, ConstIndexView>) {
      out[key + "_indices"] = present ? index_rows(value) : OrderedJson(nullptr);
      out[key + "_lens"] = present ? index_lens(value) : OrderedJson(nullptr);
    } else if constexpr (std::is_same_v<T, std::span<const int32_t>>) {
      if (!present) {
        out[key] = nullptr;
      } else {
        out[key] = int_list(field.contract_prefill_part ? value.subspan(td, tp) : value);
      }
    } else if constexpr (std::is_same_v<T, std::span<const uint8_t>>) {
      OrderedJson flags = OrderedJson::array();
      for (uint8_t v : value) flags.push_back(v != 0);
      out[key] = std::move(flags);
    } else if constexpr (std::is_same_v<T, LayerTypeSet>) {
      out[key] = value.sorted_names();
    } else {
      out[key] = value;
    }
  });
  OrderedJson plan_list = OrderedJson::array();
  for (const ChunkPlanResult& p : plans) {
    OrderedJson item = OrderedJson::object();
    item["compress_ratio"] = p.request.compress_ratio;
    item["chunk_size"] = p.request.chunk_size;
    if (p.request.has_compressed) item["has_compressed"] = *p.request.has_compressed;
    OrderedJson entries = OrderedJson::array();
    for (const ChunkPlanEntry& e : p.plan) {
      entries.push_back({e.start, e.end, e.compressed_width, e.total_width});
    }
    item["plan"] = std::move(entries);
    plan_list.push_back(std::move(item));
  }
  out["prefill_chunk_plans"] = std::move(plan_list);
  return out;
}

std::string dump_python_style(const OrderedJson& value) {
  std::string out;
  dump_to(value, &out);
  return out;
}

}  // namespace sparse_swa
