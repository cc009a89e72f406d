// SPDX-License-Identifier: Apache-2.0
// `sparse-swa build --consumer NAME`: the consumer JSON (tools/json/consumer_json.h) on the
// shipped batch files, through the same calls the CLI makes (read_batch_file, a CPU builder,
// consumer_to_json). Expected values are the golden vectors of
// docs/semantics.md#example-1-mixed-mtp-batch (SWA-only layer) and of example 6 (bounded replay),
// written out by hand; error paths check the message text.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "json/batch_json.h"
#include "json/consumer_json.h"
#include "sparse_swa/dispatch_policy.h"
#include "sparse_swa/metadata_builder.h"
#include "support/source_tree.h"
#include "support/status_matchers.h"

namespace sparse_swa {
namespace {

using testing::IsInvalidArgument;
using Json = nlohmann::ordered_json;
using Row = std::vector<int32_t>;

Row ints(const Json& j) { return j.get<Row>(); }

Row padded(Row values, size_t width) {
  values.resize(width, -1);
  return values;
}

// One batch file built the way `sparse-swa build` builds it on the CPU backend.
class ConsumerJson : public ::testing::Test {
 protected:
  void Load(const std::string& name) {
    // An example batch file (examples/batches), else a test input (tests/data).
    const std::filesystem::path example = testing::examples_dir() / name;
    auto file = read_batch_file(std::filesystem::exists(example)
                                    ? example.string()
                                    : (testing::test_data_dir() / name).string());
    SPARSE_SWA_ASSERT_OK(file.status());
    file_ = std::move(file).value();
    auto builder = MetadataBuilder::create(file_.config, Backend::kCpu);
    SPARSE_SWA_ASSERT_OK(builder.status());
    builder_ = std::move(builder).value();
    input_ = file_.batch_input();
    SPARSE_SWA_ASSERT_OK(builder_->build(input_, &md_));
  }
  StatusOr<Json> Consumer(const std::string& name, DeploymentShape shape = {}) {
    return consumer_to_json(name, file_.config, md_, input_, shape);
  }

