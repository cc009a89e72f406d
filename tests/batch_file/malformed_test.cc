// SPDX-License-Identifier: Apache-2.0
// Malformed batches and configs through the path of `sparse-swa build` (JSON reader, config
// validation, CPU builder, chunk plans), table-driven: every case must give the right status
// code and a message that starts with the field and names it (docs/errors.md). Also the integer
// overflow edges (slot ids, block ids * block size, seq_lens near INT32_MAX, W + Mi, buffer
// sizes, the chunk-plan area), JSON oddities (NaN / inf / huge numbers, deep nesting, duplicate
// keys, invalid UTF-8) and the valid corner cases next to them (empty arrays, empty batch).
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "json/batch_json.h"
#include "sparse_swa/metadata_builder.h"
#include "support/status_matchers.h"
#include "testing/batch_run.h"

namespace sparse_swa {
namespace {

using Json = nlohmann::json;

// MTP k = 1 (theta 2), W = 8, B = 4, Mi = 4: two decodes (positions 10 and 4..5) and a prefill
// (positions 6..9) with an image span [6, 8].
const char* const kBase = R"({
 "config": {"window_size": 8, "block_size": 4, "max_num_batched_tokens": 64, "max_num_seqs": 8,
            "max_model_len": 64, "num_speculative_tokens": 1, "speculative_method": "mtp",
            "parallel_drafting": false, "max_image_tokens": 4, "compress_ratios": [1, 4]},
 "batch": {"query_start_loc": [0, 1, 3, 7], "seq_lens": [11, 6, 10],
           "block_table": [[7, 3, 9, 2], [5, 11, 6, 0], [1, 4, 8, 0]],
           "slot_mapping": [38, 44, 45, 18, 19, 32, 33], "causal": true,
           "image_spans": {"2": [[6, 8]]}},
 "chunk_plan_requests": [{"compress_ratio": 1, "chunk_size": 4},
                         {"compress_ratio": 4, "chunk_size": 4}]})";

// What `sparse-swa build` does with a file's text; the first error, or OK.
Status run_text(const std::string& text) { return testing::run_batch_text(text).status(); }

// One edit of the base document: a JSON pointer and its new value (or removal).
struct Edit {
  std::string pointer;
  Json value;
  bool remove = false;
};
Edit erase(std::string pointer) { return {std::move(pointer), nullptr, true}; }

std::string edited(const std::vector<Edit>& edits) {
  Json doc = Json::parse(kBase);
  for (const Edit& e : edits) {
    const Json::json_pointer p(e.pointer);
    if (e.remove) {
      doc[p.parent_pointer()].erase(p.back());
    } else {
      doc[p] = e.value;
    }
  }
  return doc.dump();
}

struct Case {
  const char* name;
  std::vector<Edit> edits;
  std::vector<std::string> fragments;  // in order; the first is the field the message starts with
};

constexpr int64_t kI32Max = INT32_MAX;
constexpr int64_t kI32Min = INT32_MIN;

