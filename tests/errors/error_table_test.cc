// SPDX-License-Identifier: Apache-2.0
// The error table of docs/errors.md. tests/data/errors/cases.json lists every error the library
// returns, each with the exact code and message; a case is either a batch file
// (tests/data/errors/inputs/<id>.json, run like `sparse-swa build`: reader, config, builder,
// chunk plans) or a call through the public API (the registry below). The tests check every
// message and that the table between <!-- errors:begin --> and <!-- errors:end --> in
// docs/errors.md equals the table generated from the list.
//
//   Rewrite the table in docs/errors.md:
//     SPARSE_SWA_WRITE_ERROR_TABLE=1 sparse_swa_tests --gtest_filter='ErrorTable.*'
//   Accept new messages (rewrites cases.json with what the library returns; review the diff):
//     SPARSE_SWA_UPDATE_ERROR_CASES=1 sparse_swa_tests --gtest_filter='ErrorTable.*'
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "json/batch_json.h"
#include "sparse_swa/attention.h"
#include "sparse_swa/consumers.h"
#include "sparse_swa/kv_cache.h"
#include "sparse_swa/metadata_builder.h"
#include "support/source_tree.h"
#include "testing/batch_run.h"

namespace sparse_swa {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

fs::path errors_dir() { return testing::test_data_dir() / "errors"; }
fs::path error_doc_path() { return testing::source_dir() / "docs" / "errors.md"; }

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

// ---------------------------------------------------------------- batch-file cases

// The `sparse-swa build` path on a file's text; the first error, or OK.
Status run_file_text(const std::string& text) { return testing::run_batch_text(text).status(); }

// ---------------------------------------------------------------- API cases

// A valid step (the inputs' base): MTP k = 1, W = 8, B = 4, Mi = 4, two decodes and a prefill
// with an image span.
constexpr char kBaseBatch[] = R"({
 "config": {"window_size": 8, "block_size": 4, "max_num_batched_tokens": 64, "max_num_seqs": 8,
            "max_model_len": 64, "num_speculative_tokens": 1, "speculative_method": "mtp",
            "max_image_tokens": 4, "compress_ratios": [1, 4]},
 "batch": {"query_start_loc": [0, 1, 3, 7], "seq_lens": [11, 6, 10],
           "block_table": [[7, 3, 9, 2], [5, 11, 6, 0], [1, 4, 8, 0]],
           "slot_mapping": [38, 44, 45, 18, 19, 32, 33], "causal": true,
           "image_spans": {"2": [[6, 8]]}}})";

// The base step, built. Keeps the file (the batch views point into it) and the builder.
struct BaseStep {
  BatchFile file;
  std::unique_ptr<MetadataBuilder> builder;
  SwaMetadata md;
  BatchInput batch;

  BaseStep() {
    auto parsed = parse_batch_file(kBaseBatch);
    if (!parsed.ok()) throw std::runtime_error(parsed.status().to_string());
    file = std::move(parsed).value();
    auto created = MetadataBuilder::create(file.config, Backend::kCpu);
    if (!created.ok()) throw std::runtime_error(created.status().to_string());
    builder = std::move(created).value();
    batch = file.batch_input();
    const Status s = builder->build(batch, &md);
    if (!s.ok()) throw std::runtime_error(s.to_string());
  }
};

// Host cache storage for the codec cases: `blocks` pages of `layout`, 64-byte aligned.
struct HostPages {
  std::vector<uint8_t> bytes;
  KvCacheView view;
  HostPages(int32_t block_size, int64_t blocks, CacheDtype dtype) {
    const int64_t stride = (block_size * cache_token_bytes(dtype) + 15) / 16 * 16;
    bytes.assign(blocks * stride + 64, 0);
    uint8_t* base = bytes.data() + (64 - reinterpret_cast<uintptr_t>(bytes.data()) % 64) % 64;
    view = {base, blocks, block_size, stride, dtype, MemorySpace::kHost};
  }
};

using ApiCase = std::function<Status()>;

