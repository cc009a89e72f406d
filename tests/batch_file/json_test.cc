// SPDX-License-Identifier: Apache-2.0
// The JSON batch format and the JSON metadata writer (tools/json/batch_json.h).
//
// examples/batches/<case>.json + <case>.expected.json: mixed_mtp and dspark_draft are the
// reference builder's own output; padded_decode and vision_prefill are hand-computed (examples 2
// and 4 of docs/semantics.md#worked-examples). Every case must match field by field and byte for
// byte (the reference's json.dumps form).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "json/batch_json.h"
#include "sparse_swa/metadata_builder.h"
#include "support/source_tree.h"
#include "support/status_matchers.h"
#include "testing/batch_run.h"
#include "testing/presets.h"
#include "testing/scenarios.h"

namespace sparse_swa {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

fs::path data_dir() { return testing::examples_dir(); }

// Every <case>.json in examples/batches with a <case>.expected.json beside it.
std::vector<std::string> case_names() {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(data_dir())) {
    const std::string file = entry.path().filename().string();
    const std::string suffix = ".expected.json";
    if (file.size() > suffix.size() &&
        file.compare(file.size() - suffix.size(), suffix.size(), suffix) == 0) {
      const std::string name = file.substr(0, file.size() - suffix.size());
      if (fs::exists(data_dir() / (name + ".json"))) names.insert(name);
    }
  }
  return {names.begin(), names.end()};
}

// The output of `sparse-swa build --backend cpu` for a parsed file.
StatusOr<nlohmann::ordered_json> build_json(const BatchFile& file) {
  auto run = testing::run_batch(file);
  if (!run.ok()) return run.status();
  return std::move(run.value().json);
}

std::string trim_newline(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

TEST(BatchJsonGolden, EveryCaseMatchesItsExpectedOutput) {
  const std::vector<std::string> names = case_names();
  // The reference's two examples plus the two hand-computed ones.
  ASSERT_GE(names.size(), 4u);
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    auto file = read_batch_file((data_dir() / (name + ".json")).string());
    ASSERT_TRUE(file.ok()) << file.status().message();
    auto out = build_json(file.value());
    ASSERT_TRUE(out.ok()) << out.status().message();
    const std::string expected_text = read_text(data_dir() / (name + ".expected.json"));
    const Json expected = Json::parse(expected_text);
    const Json actual = Json::parse(out.value().dump());
    ASSERT_TRUE(expected.is_object());
    for (const auto& [key, value] : expected.items()) {
      ASSERT_TRUE(actual.contains(key)) << "missing key " << key;
      EXPECT_EQ(actual[key], value) << "field " << key;
    }
    EXPECT_EQ(actual.size(), expected.size()) << "extra keys in " << actual.dump();
    // Same keys, same order, same separators: a plain text diff against the reference works.
    EXPECT_EQ(dump_python_style(out.value()), trim_newline(expected_text));
  }
}

TEST(BatchJsonWriter, ShippedFilesRoundTripThroughTheWriter) {
  for (const std::string& name : case_names()) {
    SCOPED_TRACE(name);
    auto file = read_batch_file((data_dir() / (name + ".json")).string());
    ASSERT_TRUE(file.ok()) << file.status().message();
    const nlohmann::ordered_json written = batch_file_to_json(file.value());
    auto again = parse_batch_file(written.dump());
    ASSERT_TRUE(again.ok()) << again.status().message();
    EXPECT_EQ(batch_file_to_json(again.value()), written);
    auto a = build_json(file.value()), b = build_json(again.value());
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(dump_python_style(a.value()), dump_python_style(b.value()));
  }
}