// Every case is INVALID_ARGUMENT.
const std::vector<Case>& cases() {
  static const auto* all = new std::vector<Case>{
      // Negative values everywhere.
      {"NegativeWindow", {{"/config/window_size", -1}}, {"config.window_size", ">= 1", "-1"}},
      {"NegativeBlockSize", {{"/config/block_size", -4}}, {"config.block_size", ">= 1", "-4"}},
      {"NegativeMaxTokens",
       {{"/config/max_num_batched_tokens", -5}},
       {"config.max_num_batched_tokens", ">= 1", "-5"}},
      {"NegativeMaxSeqs", {{"/config/max_num_seqs", -1}}, {"config.max_num_seqs", ">= 1", "-1"}},
      {"NegativeMaxModelLen",
       {{"/config/max_model_len", kI32Min}},
       {"config.max_model_len", ">= 1", "-2147483648"}},
      {"NegativeSpecTokens",
       {{"/config/num_speculative_tokens", -3}},
       {"config.num_speculative_tokens", ">= 0", "-3"}},
      {"NegativeImageTokens",
       {{"/config/max_image_tokens", -1}},
       {"config.max_image_tokens", ">= 0", "-1"}},
      {"NegativeCompressRatio",
       {{"/config/compress_ratios", {1, -4}}},
       {"config.compress_ratios[1]", "{1, 2, 4, 128}", "-4"}},
      {"NegativeFirstQueryStart",
       {{"/batch/query_start_loc", {-1, 1, 3, 7}}},
       {"batch.query_start_loc[0]", "expected 0", "-1"}},
      {"NegativeQueryStart",
       {{"/batch/query_start_loc", {0, -1, 3, 7}}},
       {"batch.query_start_loc[1]", "non-decreasing", "-1"}},
      {"Int32MinQueryStart",
       {{"/batch/query_start_loc", {0, 1, kI32Min, 7}}},
       {"batch.query_start_loc[2]", "-2147483648"}},
      {"NegativeSeqLen",
       {{"/batch/seq_lens", {-11, 6, 10}}},
       {"batch.seq_lens[0]", ">= the query length 1", "-11"}},
      {"Int32MinSeqLen",
       {{"/batch/seq_lens", {11, kI32Min, 10}}},
       {"batch.seq_lens[1]", ">= the query length 2", "-2147483648"}},
      {"NegativeBlockIdInWindow",
       {{"/batch/block_table/0/2", -7}},
       {"batch.block_table[0][2]", "block id >= 0", "-7"}},
      {"Int32MinBlockId",
       {{"/batch/block_table/2/1", kI32Min}},
       {"batch.block_table[2][1]", "block id >= 0", "-2147483648"}},
      {"NegativeSlot",
       {{"/batch/slot_mapping/3", -5}},
       {"batch.slot_mapping[3]", ">= 0 or -1", "-5"}},
      {"Int64MinSlot",
       {{"/batch/slot_mapping/0", INT64_MIN}},
       {"batch.slot_mapping[0]", "-9223372036854775808"}},
      {"NegativeSpanStart",
       {{"/batch/image_spans/2", {{-3, 1}}}},
       {"batch.image_spans[0]", "0 <= start <= end", "[-3, 1]"}},
      {"NegativeSpanKey",
       {{"/batch/image_spans", {{"-1", {{0, 1}}}}}},
       {"batch.image_spans[\"-1\"]", "request index in [0, 3)", "-1"}},
      {"NegativeChunkSize",
       {{"/chunk_plan_requests/0/chunk_size", -4}},
       {"chunk_plan_requests[0].chunk_size", ">= 1", "-4"}},
      {"NegativeChunkRatio",
       {{"/chunk_plan_requests/1/compress_ratio", -4}},
       {"chunk_plan_requests[1].compress_ratio", "{1, 2, 4, 128}", "-4"}},

      // Empty arrays.
      {"EmptyQueryStartLoc",
       {{"/batch/query_start_loc", Json::array()}},
       {"batch.query_start_loc", "num_reqs + 1 = 4", "got 0"}},
      {"EmptySeqLens",
       {{"/batch/seq_lens", Json::array()}, {"/batch/image_spans", Json::object()}},
       {"batch.query_start_loc", "num_reqs + 1 = 1", "got 4"}},
      {"EmptyBlockTable",
       {{"/batch/block_table", Json::array()}},
       {"batch.block_table", "at least num_reqs = 3 rows", "got 0"}},
      {"EmptyBlockTableRows",
       {{"/batch/block_table", {Json::array(), Json::array(), Json::array()}}},
       {"batch.block_table[0]", "= 3 entries", "got 0"}},
      {"EmptySlotMapping",
       {{"/batch/slot_mapping", Json::array()}},
       {"batch.slot_mapping", "at least query_start_loc[3] = 7 tokens", "got 0"}},
      {"EmptySpan",
       {{"/batch/image_spans/2", {Json::array()}}},
       {"batch.image_spans[\"2\"][0]", "[start, end]", "[]"}},

      // Integer overflow: slot ids and positions must fit int32, sizes must fit the buffers.
      {"SlotIdPastInt32",
       {{"/batch/block_table/0/2", 1 << 29}},
       {"batch.block_table[0][2]", "536870912", "overflows an int32 slot id"}},
      {"BlockIdTimesBlockSizePastInt32",
       {{"/config/block_size", kI32Max},
        {"/batch/block_table", Json::parse("[[7], [5], [1]]")},
        {"/batch/image_spans", Json::object()}},
       {"batch.block_table[0][0]", "block id 7 * block_size 2147483647", "int32 slot id"}},
      {"BlockIdOneTimesHugeBlockSize",
       {{"/config/block_size", 1 << 30},
        {"/batch/block_table", Json::parse("[[2], [0], [0]]")},
        {"/batch/image_spans", Json::object()}},
       {"batch.block_table[0][0]", "block id 2 * block_size 1073741824", "int32 slot id"}},
      {"SeqLenInt32MaxNeedsHugeTable",
       {{"/batch/seq_lens", {kI32Max, 6, 10}}},
       {"batch.block_table[0]", "ceil(2147483647 / 4) = 536870912 entries", "got 4"}},
      {"QueryStartInt32Max",
       {{"/batch/query_start_loc", {0, 1, 3, kI32Max}}, {"/batch/seq_lens", {11, 6, kI32Max}}},
       {"batch.slot_mapping", "query_start_loc[3] = 2147483647 tokens", "got 7"}},
      {"WindowPlusImageTokensOverflow",
       {{"/config/window_size", kI32Max}, {"/config/max_image_tokens", kI32Max}},
       {"config", "must be <= 16777216", "got 4294967294"}},
      {"SpeculativeTokensInt32Max",
       {{"/config/num_speculative_tokens", kI32Max},
        {"/config/speculative_method", "dspark"},
        {"/config/parallel_drafting", true}},
       {"config", "decode threshold", "must be <= 16777216"}},
      {"HugeTokensTimesWidth",
       {{"/config/max_num_batched_tokens", kI32Max}},
       {"config.max_num_batched_tokens", "2147483647 rows of width 64", "index buffer limit"}},
      {"MaxModelLenPastInt32",
       {{"/config/max_model_len", int64_t{1} << 31}},
       {"config.max_model_len", "an int32 integer", "2147483648"}},
      {"ChunkSizePastInt32",
       {{"/chunk_plan_requests/0/chunk_size", int64_t{1} << 31}},
       {"chunk_plan_requests[0].chunk_size", "an int32 integer", "2147483648"}},
      {"SlotPastInt64",
       {{"/batch/slot_mapping/0", uint64_t{1} << 63}},
       {"batch.slot_mapping[0]", "an int64 integer", "9223372036854775808"}},
      {"SeqLenPastUint64",
       {{"/batch/seq_lens/0", 1e20}},
       {"batch.seq_lens[0]", "an integer", "1e+20"}},

      // Wrong JSON types.
      {"NullInteger",
       {{"/config/window_size", nullptr}},
       {"config.window_size", "integer", "null"}},
      {"BoolInteger", {{"/config/block_size", true}}, {"config.block_size", "integer", "true"}},
      {"FloatInteger", {{"/config/max_num_seqs", 1.0}}, {"config.max_num_seqs", "integer", "1.0"}},
      {"ObjectInteger",
       {{"/batch/seq_lens/1", {{"x", 1}}}},
       {"batch.seq_lens[1]", "integer", "an object with 1 keys"}},
      {"StringBool", {{"/batch/causal", "true"}}, {"batch.causal", "true or false", "\"true\""}},
      {"MethodCase",
       {{"/config/speculative_method", "MTP"}},
       {"config.speculative_method", "none, mtp, dspark", "\"MTP\""}},
      {"EmptyMethod",
       {{"/config/speculative_method", ""}},
       {"config.speculative_method", "none, mtp, dspark", "\"\""}},
      {"ChunkRequestNotObject",
       {{"/chunk_plan_requests/1", {4, 4}}},
       {"chunk_plan_requests[1]", "an object", "an array of 2 elements"}},
      {"MissingBlockTable",
       {erase("/batch/block_table")},
       {"batch.block_table", "an array of rows", "required"}},
      {"MissingSlotMapping", {erase("/batch/slot_mapping")}, {"batch.slot_mapping", "required"}},
      {"MissingMaxModelLen",
       {erase("/config/max_model_len")},
       {"config.max_model_len", "required"}},

      // Semantics the builder rejects.
      {"SpanPastSeqLenOfItsRequest",
       {{"/batch/image_spans", {{"1", {{4, 6}}}}}},
       {"batch.image_spans[0]", "end < seq_lens[1] = 6", "[4, 6]"}},
      {"NonCausalWithMtp", {{"/batch/causal", false}}, {"batch.causal", "dspark", "mtp"}},
      {"PaddingWithSlot",
       {{"/batch/slot_mapping", {38, 44, 45, 18, 19, 32, 33, -1, 0}}},
       {"batch.slot_mapping[8]", "CUDA-graph padding", "got 0"}},
      {"QueryPastSeqLen",
       {{"/batch/seq_lens", {11, 6, 3}}},
       {"batch.seq_lens[2]", ">= the query length 4", "got 3"}},
      {"TooManyRequests",
       {{"/config/max_num_seqs", 2}},
       {"batch.seq_lens", "max_num_seqs = 2", "got 3"}},
  };
  return *all;
}