const std::map<std::string, ApiCase>& api_cases() {
  static const auto* cases = new std::map<std::string, ApiCase>{
      {"api_config_max_num_seqs",
       [] {
         BaseStep s;
         BuilderConfig c = s.file.config;
         c.max_num_seqs = int32_t{1} << 30;
         return validate_config(c);
       }},
      {"api_config_buffer_budget",
       [] {
         BaseStep s;
         BuilderConfig c = s.file.config;
         c.window_size = 1000;  // each buffer within its limit, all of them past 8 GiB
         c.max_num_batched_tokens = int32_t{1} << 21;
         return validate_config(c);
       }},
      {"api_config_max_model_len",
       [] {
         BaseStep s;
         BuilderConfig c = s.file.config;
         c.max_model_len = int64_t{1} << 31;
         return validate_config(c);
       }},
      {"api_batch_block_table_stride",
       [] {
         BaseStep s;
         BatchInput b = s.batch;
         b.block_table.stride = 2;
         return s.builder->build(b, &s.md);
       }},
      {"api_batch_block_table_null",
       [] {
         BaseStep s;
         BatchInput b = s.batch;
         b.block_table.data = nullptr;
         return s.builder->build(b, &s.md);
       }},
      {"api_batch_host_copy_size",
       [] {
         BaseStep s;
         BatchInput b = s.batch;
         b.query_start_loc_host = b.query_start_loc.first(3);
         return s.builder->build(b, &s.md);
       }},
      {"api_batch_host_copy_value",
       [] {
         BaseStep s;
         BatchInput b = s.batch;
         static const int32_t kHost[] = {0, 2, 3, 7};
         b.query_start_loc_host = kHost;
         return s.builder->build(b, &s.md);
       }},
      {"api_batch_overlap",
       [] {
         BaseStep s;
         BatchInput b = s.batch;
         b.seq_lens = {s.md.decode_swa.lens, 3};
         return s.builder->build(b, &s.md);
       }},
      {"api_span_request",
       [] {
         BaseStep s;
         BatchInput b = s.batch;
         static const ImageSpan kSpans[] = {{5, 0, 1}};
         b.image_spans = kSpans;
         return s.builder->build(b, &s.md);
       }},
      {"api_update_null",
       [] {
         BaseStep s;
         return s.builder->update_draft_decode_rows(s.batch, nullptr);
       }},
      {"api_update_foreign",
       [] {
         BaseStep s, other;
         return s.builder->update_draft_decode_rows(s.batch, &other.md);
       }},
      {"api_update_shape",
       [] {
         BaseStep s;
         BatchInput b = s.batch;
         b.slot_mapping = b.slot_mapping.first(6);
         b.query_start_loc = std::span<const int32_t>(s.file.query_start_loc).first(3);
         b.seq_lens = b.seq_lens.first(2);
         return s.builder->update_draft_decode_rows(b, &s.md);
       }},
      {"api_update_counts",
       [] {
         BaseStep s;
         SwaMetadata md = s.md;
         md.num_decode_tokens = md.decode_swa.rows = 1;
         return s.builder->update_draft_decode_rows(s.batch, &md);
       }},
      {"api_update_width",
       [] {
         BaseStep s;
         SwaMetadata md = s.md;
         md.decode_swa.width = md.decode_swa.row_stride = 64;
         return s.builder->update_draft_decode_rows(s.batch, &md);
       }},
      {"api_update_replay_start",
       [] {
         // A build replaying request 0 from its prefix 10; the update shrinks the prefix to 9.
         BaseStep s;
         s.file.replay_start = {10, 0, 0};
         BatchInput b = s.file.batch_input();
         SwaMetadata md;
         const Status built = s.builder->build(b, &md);
         if (!built.ok()) return built;
         static const int32_t kShrunk[] = {10, 6, 10};
         b.seq_lens = kShrunk;
         return s.builder->update_draft_decode_rows(b, &md);
       }},
      {"api_update_row_width",
       [] {
         // A non-causal build (W 8, theta 4, width 12); the update's query_start_loc gives
         // request 0 all five decode tokens: a row of min(10, 8) + 5 = 13 entries.
         BuilderConfig c = BaseStep().file.config;
         c.speculative_method = SpeculativeMethod::kDspark;
         c.num_speculative_tokens = 3;
         c.noncausal_index_width = 12;
         c.max_image_tokens = 0;
         auto builder = MetadataBuilder::create(c).value();
         static const int32_t kTable[] = {0, 1, 2, 3, 0, 1, 2, 3};
         static const int64_t kSlots[] = {10, 11, 12, 13, 4};
         static const int32_t kQsl[] = {0, 4, 5}, kSeq[] = {14, 5};
         BatchInput b;
         b.query_start_loc = kQsl;
         b.seq_lens = kSeq;
         b.block_table = {kTable, 2, 4, 4, MemorySpace::kHost};
         b.slot_mapping = kSlots;
         b.causal = false;
         SwaMetadata md;
         const Status built = builder->build(b, &md);
         if (!built.ok()) return built;
         static const int32_t kMovedQsl[] = {0, 5, 5}, kMovedSeq[] = {15, 0};
         b.query_start_loc = kMovedQsl;
         b.seq_lens = kMovedSeq;
         return builder->update_draft_decode_rows(b, &md);
       }},
      {"api_chunk_plan_ratio", [] { return prefill_chunk_plan(BaseStep().md, 3, 4).status(); }},
      {"api_chunk_plan_chunk_size",
       [] { return prefill_chunk_plan(BaseStep().md, 4, 0).status(); }},
      {"api_index_view_lens",
       [] {
         BaseStep s;
         std::vector<int32_t> lens(s.md.decode_swa.lens, s.md.decode_swa.lens + 3);
         lens[1] = 9;
         ConstIndexView v = s.md.decode_swa;
         v.lens = lens.data();
         return check_index_view(v, "metadata.decode_swa");
       }},
      {"api_cache_dtype_name", [] { return parse_cache_dtype("fp16").status(); }},
      {"api_page_layout_block_size",
       [] { return page_layout(48, CacheDtype::kFp8DsMla, CacheConsumer::kFlashMla).status(); }},
      {"api_page_layout_consumer",
       [] { return page_layout(64, CacheDtype::kBf16, CacheConsumer::kFlashMla).status(); }},
      {"api_compressed_page_layout_ratio",
       [] {
         return compressed_page_layout(256, 1, CacheDtype::kFp8DsMla, CacheConsumer::kFlashMla)
             .status();
       }},
      {"api_compressed_page_layout_block",
       [] {
         return compressed_page_layout(64, 128, CacheDtype::kFp8DsMla, CacheConsumer::kFlashMla)
             .status();
       }},
      {"api_cache_page_stride",
       [] {
         HostPages pages(64, 2, CacheDtype::kFp8DsMla);
         pages.view.page_stride_bytes = 64 * 576;
         return check_kv_cache_view(pages.view, "swa_cache");
       }},
      {"api_codec_slot_range",
       [] {
         HostPages pages(64, 2, CacheDtype::kFp8DsMla);
         std::vector<float> out(2 * kHeadDim);
         const std::vector<int64_t> slots = {3, 128};
         return decode_kv_rows(pages.view, slots, {out.data(), 2, kHeadDim, kHeadDim});
       }},
      {"api_codec_row_width",
       [] {
         HostPages pages(64, 1, CacheDtype::kBf16);
         std::vector<float> rows(kHeadDim);
         const std::vector<int64_t> slots = {0};
         return encode_kv_rows({rows.data(), 1, 448, kHeadDim}, slots, pages.view);
       }},
      {"api_codec_slot_count",
       [] {
         HostPages pages(64, 1, CacheDtype::kBf16);
         std::vector<float> out(2 * kHeadDim);
         const std::vector<int64_t> slots = {0};
         return decode_kv_rows(pages.view, slots, {out.data(), 2, kHeadDim, kHeadDim});
       }},
      {"api_compressed_block_size", [] { return compressed_block_size(256, 3).status(); }},
      {"api_topk_out_width",
       [] {
         BaseStep s;
         std::vector<int32_t> table = {0, 1, 2, 3, 4, 5}, local(3 * 4, 0), out(3 * 2), lens(3);
         const CompressedCache cache{{table.data(), 3, 2, 2}, 16, 4};
         return compressed_topk_to_global(s.md, 0, {local.data(), 3, 4, 4}, cache,
                                          {out.data(), lens.data(), 3, 2, 2, 0});
       }},
      {"api_mixed_row_stride",
       [] {
         BaseStep s;
         CompressedTopk topk;  // an SWA-only layer
         const MixedMatrixShape shape = mixed_matrix_shape(s.md, topk);
         std::vector<int32_t> out(7 * (shape.row_width + 1)), lens(7);
         const ConsumerStep step{s.md, s.batch, 4};
         return build_mixed_matrix(
             step, topk, {out.data(), lens.data(), 7, shape.row_width, shape.row_width + 1, 0});
       }},
      {"api_mixed_relayout_width",
       [] {
         // One non-causal block, W = 8, prefix 2, ql 3, in a 9-wide decode view: token 0's
         // SM100 relayout needs W + spill = 10 columns (max_decode_query_len understates the
         // block, so the W + max_decode_query_len check passes).
         static const std::vector<int32_t> qsl = {0, 3}, seq = {5}, bt = {0, 1}, t2r = {0, 0, 0},
                                           lens = {5, 5, 5};
         static const std::vector<uint8_t> valid = {1, 1, 1};
         std::vector<int32_t> rows(27, -1), out(36), out_lens(3);
         for (int t = 0; t < 3; ++t) std::iota(rows.begin() + 9 * t, rows.begin() + 9 * t + 5, 0);
         SwaMetadata md;
         md.causal = false;
         md.num_reqs = md.num_decodes = 1;
         md.num_tokens = md.num_decode_tokens = 3;
         md.token_to_req_indices = t2r;
         md.is_valid_token = valid;
         md.decode_swa = {rows.data(), lens.data(), 3, 9, 9, 8};
         md.prefill_swa = {nullptr, nullptr, 0, 8, 8, 8};
         md.window_size = 8;
         const BatchInput batch{qsl, seq, {bt.data(), 1, 2, 2}, {}, false, {}};
         return build_mixed_matrix({md, batch, 4}, {}, {out.data(), out_lens.data(), 3, 12, 12, 8});
       }},
      {"api_consumer_replay_start",
       [] {
         // Request 2 prefills positions 6..9 (prefix 6): a replay start past its prefix.
         BaseStep s;
         static const std::vector<int32_t> replay = {0, 0, 7};
         SwaMetadata md = s.md;
         md.replay_start = replay;
         const MixedMatrixShape shape = mixed_matrix_shape(md, {});
         std::vector<int32_t> out(7 * shape.row_width), lens(7);
         return build_mixed_matrix(
             {md, s.batch, 4}, {},
             {out.data(), lens.data(), 7, shape.row_width, shape.row_width, 8});
       }},
      {"api_ragged_capacity",
       [] {
         BaseStep s;
         std::vector<int32_t> indptr(4), values(10);
         return to_ragged(s.md.decode_swa, {indptr.data(), 4, values.data(), 10});
       }},
      {"api_combined_chunk",
       [] {
         BaseStep s;
         std::vector<int32_t> out(4 * 128), lens(4);
         const ConsumerStep step{s.md, s.batch, 4};
         return build_combined_prefill(step, {0, 2, 0, 10}, 1, {},
                                       {out.data(), lens.data(), 4, 128, 128, 0});
       }},
      {"api_consumer_counts",
       [] {
         BaseStep s;
         SwaMetadata md = s.md;
         md.num_decodes = std::numeric_limits<int32_t>::max();
         return combined_prefill_shape(md, {0, 1, 0, 10}, 0).status();
       }},
      {"api_prefill_topk_range",
       [] {
         BaseStep s;
         std::vector<int32_t> local = {0, 0, 1, 1, 0, 0, 1, 5};  // [4, 2]: token 3 reads 5
         const ConsumerStep step{s.md, s.batch, 4};
         return check_prefill_topk(step, 4, {local.data(), 4, 2, 2});
       }},
      {"api_attention_kernel_name", [] { return parse_attention_kernel("fast").status(); }},
      {"api_attention_heads",
       [] {
         SparseAttentionParams p;
         p.num_heads = 129;
         return sparse_attention(p);
       }},
      {"api_attention_index_below_minus_one",
       [] {
         HostPages pages(64, 1, CacheDtype::kFp8DsMla);
         const std::vector<uint16_t> q(kHeadDim, 0);
         std::vector<int32_t> rows = {3, -1, -5, 7}, lens = {4};
         std::vector<uint16_t> out(kHeadDim);
         std::vector<float> lse(1);
         SparseAttentionParams p;
         p.num_tokens = 1;
         p.num_heads = 1;
         p.q = q.data();
         p.swa_cache = pages.view;
         p.swa_indices = {rows.data(), lens.data(), 1, 4, 4, 4, MemorySpace::kHost};
         p.out = out.data();
         p.lse = lse.data();
         return sparse_attention(p);
       }},
      {"api_read_missing_file", [] { return read_batch_file("/nonexistent/batch.json").status(); }},
      {"api_read_directory", [] { return read_batch_file("/").status(); }},
  };
  return *cases;
}