TEST(BatchJsonWriter, BenchScenariosAreValidBatchFiles) {
  std::mt19937_64 rng(7);
  for (const testing::BenchScenario& s : testing::bench_scenarios()) {
    SCOPED_TRACE(testing::scenario_name(s));
    const testing::TestBatch batch = testing::bench_batch(s, rng);
    const BatchFile file = batch_file_of(testing::bench_config(s.dspark), batch.input());
    auto parsed = parse_batch_file(batch_file_to_json(file).dump());
    ASSERT_TRUE(parsed.ok()) << parsed.status().message();
    auto run = testing::run_batch(std::move(parsed).value());
    ASSERT_TRUE(run.ok()) << run.status().message();
    const int32_t decode_len = s.dspark ? testing::kBenchDsparkTokens + 1 : 1;
    EXPECT_EQ(run->md.num_tokens, s.decodes * decode_len + s.prefills * s.prefill_len);
    EXPECT_EQ(run->md.num_decodes, s.decodes);
    EXPECT_EQ(run->md.num_prefills, s.prefills);
    EXPECT_EQ(run->md.causal, !s.dspark);
  }
}

TEST(BatchJsonGolden, MixedMtpParsesEveryField) {
  auto file = read_batch_file((data_dir() / "mixed_mtp.json").string());
  ASSERT_TRUE(file.ok()) << file.status().message();
  const BatchFile& f = file.value();
  EXPECT_EQ(f.config.window_size, 8);
  EXPECT_EQ(f.config.block_size, 4);
  EXPECT_EQ(f.config.max_num_batched_tokens, 64);
  EXPECT_EQ(f.config.max_num_seqs, 8);
  EXPECT_EQ(f.config.max_model_len, 64);
  EXPECT_EQ(f.config.num_speculative_tokens, 1);
  EXPECT_EQ(f.config.speculative_method, SpeculativeMethod::kMtp);
  EXPECT_FALSE(f.config.parallel_drafting);
  EXPECT_EQ(f.config.compress_ratios, (std::vector<int32_t>{1, 4}));
  EXPECT_EQ(f.query_start_loc, (std::vector<int32_t>{0, 1, 3, 7}));
  EXPECT_EQ(f.seq_lens, (std::vector<int32_t>{11, 6, 10}));
  EXPECT_EQ(f.block_table_rows, 3);
  EXPECT_EQ(f.block_table_cols, 4);
  EXPECT_EQ(f.block_table, (std::vector<int32_t>{7, 3, 9, 2, 5, 11, 6, 0, 1, 4, 8, 0}));
  EXPECT_EQ(f.slot_mapping, (std::vector<int64_t>{38, 44, 45, 18, 19, 32, 33}));
  EXPECT_TRUE(f.causal);
  ASSERT_EQ(f.chunk_plan_requests.size(), 2u);
  EXPECT_EQ(f.chunk_plan_requests[1].compress_ratio, 4);
  EXPECT_EQ(f.chunk_plan_requests[1].chunk_size, 4);
  EXPECT_FALSE(f.chunk_plan_requests[1].has_compressed.has_value());

  // The views point into the file's own storage, with the block table's shape.
  const BatchInput b = f.batch_input();
  EXPECT_EQ(b.seq_lens.data(), f.seq_lens.data());
  EXPECT_EQ(b.slot_mapping.data(), f.slot_mapping.data());
  EXPECT_EQ(b.block_table.rows, 3);
  EXPECT_EQ(b.block_table.cols, 4);
  EXPECT_EQ(b.block_table.stride, 4);
  EXPECT_EQ(b.block_table.row(2)[1], 4);
  EXPECT_EQ(b.num_reqs(), 3);
  EXPECT_EQ(b.num_tokens(), 7);
}

// A valid document to mutate: the reference's mixed MTP example.
Json base_doc() { return Json::parse(read_text(data_dir() / "mixed_mtp.json")); }

std::string parse_message(const Json& doc) {
  auto file = parse_batch_file(doc.dump());
  EXPECT_FALSE(file.ok()) << "parsed without error: " << doc.dump();
  if (file.ok()) return "";
  EXPECT_EQ(file.status().code(), StatusCode::kInvalidArgument);
  return file.status().message();
}