// gtest prints a parameter in failure messages and ctest names: the case name, not its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class Malformed : public ::testing::TestWithParam<Case> {};

TEST_P(Malformed, GivesInvalidArgumentNamingTheField) {
  const Case& c = GetParam();
  const Status s = run_text(edited(c.edits));
  EXPECT_TRUE(testing::IsInvalidArgument(s, {c.fragments.begin(), c.fragments.end()}));
  EXPECT_EQ(s.message().rfind(c.fragments.front(), 0), 0u)
      << "the message should start with the field: " << s.message();
}

INSTANTIATE_TEST_SUITE_P(Cases, Malformed, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.name);
                         });

// ---------------------------------------------------------------- raw JSON text

struct TextCase {
  const char* name;
  std::string text;
  std::vector<std::string> fragments;
};

std::string nested(int depth, const std::string& inner) {
  return std::string(depth, '[') + inner + std::string(depth, ']');
}

std::string with_config(const std::string& config_text) {
  std::string base = Json::parse(kBase).dump();
  const std::string batch = Json::parse(kBase)["batch"].dump();
  return "{\"config\": " + config_text + ", \"batch\": " + batch + "}";
}

std::string base_with(const std::string& from, const std::string& to) {
  std::string text = Json::parse(kBase).dump();
  const size_t at = text.find(from);
  if (at == std::string::npos) throw std::runtime_error("no " + from + " in the base batch");
  return text.replace(at, from.size(), to);
}

