// SPDX-License-Identifier: Apache-2.0
#include "metadata_table.h"

#include <iomanip>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "sparse_swa/metadata_fields.h"

namespace sparse_swa::cli {

namespace {

// "31 12..15 36..38": runs of three or more consecutive ids collapsed.
std::string compact_row(std::span<const int32_t> row) {
  std::ostringstream os;
  size_t i = 0;
  while (i < row.size()) {
    size_t j = i;
    while (j + 1 < row.size() && row[j] >= 0 && row[j + 1] == row[j] + 1) ++j;
    if (i > 0) os << ' ';
    if (j - i >= 2) {
      os << row[i] << ".." << row[j];
      i = j + 1;
    } else {
      os << row[i];
      ++i;
    }
  }
  return os.str();
}

// "1 request", "3 requests".
std::string count(int64_t n, const char* noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

std::string join_ints(std::span<const int32_t> values) {
  std::ostringstream os;
  for (size_t i = 0; i < values.size(); ++i) os << (i ? ", " : "") << values[i];
  return os.str();
}

std::string spans_of(const BatchFile& file, int32_t request) {
  std::ostringstream os;
  for (const ImageSpan& s : file.image_spans) {
    if (s.request == request)
      os << (os.tellp() > 0 ? " " : "") << '[' << s.start << ',' << s.end << ']';
  }
  return os.str();
}

void print_config(std::ostream& os, const BuilderConfig& c, const DerivedConfig& d) {
  os << "config  W=" << c.window_size << " B=" << c.block_size << " k=" << c.num_speculative_tokens
     << " (" << speculative_method_name(c.speculative_method)
     << (c.parallel_drafting ? ", parallel drafting" : "")
     << (c.model_runner_v2 ? ", model runner V2" : "") << ") theta=" << d.decode_threshold
     << " Mi=" << c.max_image_tokens << (c.widen_image_spans ? "" : " (not widening)")
     << " compress_ratios=[" << join_ints(c.compress_ratios) << "]\n";
  os << "widths  causal decode rows " << c.window_size << " (W), prefill rows "
     << d.prefill_index_width << (d.widens_images ? " (W + Mi)" : " (W)");
  if (d.is_dspark) os << ", non-causal draft rows " << d.noncausal_index_width;
  os << "\n";
}

void print_split(std::ostream& os, const BatchFile& file, const SwaMetadata& md) {
  const int32_t real = file.query_start_loc.empty() ? 0 : file.query_start_loc.back();
  os << "step    " << count(md.num_reqs, "request") << ", " << count(md.num_tokens, "token") << " ("
     << real << " scheduled, " << md.num_tokens - real << " CUDA-graph padding), "
     << (md.causal ? "causal" : "non-causal (DSpark draft)") << "\n";
  os << "split   decodes: " << count(md.num_decodes, "request") << " / "
     << count(md.num_decode_tokens, "token") << " | prefills: " << count(md.num_prefills, "request")
     << " / " << count(md.num_prefill_tokens, "token") << " | max_decode_query_len "
     << md.max_decode_query_len << " | decode_swa_width " << md.decode_swa_width() << "\n";
  const auto names = md.tile_schedulers.sorted_names();
  os << "tile schedulers  ";
  if (names.empty()) os << "(none: no decode tokens)";
  for (size_t i = 0; i < names.size(); ++i) os << (i ? " " : "") << names[i];
  os << "\n";
}

// The table's columns for per-request or per-token arrays of the field list: fields that share
// a column are joined by '/', in list order.
struct Column {
  std::string label;
  std::vector<std::span<const int32_t>> arrays;
  bool prefill_part = false;  // only the prefill tokens' entries (the rest print empty)
  bool present = true;
};

std::vector<Column> columns(const SwaMetadata& md, FieldRows rows) {
  std::vector<Column> out;
  for_each_metadata_field(md, [&](const MetadataField& field, const auto& value) {
    using T = std::remove_cvref_t<decltype(value)>;
    if constexpr (std::is_same_v<T, std::span<const int32_t>>) {
      if (field.table == nullptr || field.rows != rows) return;
      if (out.empty() || out.back().label != field.table) {
        out.push_back({field.table, {}, field.contract_prefill_part, true});
      }
      out.back().arrays.push_back(value);
      // A field the seed's reference has not (replay_start) shows only when the step has it.
      out.back().present = out.back().present && field_present(md, field.presence) &&
                           field_present(md, field.contract_key);
    }
  });
  return out;
}

std::string cell(const Column& c, int64_t i) {
  std::ostringstream os;
  for (size_t k = 0; k < c.arrays.size(); ++k) os << (k ? "/" : "") << c.arrays[k][i];
  return os.str();
}

void print_requests(std::ostream& os, const BatchFile& file, const SwaMetadata& md) {
  // Per-request fields, [num_reqs], when present; per-prefill-request fields, [num_prefills]: a
  // column on every line ('-' for decodes).
  std::vector<Column> request_columns = columns(md, FieldRows::kRequests);
  std::erase_if(request_columns, [](const Column& c) { return !c.present; });
  const std::vector<Column> prefill_columns = columns(md, FieldRows::kPrefills);
  os << "requests\n  req  kind     tokens    q_len  seq_len  context";
  for (const Column& c : request_columns) os << "  " << c.label;
  for (const Column& c : prefill_columns) os << "  " << c.label;
  os << "  image spans\n";
  for (int32_t r = 0; r < md.num_reqs; ++r) {
    const int32_t qs = file.query_start_loc[r], qe = file.query_start_loc[r + 1];
    const bool decode = r < md.num_decodes;
    std::ostringstream tokens;
    tokens << '[' << qs << ',' << qe << ')';
    os << "  " << std::setw(3) << r << "  " << std::left << std::setw(8)
       << (decode ? "decode" : "prefill") << ' ' << std::setw(9) << tokens.str() << std::right
       << std::setw(6) << qe - qs << std::setw(9) << file.seq_lens[r] << std::setw(9)
       << file.seq_lens[r] - (qe - qs);
    for (const Column& c : request_columns) {
      os << std::setw(static_cast<int>(c.label.size()) + 2) << cell(c, r);
    }
    for (const Column& c : prefill_columns) {
      os << std::setw(static_cast<int>(c.label.size()) + 2)
         << (decode ? std::string("-") : cell(c, r - md.num_decodes));
    }
    const std::string spans = spans_of(file, r);
    if (!spans.empty()) os << "  " << spans;
    os << "\n";
  }
}

void print_tokens(std::ostream& os, const BatchFile& file, const SwaMetadata& md) {
  const int32_t real = file.query_start_loc.empty() ? 0 : file.query_start_loc.back();
  // Per-token fields with a column of their own (the image visibility), when present.
  std::vector<Column> token_columns = columns(md, FieldRows::kTokens);
  std::erase_if(token_columns, [](const Column& c) { return !c.present; });
  os << "tokens  (row = the row's valid entries, slot ids; a..b = a consecutive run)\n";
  os << "    t  req  part     valid   pos   slot  lens/width";
  for (const Column& c : token_columns) os << "  " << c.label;
  os << "  row\n";
  for (int32_t t = 0; t < md.num_tokens; ++t) {
    const bool decode = t < md.num_decode_tokens;
    const ConstIndexView& view = decode ? md.decode_swa : md.prefill_swa;
    const int64_t i = decode ? t : t - md.num_decode_tokens;
    const int32_t r = md.token_to_req_indices[t];
    std::ostringstream pos;
    if (t < real) {
      const int32_t qs = file.query_start_loc[r], ql = file.query_start_loc[r + 1] - qs;
      pos << file.seq_lens[r] - ql + (t - qs);
    } else {
      pos << '-';
    }
    std::ostringstream lens;
    lens << view.lens[i] << '/' << view.width;
    os << "  " << std::setw(3) << t << "  " << std::setw(3)
       << (t < real ? std::to_string(r) : "pad") << "  " << std::left << std::setw(8)
       << (decode ? "decode" : "prefill") << ' ' << std::setw(5)
       << (md.is_valid_token[t] ? "yes" : "no") << std::right << std::setw(6) << pos.str()
       << std::setw(7) << file.slot_mapping[t] << std::setw(12) << lens.str();
    for (const Column& c : token_columns) {
      os << std::setw(static_cast<int>(c.label.size()) + 2)
         << (decode && c.prefill_part ? std::string() : cell(c, t));
    }
    os << "  ";
    if (view.lens[i] == 0) {
      os << "(empty: all -1)";
    } else {
      os << compact_row(std::span<const int32_t>(view.row(i), view.lens[i]));
    }
    os << "\n";
  }
}

void print_plans(std::ostream& os, const std::vector<ChunkPlanResult>& plans) {
  if (plans.empty()) return;
  os << "chunk plans  (prefill requests [start,end) per chunk; N compressed rows, M = N + max "
        "gather)\n";
  for (const ChunkPlanResult& p : plans) {
    os << "  compress_ratio " << p.request.compress_ratio << ", chunk_size "
       << p.request.chunk_size;
    if (p.request.has_compressed) {
      os << ", has_compressed " << (*p.request.has_compressed ? "true" : "false");
    }
    os << ":";
    if (p.plan.empty()) os << " (no prefill requests)";
    for (const ChunkPlanEntry& e : p.plan) {
      os << "  [" << e.start << ',' << e.end << ") N=" << e.compressed_width
         << " M=" << e.total_width;
    }
    os << "\n";
  }
}

}  // namespace

Status print_metadata_table(std::ostream& os, const BatchFile& file, const DerivedConfig& derived,
                            const SwaMetadata& md, const std::vector<ChunkPlanResult>& plans) {
  if (md.space != MemorySpace::kHost) {
    return invalid_argument(
        "metadata: expected host memory (space kHost), got device views; copy the metadata to "
        "the host before printing it");
  }
  if (md.num_reqs != static_cast<int32_t>(file.seq_lens.size()) ||
      md.num_tokens != static_cast<int32_t>(file.slot_mapping.size())) {
    return invalid_argument("metadata: expected the shape of the batch file (",
                            file.seq_lens.size(), " requests, ", file.slot_mapping.size(),
                            " tokens), got ", md.num_reqs, " requests, ", md.num_tokens, " tokens");
  }
  print_config(os, file.config, derived);
  print_split(os, file, md);
  print_requests(os, file, md);
  print_tokens(os, file, md);
  print_plans(os, plans);
  return Status::Ok();
}

}  // namespace sparse_swa::cli