std::string parse_message(std::string_view text) {
  auto file = parse_batch_file(text);
  EXPECT_FALSE(file.ok()) << "parsed without error: " << text;
  return file.ok() ? "" : file.status().message();
}

TEST(BatchJsonErrors, FloatWhereIntegerBelongs) {
  Json doc = base_doc();
  doc["batch"]["seq_lens"][1] = 2.5;
  EXPECT_EQ(parse_message(doc), "batch.seq_lens[1]: expected an integer, got 2.5");
  doc = base_doc();
  doc["config"]["window_size"] = 8.0;  // integral but still a float
  EXPECT_EQ(parse_message(doc), "config.window_size: expected an integer, got 8.0");
  doc = base_doc();
  doc["batch"]["block_table"][1][2] = 1e3;
  EXPECT_EQ(parse_message(doc), "batch.block_table[1][2]: expected an integer, got 1000.0");
  EXPECT_EQ(parse_message(std::string_view(
                R"({"config": {"window_size": 8, "block_size": 4, "max_num_batched_tokens": 64,
                   "max_num_seqs": 8, "max_model_len": 3e1}, "batch": {}})")),
            "config.max_model_len: expected an integer, got 30.0");
}

TEST(BatchJsonErrors, StringNullOrBoolWhereIntegerBelongs) {
  Json doc = base_doc();
  doc["config"]["block_size"] = "4";
  EXPECT_EQ(parse_message(doc), "config.block_size: expected an integer, got \"4\"");
  doc = base_doc();
  doc["batch"]["slot_mapping"][0] = true;
  EXPECT_EQ(parse_message(doc), "batch.slot_mapping[0]: expected an integer, got true");
  doc = base_doc();
  doc["batch"]["query_start_loc"][3] = nullptr;
  EXPECT_EQ(parse_message(doc), "batch.query_start_loc[3]: expected an integer, got null");
  doc = base_doc();
  doc["chunk_plan_requests"][1]["chunk_size"] = Json::array({4});
  EXPECT_EQ(parse_message(doc),
            "chunk_plan_requests[1].chunk_size: expected an integer, got an array of 1 elements");
  doc = base_doc();
  doc["batch"]["seq_lens"] = Json::object({{"0", 1}});
  EXPECT_EQ(parse_message(doc), "batch.seq_lens: expected an array, got an object with 1 keys");
}

TEST(BatchJsonErrors, IntegersOutsideTheirRange) {
  Json doc = base_doc();
  doc["batch"]["query_start_loc"][2] = 3000000000LL;
  EXPECT_EQ(parse_message(doc),
            "batch.query_start_loc[2]: expected an int32 integer, got 3000000000");
  doc = base_doc();
  doc["batch"]["block_table"][0][0] = -2147483649LL;
  EXPECT_EQ(parse_message(doc),
            "batch.block_table[0][0]: expected an int32 integer, got -2147483649");
  doc = base_doc();
  doc["config"]["max_model_len"] = 18446744073709551615ULL;
  EXPECT_EQ(parse_message(doc),
            "config.max_model_len: expected an int32 integer, got 18446744073709551615");
  // slot_mapping is int64: a large slot parses (the builder judges it), 2^64 - 1 does not.
  doc = base_doc();
  doc["batch"]["slot_mapping"][0] = 5000000000LL;
  auto file = parse_batch_file(doc.dump());
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ(file->slot_mapping[0], 5000000000LL);
  doc["batch"]["slot_mapping"][0] = 18446744073709551615ULL;
  EXPECT_EQ(parse_message(doc),
            "batch.slot_mapping[0]: expected an int64 integer, got 18446744073709551615");
}