// ---------------------------------------------------------------- the list and the table

struct ErrorCase {
  std::string id, where, error, code, message;
};

std::vector<ErrorCase> load_cases() {
  const Json doc = Json::parse(read_text(errors_dir() / "cases.json"));
  std::vector<ErrorCase> cases;
  for (const Json& c : doc) {
    cases.push_back(
        {c.at("id"), c.at("where"), c.at("error"), c.value("code", ""), c.value("message", "")});
  }
  return cases;
}

Status run_case(const ErrorCase& c) {
  const auto api = api_cases().find(c.id);
  if (api != api_cases().end()) return api->second();
  return run_file_text(read_text(errors_dir() / "inputs" / (c.id + ".json")));
}

// A markdown table cell: `|` escaped, code in a code span.
std::string cell(const std::string& text, bool code) {
  std::string out;
  for (char ch : text) {
    if (ch == '|') out += '\\';
    out += ch;
  }
  return code ? "`" + out + "`" : out;
}

std::string markdown_table(const std::vector<ErrorCase>& cases) {
  std::string t = "| Where | Error | Code | Message |\n| --- | --- | --- | --- |\n";
  for (const ErrorCase& c : cases) {
    t += "| " + c.where + " | " + cell(c.error, false) + " | " + c.code + " | " +
         cell(c.message, true) + " |\n";
  }
  return t;
}