  BatchFile file_;
  std::unique_ptr<MetadataBuilder> builder_;
  BatchInput input_;
  SwaMetadata md_;
};

TEST_F(ConsumerJson, KeysInContractOrder) {
  Load("mixed_mtp.json");
  auto c = Consumer("sparse_swa");
  SPARSE_SWA_ASSERT_OK(c.status());
  std::vector<std::string> keys;
  for (const auto& item : c->items()) keys.push_back(item.key());
  EXPECT_EQ(keys, std::vector<std::string>({"name", "policy", "note", "mixed", "ragged",
                                            "prefill_ragged", "combined_prefill", "dispatch"}));
  EXPECT_EQ((*c)["name"], "sparse_swa");
  EXPECT_NE((*c)["note"].get<std::string>().find("no indexer top-k"), std::string::npos);
}

// Example 1, FlashInfer SM100 mixed matrix of an SWA-only layer: S = 8, P = 0; lens 8 for all
// three decode rows although row 1 has -1 inside; the exact SWA counts beside them.
TEST_F(ConsumerJson, Example1MixedSwaOnly) {
  Load("mixed_mtp.json");
  auto c = Consumer("flashinfer_sm100");
  SPARSE_SWA_ASSERT_OK(c.status());
  const Json& mixed = (*c)["mixed"];
  EXPECT_EQ(mixed["width"], 8);
  EXPECT_EQ(mixed["swa_width"], 8);
  ASSERT_EQ(mixed["indices"].size(), 7u);
  EXPECT_EQ(ints(mixed["indices"][0]), Row({31, 12, 13, 14, 15, 36, 37, 38}));
  EXPECT_EQ(ints(mixed["indices"][1]), Row({20, 21, 22, 23, 44, -1, -1, -1}));
  EXPECT_EQ(ints(mixed["indices"][2]), Row({20, 21, 22, 23, 44, 45, -1, -1}));
  EXPECT_EQ(ints(mixed["indices"][3]), Row({4, 5, 6, 7, 16, 17, 18, -1}));
  EXPECT_EQ(ints(mixed["indices"][4]), Row({4, 5, 6, 7, 16, 17, 18, 19}));
  EXPECT_EQ(ints(mixed["indices"][5]), Row({5, 6, 7, 16, 17, 18, 19, 32}));
  EXPECT_EQ(ints(mixed["indices"][6]), Row({6, 7, 16, 17, 18, 19, 32, 33}));
  EXPECT_EQ(ints(mixed["lens"]), Row({8, 8, 8, 8, 8, 8, 8}));
  EXPECT_EQ(ints(mixed["swa_lens"]), Row({8, 5, 6, 7, 8, 8, 8}));
  EXPECT_EQ((*c)["policy"]["layout"], "mixed");
}

// Example 1, ROCm ragged of the decode rows; the prefill rows packed the same way.
TEST_F(ConsumerJson, Example1Ragged) {
  Load("mixed_mtp.json");
  auto c = Consumer("rocm_ragged");
  SPARSE_SWA_ASSERT_OK(c.status());
  EXPECT_EQ(ints((*c)["ragged"]["indptr"]), Row({0, 8, 13, 19}));
  EXPECT_EQ(ints((*c)["ragged"]["indices"]),
            Row({31, 12, 13, 14, 15, 36, 37, 38, 20, 21, 22, 23, 44, 20, 21, 22, 23, 44, 45}));
  EXPECT_EQ(ints((*c)["prefill_ragged"]["indptr"]), Row({0, 7, 15, 23, 31}));
  EXPECT_EQ(ints((*c)["prefill_ragged"]["indices"]), Row({4, 5, 6,  7,  16, 17, 18,      // pos 6
                                                          4, 5, 6,  7,  16, 17, 18, 19,  // pos 7
                                                          5, 6, 7,  16, 17, 18, 19, 32,  // pos 8
                                                          6, 7, 16, 17, 18, 19, 32, 33}));
}

// Example 1, FlashMLA prefill combine of an SWA-only layer: one chunk (0, 1, N 0, M 10),
// width round_up(0 + 8, 128) = 128, workspace rows = position - gather_start.
TEST_F(ConsumerJson, Example1CombinedPrefillSwaOnly) {
  Load("mixed_mtp.json");
  auto c = Consumer("flashmla_sparse_decode");
  SPARSE_SWA_ASSERT_OK(c.status());
  const Json& chunks = (*c)["combined_prefill"];
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(ints(chunks[0]["chunk"]), Row({0, 1, 0, 10}));
  EXPECT_EQ(chunks[0]["width"], 128);
  ASSERT_EQ(chunks[0]["rows"].size(), 4u);
  EXPECT_EQ(ints(chunks[0]["rows"][0]), padded({0, 1, 2, 3, 4, 5, 6}, 128));
  EXPECT_EQ(ints(chunks[0]["rows"][1]), padded({0, 1, 2, 3, 4, 5, 6, 7}, 128));
  EXPECT_EQ(ints(chunks[0]["rows"][2]), padded({1, 2, 3, 4, 5, 6, 7, 8}, 128));
  EXPECT_EQ(ints(chunks[0]["rows"][3]), padded({2, 3, 4, 5, 6, 7, 8, 9}, 128));
  EXPECT_EQ(ints(chunks[0]["lens"]), Row({7, 8, 8, 8}));
}

// Example 1 with two prefill requests in one chunk: request B (seq 3, query 3) is chunk
// request b = 1 with M = max(10, 3) = 10, so its rows start at workspace row 10.
TEST_F(ConsumerJson, TwoPrefillRequestsInOneChunk) {
  Load("consumer/two_prefills.json");
  auto c = Consumer("sparse_swa");
  SPARSE_SWA_ASSERT_OK(c.status());
  const Json& chunks = (*c)["combined_prefill"];
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(ints(chunks[0]["chunk"]), Row({0, 2, 0, 10}));
  ASSERT_EQ(chunks[0]["rows"].size(), 7u);
  EXPECT_EQ(ints(chunks[0]["rows"][3]), padded({2, 3, 4, 5, 6, 7, 8, 9}, 128));
  EXPECT_EQ(ints(chunks[0]["rows"][4]), padded({10}, 128));
  EXPECT_EQ(ints(chunks[0]["rows"][5]), padded({10, 11}, 128));
  EXPECT_EQ(ints(chunks[0]["rows"][6]), padded({10, 11, 12}, 128));
  EXPECT_EQ(ints(chunks[0]["lens"]), Row({7, 8, 8, 8, 1, 2, 3}));
  // B's SWA rows in block 10 (slots 40..42), in the mixed matrix and the prefill CSR.
  EXPECT_EQ(ints((*c)["mixed"]["indices"][9]), Row({40, 41, 42, -1, -1, -1, -1, -1}));
  EXPECT_EQ(ints((*c)["mixed"]["swa_lens"]), Row({8, 5, 6, 7, 8, 8, 8, 1, 2, 3}));
  EXPECT_EQ(ints((*c)["prefill_ragged"]["indptr"]), Row({0, 7, 15, 23, 31, 32, 34, 37}));
}

// Docs example 6 (bounded replay, replay_start [0, 8, 12]): the prefill windows start at the
// replay start, never on the freed pages below it, in the mixed matrix, the prefill CSR and the
// combined prefill (one chunk (0, 2, N 0, M 13); gather_start 14 - 6 = 8 and 20 - 8 = 12).
TEST_F(ConsumerJson, Example6ReplayPrefill) {
  Load("replay_prefill.json");
  auto c = Consumer("flashinfer_sm100");
  SPARSE_SWA_ASSERT_OK(c.status());
  const Json& mixed = (*c)["mixed"];
  ASSERT_EQ(mixed["indices"].size(), 11u);
  EXPECT_EQ(ints(mixed["indices"][1]), Row({44, -1, -1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(ints(mixed["indices"][6]), Row({44, 45, 46, 47, 24, 25, -1, -1}));
  EXPECT_EQ(ints(mixed["indices"][7]), Row({4, 5, 6, 7, 16, -1, -1, -1}));
  EXPECT_EQ(ints(mixed["lens"]), Row(11, 8));
  EXPECT_EQ(ints(mixed["swa_lens"]), Row({8, 1, 2, 3, 4, 5, 6, 5, 6, 7, 8}));
  EXPECT_EQ(ints((*c)["prefill_ragged"]["indptr"]), Row({0, 1, 3, 6, 10, 15, 21, 26, 32, 39, 47}));
  const Json& chunks = (*c)["combined_prefill"];
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(ints(chunks[0]["chunk"]), Row({0, 2, 0, 13}));
  EXPECT_EQ(ints(chunks[0]["rows"][0]), padded({0}, 128));
  EXPECT_EQ(ints(chunks[0]["rows"][5]), padded({0, 1, 2, 3, 4, 5}, 128));
  EXPECT_EQ(ints(chunks[0]["rows"][6]), padded({13, 14, 15, 16, 17}, 128));
  EXPECT_EQ(ints(chunks[0]["rows"][9]), padded({13, 14, 15, 16, 17, 18, 19, 20}, 128));
  EXPECT_EQ(ints(chunks[0]["lens"]), Row({1, 2, 3, 4, 5, 6, 5, 6, 7, 8}));
}

// A CUDA-graph padded decode-only step (docs example 2): padded rows -1 with lens 0 everywhere,
// no prefill rows and no chunks.
TEST_F(ConsumerJson, PaddedDecodeOnly) {
  Load("padded_decode.json");
  auto c = Consumer("flashinfer_sm100");
  SPARSE_SWA_ASSERT_OK(c.status());
  EXPECT_EQ(ints((*c)["mixed"]["indices"][2]), Row(8, -1));
  EXPECT_EQ(ints((*c)["mixed"]["lens"]), Row({8, 8, 0, 0}));
  EXPECT_EQ(ints((*c)["mixed"]["swa_lens"]), Row({3, 8, 0, 0}));
  EXPECT_EQ(ints((*c)["ragged"]["indptr"]), Row({0, 3, 11, 11, 11}));
  EXPECT_EQ(ints((*c)["prefill_ragged"]["indptr"]), Row({0}));
  EXPECT_TRUE((*c)["prefill_ragged"]["indices"].empty());
  EXPECT_TRUE((*c)["combined_prefill"].empty());
}

// W = 8 decode rows: FlashMLA wants a multiple of 64 at 64 heads, so the config is rejected and
// the first rejected tuple is named; our own kernels accept it.
TEST_F(ConsumerJson, DispatchVerdict) {
  Load("mixed_mtp.json");
  auto ours = Consumer("sparse_swa");
  SPARSE_SWA_ASSERT_OK(ours.status());
  EXPECT_EQ((*ours)["dispatch"]["accepted"], true);
  EXPECT_TRUE((*ours)["dispatch"]["first_rejected"].is_null());
  EXPECT_TRUE((*ours)["dispatch"]["message"].is_null());

  DeploymentShape shape;
  shape.heads = 128;
  auto flashmla = Consumer("flashmla_sparse_decode", shape);
  SPARSE_SWA_ASSERT_OK(flashmla.status());
  const Json& d = (*flashmla)["dispatch"];
  EXPECT_EQ(d["heads"], 128);
  EXPECT_EQ(d["accepted"], false);
  EXPECT_EQ(d["first_rejected"],
            "decode causal swaonly: heads 128, topk 8, page_block_size 4, extra_topk 0, "
            "extra_page_block_size 0");
  const std::string message = d["message"];
  EXPECT_EQ(message.find("dispatch policy flashmla_sparse_decode rejects decode causal swaonly"),
            0u)
      << message;
}

TEST_F(ConsumerJson, UnknownConsumerListsTheNames) {
  Load("mixed_mtp.json");
  EXPECT_TRUE(IsInvalidArgument(
      Consumer("flashattention").status(),
      {"consumer: expected one of flashmla_sparse_decode, flashinfer_sm120_decode, "
       "flashinfer_sm100, rocm_ragged, sparse_swa, got \"flashattention\""}));
}

TEST_F(ConsumerJson, DeviceMetadataRejected) {
  Load("mixed_mtp.json");
  SwaMetadata device = md_;
  device.space = MemorySpace::kDevice;
  EXPECT_TRUE(
      IsInvalidArgument(consumer_to_json("sparse_swa", file_.config, device, input_, {}).status(),
                        {"metadata: expected host memory", "got device views"}));
}

// Every shipped batch file (DSpark, vision, padded, mixed, replay) through every built-in
// consumer, and the reference keys are left as they were.
TEST_F(ConsumerJson, EveryShippedCaseEveryConsumer) {
  for (const char* name : {"mixed_mtp.json", "dspark_draft.json", "padded_decode.json",
                           "vision_prefill.json", "replay_prefill.json"}) {
    Load(name);
    for (const std::string& consumer : builtin_policy_names()) {
      auto c = Consumer(consumer);
      SPARSE_SWA_ASSERT_OK(c.status());
      // Mixed rows are 16-byte aligned and at least the decode rows' own width (never W).
      EXPECT_EQ((*c)["mixed"]["width"].get<int32_t>() % 4, 0) << name;
      EXPECT_GE((*c)["mixed"]["swa_width"].get<int32_t>(), md_.decode_swa.width) << name;
      EXPECT_EQ((*c)["mixed"]["indices"].size(), static_cast<size_t>(md_.num_tokens)) << name;
      EXPECT_EQ((*c)["ragged"]["indptr"].size(), static_cast<size_t>(md_.num_decode_tokens + 1))
          << name;
      EXPECT_EQ((*c)["ragged"]["indices"].size(),
                static_cast<size_t>((*c)["ragged"]["indptr"].back().get<int32_t>()))
          << name;
    }
  }
}

}  // namespace
}  // namespace sparse_swa