TEST(BatchJsonErrors, MissingRequiredFields) {
  Json doc = base_doc();
  doc["config"].erase("max_model_len");
  EXPECT_EQ(parse_message(doc),
            "config.max_model_len: expected an integer, got nothing (the field is required)");
  doc = base_doc();
  doc["batch"].erase("causal");
  EXPECT_EQ(parse_message(doc),
            "batch.causal: expected true or false, got nothing (the field is required)");
  doc = base_doc();
  doc["batch"].erase("block_table");
  EXPECT_EQ(parse_message(doc),
            "batch.block_table: expected an array of rows, got nothing (the field is required)");
  doc = base_doc();
  doc["chunk_plan_requests"][0].erase("compress_ratio");
  EXPECT_EQ(parse_message(doc),
            "chunk_plan_requests[0].compress_ratio: expected an integer, got nothing (the field "
            "is required)");
  doc = base_doc();
  doc.erase("batch");
  EXPECT_EQ(parse_message(doc), "batch: expected an object, got nothing (the field is required)");
  doc = base_doc();
  doc["config"] = Json::array();
  EXPECT_EQ(parse_message(doc), "config: expected an object, got []");
}

TEST(BatchJsonErrors, RaggedBlockTable) {
  Json doc = base_doc();
  doc["batch"]["block_table"][2] = Json::array({1, 4, 8});
  EXPECT_EQ(parse_message(doc),
            "batch.block_table[2]: expected 4 entries like batch.block_table[0] (rows must not "
            "be ragged), got 3");
  doc = base_doc();
  doc["batch"]["block_table"][1] = 5;
  EXPECT_EQ(parse_message(doc),
            "batch.block_table[1]: expected a row (an array of block ids), got 5");
}

TEST(BatchJsonErrors, BadImageSpans) {
  Json doc = base_doc();
  doc["config"]["max_image_tokens"] = 4;
  doc["batch"]["image_spans"] = {{"x", Json::array({Json::array({6, 7})})}};
  EXPECT_EQ(parse_message(doc),
            "batch.image_spans[\"x\"]: expected a request index (a decimal integer key), got "
            "\"x\"");
  for (const char* key : {"1.0", "", " 2", "2 ", "+2", "0x2", "99999999999999999999"}) {
    doc["batch"]["image_spans"] = {{key, Json::array()}};
    EXPECT_NE(parse_message(doc).find("expected a request index (a decimal integer key)"),
              std::string::npos)
        << key;
  }
  doc["batch"]["image_spans"] = {{"3", Json::array()}};
  EXPECT_EQ(parse_message(doc),
            "batch.image_spans[\"3\"]: expected a request index in [0, 3) (len(batch.seq_lens) = "
            "3), got 3");
  doc["batch"]["image_spans"] = {{"-1", Json::array()}};
  EXPECT_EQ(parse_message(doc),
            "batch.image_spans[\"-1\"]: expected a request index in [0, 3) (len(batch.seq_lens) "
            "= 3), got -1");
  doc["batch"]["image_spans"] = {{"2", Json::array({Json::array({6, 7})})},
                                 {"02", Json::array({Json::array({8, 9})})}};
  EXPECT_EQ(parse_message(doc),
            "batch.image_spans[\"2\"]: request 2 already has spans under key \"02\"");
  doc["batch"]["image_spans"] = {{"2", Json::array({Json::array({6, 7, 8})})}};
  EXPECT_EQ(parse_message(doc),
            "batch.image_spans[\"2\"][0]: expected [start, end], got an array of 3 elements");
  doc["batch"]["image_spans"] = {{"2", Json::array({Json::array({6, 7.5})})}};
  EXPECT_EQ(parse_message(doc), "batch.image_spans[\"2\"][0][1]: expected an integer, got 7.5");
  doc["batch"]["image_spans"] = {{"2", 6}};
  EXPECT_EQ(parse_message(doc),
            "batch.image_spans[\"2\"]: expected a list of [start, end] spans, got 6");
  doc["batch"]["image_spans"] = Json::array();
  EXPECT_EQ(parse_message(doc), "batch.image_spans: expected an object, got []");
}