constexpr char kBegin[] = "<!-- errors:begin -->";
constexpr char kEnd[] = "<!-- errors:end -->";

TEST(ErrorTable, EveryCaseReturnsItsMessage) {
  std::vector<ErrorCase> cases = load_cases();
  ASSERT_FALSE(cases.empty());
  for (ErrorCase& c : cases) {
    Status s;
    try {
      s = run_case(c);
    } catch (const std::exception& e) {
      ADD_FAILURE() << c.id << ": threw " << e.what() << " instead of returning a Status";
      continue;
    }
    EXPECT_FALSE(s.ok()) << c.id << ": expected an error, got OK";
    EXPECT_EQ(status_code_name(s.code()), c.code) << c.id;
    EXPECT_EQ(s.message(), c.message) << c.id;
    c.code = status_code_name(s.code());
    c.message = s.message();
  }
  if (env_set("SPARSE_SWA_UPDATE_ERROR_CASES")) {
    Json doc = Json::array();
    for (const ErrorCase& c : cases) {
      doc.push_back({{"id", c.id},
                     {"where", c.where},
                     {"error", c.error},
                     {"code", c.code},
                     {"message", c.message}});
    }
    std::ofstream(errors_dir() / "cases.json") << doc.dump(1) << "\n";
    std::cout << "rewrote " << (errors_dir() / "cases.json").string() << "\n";
  }
}