const std::vector<TextCase>& text_cases() {
  static const auto* all = new std::vector<TextCase>{
      {"Empty", "", {"batch file: malformed JSON", "unexpected end of input"}},
      {"Whitespace", " \n\t ", {"batch file: malformed JSON"}},
      {"NaNLiteral",
       base_with("\"window_size\":8", "\"window_size\":NaN"),
       {"batch file: malformed JSON", "syntax error"}},
      {"InfinityLiteral",
       base_with("\"window_size\":8", "\"window_size\":Infinity"),
       {"batch file: malformed JSON", "syntax error"}},
      {"TrailingGarbage", Json::parse(kBase).dump() + " x", {"batch file: malformed JSON"}},
      {"TwoDocuments",
       Json::parse(kBase).dump() + Json::parse(kBase).dump(),
       {"batch file: malformed JSON"}},
      {"TrailingComma",
       base_with("\"causal\":true", "\"causal\":true,"),
       {"batch file: malformed JSON"}},
      {"Truncated", Json::parse(kBase).dump().substr(0, 100), {"batch file: malformed JSON"}},
      {"NulByte", std::string("{\"config\"\0:", 11), {"batch file: malformed JSON"}},
      // Past the reader's depth limit (kMaxJsonDepth): rejected before parsing.
      {"DeeplyNestedConfig",
       with_config(nested(200000, "")),
       {"batch file", "JSON nested deeper than 64 levels"}},
      {"DeeplyNestedSeqLen",
       base_with("\"seq_lens\":[11,", "\"seq_lens\":[" + nested(100000, "11") + ","),
       {"batch file", "JSON nested deeper than 64 levels"}},
      {"DeeplyNestedUnclosed",
       with_config(std::string(100000, '{')),
       {"batch file", "JSON nested deeper than 64 levels"}},
      {"NestedToTheLimit",
       with_config(nested(63, "")),  // 64 levels with the root object
       {"config", "an object", "an array of 1 elements"}},
      {"HugeFloat",
       base_with("\"window_size\":8", "\"window_size\":1e308"),
       {"config.window_size", "an integer", "1e+308"}},
      {"NegativePastInt64",
       base_with("\"block_size\":4", "\"block_size\":-9223372036854775809"),
       {"config.block_size", "an integer"}},
      {"LongDigitString",
       base_with("\"block_size\":4", "\"block_size\":" + std::string(300, '9')),
       {"config.block_size", "an integer"}},
  };
  return *all;
}