TEST(BatchJsonErrors, BadSpeculativeMethodAndFlags) {
  Json doc = base_doc();
  doc["config"]["speculative_method"] = "eagle";
  EXPECT_EQ(parse_message(doc),
            "config.speculative_method: expected one of none, mtp, dspark, got \"eagle\"");
  doc["config"]["speculative_method"] = 1;
  EXPECT_EQ(parse_message(doc),
            "config.speculative_method: expected one of \"none\", \"mtp\", \"dspark\", got 1");
  doc = base_doc();
  doc["batch"]["causal"] = "yes";
  EXPECT_EQ(parse_message(doc), "batch.causal: expected true or false, got \"yes\"");
  doc = base_doc();
  doc["config"]["parallel_drafting"] = 0;
  EXPECT_EQ(parse_message(doc), "config.parallel_drafting: expected true or false, got 0");
  doc = base_doc();
  doc["chunk_plan_requests"][0]["has_compressed"] = 1;
  EXPECT_EQ(parse_message(doc),
            "chunk_plan_requests[0].has_compressed: expected true or false, got 1");
  doc = base_doc();
  doc["chunk_plan_requests"] = Json::object();
  EXPECT_EQ(parse_message(doc), "chunk_plan_requests: expected an array, got {}");
}

TEST(BatchJsonErrors, MalformedJsonGivesThePosition) {
  const std::string message =
      parse_message(std::string_view("{\"config\": {\n  \"window_size\": 8,,\n"));
  EXPECT_EQ(message.rfind("batch file: malformed JSON: ", 0), 0u) << message;
  EXPECT_NE(message.find("line 2, column"), std::string::npos) << message;
  EXPECT_NE(parse_message(std::string_view("")).find("malformed JSON"), std::string::npos);
  EXPECT_NE(parse_message(std::string_view("{\"a\": 1} trailing")).find("malformed JSON"),
            std::string::npos);
  EXPECT_NE(parse_message(std::string_view("{\"a\": \"\xff\"}")).find("malformed JSON"),
            std::string::npos);
  EXPECT_EQ(parse_message(std::string_view("[1, 2]")),
            "batch file: expected a JSON object with \"config\" and \"batch\", got an array of 2 "
            "elements");
  EXPECT_EQ(parse_message(std::string_view("7")),
            "batch file: expected a JSON object with \"config\" and \"batch\", got 7");
}

TEST(BatchJsonErrors, DeeplyNestedInputIsAnErrorNotACrash) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  Json doc = base_doc();
  std::string text = doc.dump();
  // {"batch": {"seq_lens": [[[[...]]]] ...}}: past the reader's depth limit, rejected before
  // parsing (never walked recursively).
  const std::string key = "\"seq_lens\":[11,6,10]";
  ASSERT_NE(text.find(key), std::string::npos);
  text.replace(text.find(key), key.size(), "\"seq_lens\":" + deep);
  const std::string message = parse_message(std::string_view(text));
  EXPECT_EQ(message.rfind("batch file: JSON nested deeper than 64 levels (at byte ", 0), 0u)
      << message;
}

TEST(BatchJsonRead, UnreadableFileNamesThePath) {
  const std::string missing = (data_dir() / "no_such_batch.json").string();
  auto file = read_batch_file(missing);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().message(),
            missing + ": cannot read the batch file (No such file or directory)");
  auto dir = read_batch_file(data_dir().string());
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.status().message(),
            data_dir().string() + ": cannot read the batch file (it is a directory)");
}

TEST(BatchJsonRead, MalformedFileNamesThePath) {
  const fs::path path = fs::temp_directory_path() / "sparse_swa_json_test_malformed.json";
  {
    std::ofstream out(path);
    out << "{\"config\": ";
  }
  auto file = read_batch_file(path.string());
  fs::remove(path);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().message().rfind(path.string() + ": malformed JSON: ", 0), 0u)
      << file.status().message();
}

