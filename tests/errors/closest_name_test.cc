// SPDX-License-Identifier: Apache-2.0
// closest_name(): the "did you mean" hint of unknown-field errors (batch files and Python).
#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "sparse_swa/status.h"

namespace sparse_swa {
namespace {

constexpr std::string_view kNames[] = {"window_size",   "block_size", "max_num_seqs",
                                       "max_model_len", "seq_lens",   "image_spans"};

TEST(ClosestName, TyposFindTheirField) {
  EXPECT_EQ(closest_name("windw_size", kNames), "window_size");   // one deletion
  EXPECT_EQ(closest_name("window_szie", kNames), "window_size");  // a swap: two edits
  EXPECT_EQ(closest_name("blocksize", kNames), "block_size");
  EXPECT_EQ(closest_name("seq_len", kNames), "seq_lens");
  EXPECT_EQ(closest_name("image_span", kNames), "image_spans");
  EXPECT_EQ(closest_name("max_num_seq", kNames), "max_num_seqs");
  EXPECT_EQ(closest_name("window_size", kNames), "window_size");  // a known name is its own
}

TEST(ClosestName, NothingCloseGivesNoHint) {
  EXPECT_EQ(closest_name("temperature", kNames), "");
  EXPECT_EQ(closest_name("", kNames), "");
  EXPECT_EQ(closest_name("x", kNames), "");
  EXPECT_EQ(closest_name("WINDOW_SIZE", kNames), "");  // case counts: 10 edits
  EXPECT_EQ(closest_name("window_size", {}), "");
  EXPECT_EQ(closest_name(std::string(1000, 'a'), kNames), "");
}

TEST(ClosestName, AllowanceGrowsWithTheLength) {
  // Up to max(2, longer / 3) edits: 3 for 11-character names, 2 for short ones.
  EXPECT_EQ(closest_name("wndw_sze", kNames), "window_size");  // 3 edits of 11
  EXPECT_EQ(closest_name("wndw_s", kNames), "");               // 5 edits
  constexpr std::string_view kShort[] = {"ab"};
  EXPECT_EQ(closest_name("xy", kShort), "ab");  // 2 edits: the floor
  EXPECT_EQ(closest_name("xyz", kShort), "");   // 3 edits of a 3-character name
}

}  // namespace
}  // namespace sparse_swa