void PrintTo(const TextCase& c, std::ostream* os) { *os << c.name; }

class MalformedText : public ::testing::TestWithParam<TextCase> {};

TEST_P(MalformedText, GivesInvalidArgumentNamingTheField) {
  const TextCase& c = GetParam();
  const Status s = run_text(c.text);
  EXPECT_TRUE(testing::IsInvalidArgument(s, {c.fragments.begin(), c.fragments.end()}));
  EXPECT_EQ(s.message().rfind(c.fragments.front(), 0), 0u) << s.message();
  EXPECT_LT(s.message().size(), 400u) << "messages stay short whatever the input";
}

INSTANTIATE_TEST_SUITE_P(Cases, MalformedText, ::testing::ValuesIn(text_cases()),
                         [](const ::testing::TestParamInfo<TextCase>& info) {
                           return std::string(info.param.name);
                         });

// A number past the double range: nlohmann throws out_of_range (not a parse_error) and the
// reader must turn it into a Status like any malformed JSON, not let the exception escape.
TEST(MalformedJson, NumberPastTheDoubleRangeIsAnError) {
  for (const char* number : {"1e999", "-1e999", "1e520"}) {
    const std::string text =
        base_with("\"window_size\":8", std::string("\"window_size\":") + number);
    Status s;
    try {
      s = run_text(text);
    } catch (const std::exception& e) {
      ADD_FAILURE() << number << ": parse_batch_file threw " << e.what();
      continue;
    }
    EXPECT_TRUE(testing::IsInvalidArgument(s, {"batch file", number})) << number;
  }
}

// Messages go to logs, terminals and Python str: valid UTF-8 without control characters,
// whatever bytes the input held.
bool printable_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char ch = static_cast<unsigned char>(s[i]);
    if (ch < 0x20 || ch == 0x7f) return false;
    const int extra = ch < 0x80         ? 0
                      : (ch >> 5) == 6  ? 1
                      : (ch >> 4) == 14 ? 2
                      : (ch >> 3) == 30 ? 3
                                        : -1;
    if (extra < 0 || i + extra >= s.size()) return false;
    for (int k = 1; k <= extra; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
    }
    i += 1 + extra;
  }
  return true;
}

TEST(MalformedJson, MessagesArePrintableUtf8) {
  const std::vector<std::string> texts = {
      "{\"config\": {\"window_size\": 8, \"\xff\": 1}}",
      "{\"config\": {\"speculative_method\": \"\xc3\x28\"}}",
      base_with("\"speculative_method\":\"mtp\"", "\"speculative_method\":\"m\\ntp\\u0007\""),
  };
  for (const std::string& text : texts) {
    const Status s = run_text(text);
    ASSERT_FALSE(s.ok());
    EXPECT_TRUE(printable_utf8(s.message())) << "raw input bytes in: " << s.message();
  }
}