TEST(BatchJsonParse, OptionalConfigFieldsDefault) {
  auto file = parse_batch_file(R"({
    "config": {"window_size": 8, "block_size": 4, "max_num_batched_tokens": 16,
               "max_num_seqs": 2, "max_model_len": 64},
    "batch": {"query_start_loc": [0], "seq_lens": [], "block_table": [],
              "slot_mapping": [], "causal": true}})");
  ASSERT_TRUE(file.ok()) << file.status().message();
  const BuilderConfig& c = file->config;
  EXPECT_EQ(c.num_speculative_tokens, 0);
  EXPECT_EQ(c.speculative_method, SpeculativeMethod::kNone);
  EXPECT_FALSE(c.parallel_drafting);
  EXPECT_EQ(c.max_image_tokens, 0);
  EXPECT_EQ(c.compress_ratios, std::vector<int32_t>{1});
  EXPECT_TRUE(file->image_spans.empty());
  EXPECT_TRUE(file->chunk_plan_requests.empty());
  // An empty block table still gives a non-null row pointer (the builder rejects null data).
  const BatchInput b = file->batch_input();
  EXPECT_NE(b.block_table.data, nullptr);
  EXPECT_EQ(b.block_table.rows, 0);
  EXPECT_EQ(b.block_table.cols, 0);
}

TEST(BatchJsonParse, UnknownTopLevelKeysAreIgnored) {
  Json doc = base_doc();
  doc["comment"] = "made by hand";
  doc["expected"] = Json::object();
  auto file = parse_batch_file(doc.dump());
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ(file->seq_lens, (std::vector<int32_t>{11, 6, 10}));
}

// A misspelt optional field would silently take its default: config, batch and chunk plan
// requests accept their own keys only, and the message names the nearest one.
TEST(BatchJsonParse, UnknownFieldsAreErrorsNamingTheNearestKey) {
  const struct {
    const char* object;
    const char* key;
    const char* message;
  } cases[] = {
      {"config", "max_image_token",
       "config: unknown field \"max_image_token\" (did you mean \"max_image_tokens\"? expected "
       "one of window_size, "},
      {"config", "vision_n_layers", "config: unknown field \"vision_n_layers\" (expected one of "},
      {"batch", "slot_maping",
       "batch: unknown field \"slot_maping\" (did you mean \"slot_mapping\"? expected one of "
       "query_start_loc, seq_lens, block_table, slot_mapping, causal, image_spans, replay_start)"},
      {"chunk", "chunksize",
       "chunk_plan_requests[0]: unknown field \"chunksize\" (did you mean \"chunk_size\"?"},
  };
  for (const auto& c : cases) {
    Json doc = base_doc();
    Json& object = std::string(c.object) == "chunk" ? doc["chunk_plan_requests"][0] : doc[c.object];
    object[c.key] = 1;
    auto file = parse_batch_file(doc.dump());
    EXPECT_TRUE(testing::IsInvalidArgument(file.status(), {c.message})) << c.key;
  }
  // A long key is shortened in the message, which keeps the list of known keys whole.
  Json doc = base_doc();
  doc["config"][std::string(500, 'k')] = 1;
  auto file = parse_batch_file(doc.dump());
  EXPECT_TRUE(testing::IsInvalidArgument(
      file.status(), {"(truncated) (expected one of", "flashinfer_decode_lens, compress_ratios)"}));
}

TEST(BatchJsonParse, ImageSpansSortedByRequestThenFileOrder) {
  Json doc = base_doc();
  doc["config"]["max_image_tokens"] = 4;
  doc["batch"]["image_spans"] = {{"2", Json::array({Json::array({8, 9}), Json::array({6, 7})})},
                                 {"10", Json::array()},
                                 {"0", Json::array({Json::array({1, 3})})}};
  doc["batch"]["seq_lens"] = Json::array({11, 6, 10, 0, 0, 0, 0, 0, 0, 0, 0});
  auto file = parse_batch_file(doc.dump());
  ASSERT_TRUE(file.ok()) << file.status().message();
  ASSERT_EQ(file->image_spans.size(), 3u);
  EXPECT_EQ(file->image_spans[0].request, 0);
  EXPECT_EQ(file->image_spans[0].start, 1);
  EXPECT_EQ(file->image_spans[0].end, 3);
  EXPECT_EQ(file->image_spans[1].request, 2);
  EXPECT_EQ(file->image_spans[1].start, 8);
  EXPECT_EQ(file->image_spans[2].request, 2);
  EXPECT_EQ(file->image_spans[2].start, 6);
}