TEST(ErrorTable, EveryInputAndApiCaseIsListed) {
  std::set<std::string> listed;
  for (const ErrorCase& c : load_cases()) {
    EXPECT_TRUE(listed.insert(c.id).second) << "duplicate id " << c.id;
    const bool api = api_cases().count(c.id) > 0;
    const bool file = fs::exists(errors_dir() / "inputs" / (c.id + ".json"));
    EXPECT_TRUE(api != file) << c.id << ": expected exactly one of an API case or an input file";
    EXPECT_FALSE(c.where.empty() || c.error.empty()) << c.id;
  }
  for (const auto& [id, fn] : api_cases()) EXPECT_TRUE(listed.count(id)) << id << " is not listed";
  for (const auto& entry : fs::directory_iterator(errors_dir() / "inputs")) {
    const std::string id = entry.path().stem().string();
    EXPECT_TRUE(listed.count(id)) << entry.path() << " is not listed in cases.json";
  }
}

TEST(ErrorTable, DocsTableMatchesTheCases) {
  const std::string table = markdown_table(load_cases());
  std::string doc = read_text(error_doc_path());
  ASSERT_FALSE(doc.empty()) << "cannot read " << error_doc_path();
  const size_t begin = doc.find(kBegin);
  size_t end = doc.find(kEnd);
  const bool has_block = begin != std::string::npos && end != std::string::npos && begin < end;
  const bool write = env_set("SPARSE_SWA_WRITE_ERROR_TABLE");
  if (write && !has_block) std::cout << kBegin << "\n" << table << kEnd << "\n";
  ASSERT_TRUE(has_block) << error_doc_path() << " has no " << kBegin << " ... " << kEnd
                         << " block; add the two markers (SPARSE_SWA_WRITE_ERROR_TABLE=1 prints "
                            "the table to paste between them)";
  const size_t from = begin + std::string(kBegin).size() + 1;  // past the marker's newline
  if (write && doc.substr(from, end - from) != table) {
    doc.replace(from, end - from, table);
    std::ofstream(error_doc_path(), std::ios::binary) << doc;
    std::cout << "rewrote the table in " << error_doc_path().string() << "\n";
    doc = read_text(error_doc_path());  // what the next run reads
    end = doc.find(kEnd);
  }
  EXPECT_EQ(doc.substr(from, end - from), table)
      << "the error table of docs/errors.md is stale; regenerate it with "
         "SPARSE_SWA_WRITE_ERROR_TABLE=1";
}

}  // namespace
}  // namespace sparse_swa