// An unknown method is quoted in full today: a megabyte-long string gives a megabyte message.
TEST(MalformedJson, LongStringsAreTruncatedInMessages) {
  const std::string text = base_with("\"speculative_method\":\"mtp\"",
                                     "\"speculative_method\":\"" + std::string(100000, 'x') + "\"");
  const Status s = run_text(text);
  EXPECT_TRUE(testing::IsInvalidArgument(s, {"config.speculative_method"}));
  EXPECT_LT(s.message().size(), 400u);
}

// Duplicate keys: the last one wins, as in Python's json (the reference script's reader), so a
// file means the same to both tools.
TEST(MalformedJson, DuplicateKeysTakeTheLastValueLikePython) {
  const std::string good_last =
      base_with("\"window_size\":8", "\"window_size\":0,\"window_size\":8");
  SPARSE_SWA_EXPECT_OK(run_text(good_last));
  const std::string bad_last =
      base_with("\"window_size\":8", "\"window_size\":8,\"window_size\":0");
  EXPECT_TRUE(testing::IsInvalidArgument(run_text(bad_last), {"config.window_size", "got 0"}));
  const std::string two_batches = Json::parse(kBase).dump();
  const std::string doubled =
      two_batches.substr(0, two_batches.size() - 1) + ",\"batch\":{\"seq_lens\":[]}}";
  EXPECT_TRUE(testing::IsInvalidArgument(run_text(doubled), {"batch.query_start_loc", "required"}));
}

// read_batch_file (the CLI's reader): messages start with the path instead of "batch file".
TEST(MalformedJson, FileMessagesStartWithThePath) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / "sparse_swa_malformed_test.json";
  std::ofstream(path) << "{\"config\": [}";
  const auto file = read_batch_file(path.string());
  EXPECT_TRUE(testing::IsInvalidArgument(file.status(), {path.string() + ": malformed JSON"}));
  std::filesystem::remove(path);
}

// ---------------------------------------------------------------- valid corners

TEST(MalformedNeighbours, EmptyArraysThatAreValid) {
  // An empty step, absent or empty optional fields: all fine.
  SPARSE_SWA_EXPECT_OK(run_text(edited({{"/batch/query_start_loc", {0}},
                                        {"/batch/seq_lens", Json::array()},
                                        {"/batch/block_table", Json::array()},
                                        {"/batch/slot_mapping", Json::array()},
                                        {"/batch/image_spans", Json::object()}})));
  SPARSE_SWA_EXPECT_OK(run_text(edited({{"/config/compress_ratios", Json::array()},
                                        {"/batch/image_spans", {{"2", Json::array()}}},
                                        {"/chunk_plan_requests", Json::array()}})));
  // Padding only: T = 3 tokens past query_start_loc[0] = 0, no requests.
  SPARSE_SWA_EXPECT_OK(run_text(edited({{"/batch/query_start_loc", {0}},
                                        {"/batch/seq_lens", Json::array()},
                                        {"/batch/block_table", Json::array()},
                                        {"/batch/slot_mapping", {-1, -1, -1}},
                                        {"/batch/image_spans", Json::object()}})));
}

TEST(MalformedNeighbours, NegativeBlockIdsOutsideEveryWindowAreFine) {
  // Request 0 reads positions [3, 11): pages 0..2; page 3 is never read (and is a padding id).
  SPARSE_SWA_EXPECT_OK(run_text(edited({{"/batch/block_table/0/3", -1}})));
}

TEST(MalformedNeighbours, SlotsPastInt32InSlotMappingAreOnlyValidity) {
  // slot_mapping is int64 and only its sign matters to the metadata.
  SPARSE_SWA_EXPECT_OK(run_text(edited({{"/batch/slot_mapping/0", int64_t{1} << 40}})));
}