TEST(BatchJsonParse, BuilderErrorsStillNameTheField) {
  // Well-typed but semantically wrong: the builder reports it with the same field path.
  Json doc = base_doc();
  doc["batch"]["seq_lens"][1] = 1;
  auto file = parse_batch_file(doc.dump());
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto out = build_json(file.value());
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message().rfind("batch.seq_lens[1]: expected >= ", 0), 0u)
      << out.status().message();
}

TEST(BatchJsonChunkPlans, HasCompressedIsHonouredAndEchoedOnlyWhenGiven) {
  Json doc = base_doc();
  doc["chunk_plan_requests"][1]["has_compressed"] = false;
  auto file = parse_batch_file(doc.dump());
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto out = build_json(file.value());
  ASSERT_TRUE(out.ok()) << out.status().message();
  const auto& plans = out.value()["prefill_chunk_plans"];
  ASSERT_EQ(plans.size(), 2u);
  EXPECT_FALSE(plans[0].contains("has_compressed"));
  EXPECT_EQ(plans[1]["has_compressed"], false);
  // Ratio 4 without a compressed region: N = 0, M = the gather length 10.
  EXPECT_EQ(Json::parse(plans[1]["plan"].dump()), Json::parse("[[0, 1, 0, 10]]"));
  EXPECT_EQ(dump_python_style(plans[1]),
            "{\"compress_ratio\": 4, \"chunk_size\": 4, \"has_compressed\": false, \"plan\": "
            "[[0, 1, 0, 10]]}");
}

TEST(BatchJsonChunkPlans, BadRequestsNameTheirIndex) {
  Json doc = base_doc();
  doc["chunk_plan_requests"][1]["compress_ratio"] = 3;
  auto file = parse_batch_file(doc.dump());
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto out = build_json(file.value());
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(),
            "chunk_plan_requests[1].compress_ratio: expected a compress ratio in {1, 2, 4, 128}, "
            "got 3");
  doc = base_doc();
  doc["chunk_plan_requests"][0]["chunk_size"] = 0;
  file = parse_batch_file(doc.dump());
  ASSERT_TRUE(file.ok()) << file.status().message();
  out = build_json(file.value());
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(), "chunk_plan_requests[0].chunk_size: expected >= 1, got 0");
}

TEST(MetadataJson, DeviceMetadataIsRejected) {
  SwaMetadata md;
  md.space = MemorySpace::kDevice;
  auto out = metadata_to_json(md, {});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(),
            "metadata: expected host memory (space kHost), got device views; copy the metadata "
            "to the host before writing JSON");
}

TEST(MetadataJson, EmptyStepKeepsEveryKey) {
  SwaMetadata md;  // no requests, no tokens
  md.decode_swa.width = md.decode_swa.row_stride = md.decode_swa.window = 8;
  auto out = metadata_to_json(md, {});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(dump_python_style(out.value()),
            "{\"num_decodes\": 0, \"num_prefills\": 0, \"num_decode_tokens\": 0, "
            "\"num_prefill_tokens\": 0, \"max_decode_query_len\": 1, \"decode_swa_width\": 8, "
            "\"decode_swa_indices\": [], \"decode_swa_lens\": [], \"prefill_swa_indices\": null, "
            "\"prefill_swa_lens\": null, \"prefill_gather_lens\": null, "
            "\"prefill_left_visible\": null, \"prefill_right_visible\": null, "
            "\"token_to_req_indices\": [], \"is_valid_token\": [], \"tile_schedulers\": [], "
            "\"prefill_chunk_plans\": []}");
}

