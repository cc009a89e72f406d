// SPDX-License-Identifier: Apache-2.0
// The batch-file reader's resource limits (json/batch_json.h): a file larger than
// kMaxBatchFileBytes and JSON nested deeper than kMaxJsonDepth are INVALID_ARGUMENT before the
// text is parsed (a file's size before it is read).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "json/batch_json.h"
#include "support/status_matchers.h"

namespace sparse_swa {
namespace {

using testing::IsInvalidArgument;

std::string nested(int depth) {
  return "{\"config\": " + std::string(depth - 1, '[') + std::string(depth - 1, ']') + "}";
}

TEST(ResourceLimits, NestingPastTheDepthLimitIsAnErrorBeforeParsing) {
  // Depth 64 passes the limit (and fails on the missing batch); 65 is the limit's error, at the
  // bracket that passes it.
  EXPECT_TRUE(IsInvalidArgument(parse_batch_file(nested(kMaxJsonDepth)).status(),
                                {"batch: expected an object, got nothing"}));
  EXPECT_TRUE(IsInvalidArgument(parse_batch_file(nested(kMaxJsonDepth + 1)).status(),
                                {"batch file: JSON nested deeper than 64 levels (at byte 74)"}));
  // A million unclosed brackets: rejected at the 65th, not parsed into a million values.
  EXPECT_TRUE(IsInvalidArgument(parse_batch_file(std::string(1 << 20, '[')).status(),
                                {"JSON nested deeper than 64 levels (at byte 64)"}));
  // Brackets inside strings (escaped quotes included) are not nesting.
  const std::string in_strings = "{\"config\": {\"note\": \"" + std::string(100, '[') + "\\\"" +
                                 std::string(100, '{') + "\"}}";
  const Status s = parse_batch_file(in_strings).status();
  EXPECT_EQ(s.message().find("nested deeper"), std::string::npos) << s.to_string();
}

TEST(ResourceLimits, TextOverTheSizeLimitIsAnError) {
  // A string of limit + 1 bytes would be 256 MiB; a view of one is enough (never read).
  const std::string small = "{}";
  const std::string_view huge(small.data(), kMaxBatchFileBytes + 1);
  EXPECT_TRUE(IsInvalidArgument(
      parse_json_text(huge, "x.json").status(),
      {"x.json: 268435457 bytes, more than the batch file limit of 268435456 bytes (256 MiB)"}));
}

TEST(ResourceLimits, FileOverTheSizeLimitIsRejectedFromItsSize) {
  // A sparse file: 256 MiB + 1 bytes of size, no data written, and none read.
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / "sparse_swa_resource_limits_huge.json";
  { std::ofstream(path) << ""; }
  std::filesystem::resize_file(path, kMaxBatchFileBytes + 1);
  const Status s = read_batch_file(path.string()).status();
  std::filesystem::remove(path);
  EXPECT_TRUE(IsInvalidArgument(s, {path.string() + ": 268435457 bytes, more than the batch file "
                                                    "limit of 268435456 bytes (256 MiB)"}));
}

TEST(ResourceLimits, ParseJsonTextReportsNumbersPastTheDoubleRange) {
  EXPECT_TRUE(IsInvalidArgument(parse_json_text("{\"a\": 1e999}", "c.json").status(),
                                {"c.json: malformed JSON", "number overflow"}));
  auto ok = parse_json_text("{\"a\": [1, 2]}", "c.json");
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok.value()["a"][1], 2);
}

}  // namespace
}  // namespace sparse_swa