// A decode token at position INT32_MAX - 1 with B = 2^30: the window, its slots and the gather
// lengths are all at the edge of int32 and must come out exact.
TEST(Int32Edges, SequenceEndingAtInt32Max) {
  BuilderConfig c;
  c.window_size = 8;
  c.block_size = 1 << 30;
  c.max_num_batched_tokens = 16;
  c.max_num_seqs = 2;
  c.max_model_len = INT32_MAX;
  auto builder = testing::cpu_builder(c);
  const std::vector<int32_t> qsl = {0, 1, 5};
  const std::vector<int32_t> seq = {INT32_MAX, INT32_MAX};
  const std::vector<int32_t> table = {0, 1, 1, 0};  // [2, 2]
  const int64_t last = INT32_MAX - 1;               // position of request 0's token
  std::vector<int64_t> slots = {int64_t{1} * (1 << 30) + last % (1 << 30)};
  for (int64_t p = INT32_MAX - 4; p < INT32_MAX; ++p) slots.push_back(p % (1 << 30));
  BatchInput b;
  b.query_start_loc = qsl;
  b.seq_lens = seq;
  b.block_table = {table.data(), 2, 2, 2};
  b.slot_mapping = slots;
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(b, &md));
  ASSERT_EQ(md.num_decode_tokens, 1);
  ASSERT_EQ(md.num_prefill_tokens, 4);
  EXPECT_EQ(md.decode_swa.lens[0], 8);
  EXPECT_EQ(md.decode_swa.row(0)[7], INT32_MAX - 1);  // page 1 * 2^30 + (2^30 - 2)
  EXPECT_EQ(md.decode_swa.row(0)[0], INT32_MAX - 8);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(md.prefill_swa.lens[i], 8) << i;
    EXPECT_EQ(md.prefill_swa.row(i)[7], (INT32_MAX - 4 + i) % (1 << 30)) << i;  // page 0
  }
  ASSERT_EQ(md.prefill_gather_lens.size(), 1u);
  EXPECT_EQ(md.prefill_gather_lens[0], 4 + 7);
  auto plan = prefill_chunk_plan(md, 128, 4);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  ASSERT_EQ(plan->size(), 1u);
  EXPECT_EQ((*plan)[0].compressed_width, INT32_MAX / 128);
}

// A valid chunk_size whose area budget passes int64: the budget is then effectively unlimited
// (one chunk holds every prefill request) or an error naming chunk_size; it must not wrap into a
// negative budget (signed overflow, caught by UBSan in the sanitizer build).
TEST(Int64Edges, ChunkPlanAreaPastInt64) {
  BuilderConfig c;
  c.window_size = 8;
  c.block_size = 4;
  c.max_num_batched_tokens = 64;
  c.max_num_seqs = 4;
  c.max_model_len = 64;
  auto builder = testing::cpu_builder(c);
  const std::vector<int32_t> qsl = {0, 4, 8, 12};
  const std::vector<int32_t> seq = {10, 12, 9};
  const std::vector<int32_t> table = {0, 1, 2, 3, 4, 5, 6, 7, 8};  // [3, 3]
  std::vector<int64_t> slots(12, 0);
  BatchInput b;
  b.query_start_loc = qsl;
  b.seq_lens = seq;
  b.block_table = {table.data(), 3, 3, 3};
  b.slot_mapping = slots;
  SwaMetadata md;
  SPARSE_SWA_ASSERT_OK(builder->build(b, &md));
  ASSERT_EQ(md.num_prefills, 3);
  for (int64_t chunk_size : {int64_t{1} << 62, INT64_MAX}) {
    auto plan = prefill_chunk_plan(md, 4, chunk_size);
    if (!plan.ok()) {
      EXPECT_TRUE(testing::IsInvalidArgument(plan.status(), {"chunk_plan.chunk_size"}));
      continue;
    }
    ASSERT_EQ(plan->size(), 1u) << "chunk_size " << chunk_size << " gave " << plan->size()
                                << " chunks: the area budget wrapped around";
    EXPECT_EQ((*plan)[0].end, 3);
  }
}

}  // namespace
}  // namespace sparse_swa