TEST(MetadataJson, InconsistentViewsAreAnErrorNotAnOverread) {
  std::vector<int32_t> rows(8, -1), lens = {9};  // lens > width
  std::vector<int32_t> t2r = {0};
  std::vector<uint8_t> valid = {1};
  SwaMetadata md;
  md.num_reqs = 1;
  md.num_tokens = md.num_decode_tokens = md.num_decodes = 1;
  md.token_to_req_indices = t2r;
  md.is_valid_token = valid;
  md.decode_swa = {rows.data(), lens.data(), 1, 8, 8, 8, MemorySpace::kHost};
  auto out = metadata_to_json(md, {});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("metadata.decode_swa"), std::string::npos)
      << out.status().message();
  md.decode_swa.rows = 2;  // more rows than decode tokens
  lens = {1};
  out = metadata_to_json(md, {});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("inconsistent shapes"), std::string::npos);
}

TEST(DumpPythonStyle, MatchesJsonDumpsSeparatorsAndEscapes) {
  nlohmann::ordered_json v = nlohmann::ordered_json::object();
  v["b"] = nlohmann::ordered_json::array({1, -2, nlohmann::ordered_json::array()});
  v["a"] = nullptr;
  v["t"] = true;
  v["s"] = "caf\xc3\xa9 \"q\"";
  v["o"] = nlohmann::ordered_json::object();
  EXPECT_EQ(dump_python_style(v),
            "{\"b\": [1, -2, []], \"a\": null, \"t\": true, \"s\": \"caf\\u00e9 \\\"q\\\"\", "
            "\"o\": {}}");
}

// The fields of vLLM 0.33's rules (docs/semantics.md#batch-files): read, strictly typed,
// written back only when they differ from the default, and replay_start printed when given.
TEST(BatchJsonNewerFields, ReadWrittenAndTyped) {
  Json doc = base_doc();
  doc["config"]["model_runner_v2"] = true;
  doc["config"]["widen_image_spans"] = false;
  doc["config"]["flashinfer_decode_lens"] = true;
  doc["batch"]["replay_start"] = {0, 2, 5};
  auto file = parse_batch_file(doc.dump());
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_TRUE(file->config.model_runner_v2);
  EXPECT_FALSE(file->config.widen_image_spans);
  EXPECT_TRUE(file->config.flashinfer_decode_lens);
  EXPECT_EQ(file->replay_start, (std::vector<int32_t>{0, 2, 5}));
  const nlohmann::ordered_json written = batch_file_to_json(file.value());
  EXPECT_EQ(written["config"]["model_runner_v2"], true);
  EXPECT_EQ(written["batch"]["replay_start"], Json({0, 2, 5}));
  auto again = parse_batch_file(written.dump());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(batch_file_to_json(again.value()), written);
  auto out = build_json(file.value());
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(Json::parse(out->dump())["replay_start"], Json({0, 2, 5}));
  // Without them: the reference's keys only, none of the new ones written.
  auto plain = parse_batch_file(base_doc().dump());
  ASSERT_TRUE(plain.ok());
  const nlohmann::ordered_json plain_written = batch_file_to_json(plain.value());
  EXPECT_FALSE(plain_written["config"].contains("model_runner_v2"));
  EXPECT_FALSE(plain_written["batch"].contains("replay_start"));
  EXPECT_FALSE(Json::parse(build_json(plain.value())->dump()).contains("replay_start"));

  doc = base_doc();
  doc["config"]["model_runner_v2"] = 1;
  EXPECT_EQ(parse_message(doc), "config.model_runner_v2: expected true or false, got 1");
  doc = base_doc();
  doc["batch"]["replay_start"] = {0, "2", 5};
  EXPECT_EQ(parse_message(doc), "batch.replay_start[1]: expected an integer, got \"2\"");
  doc = base_doc();
  doc["batch"]["replay_start"] = 3;
  EXPECT_EQ(parse_message(doc), "batch.replay_start: expected an array, got 3");
}

}  // namespace
}  // namespace sparse_swa
