// SPDX-License-Identifier: Apache-2.0
// sparse-swa demo [--backend cpu|cuda]
// Three consecutive steps of one small engine (a DSpark speculative model with a vision
// encoder), built by one builder from embedded data and printed for a newcomer.
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "json/batch_json.h"
#include "metadata_table.h"
#include "testing/step_builder.h"

namespace sparse_swa::cli {

namespace {

// Small enough to print every row: W = 8, B = 4, k = 2 DSpark drafts (theta = 3), images of up
// to 6 tokens (prefill rows W + Mi = 14), C4A layers beside SWA-only ones.
BuilderConfig demo_config() {
  BuilderConfig c;
  c.window_size = 8;
  c.block_size = 4;
  c.max_num_batched_tokens = 32;
  c.max_num_seqs = 4;
  c.max_model_len = 64;
  c.num_speculative_tokens = 2;
  c.speculative_method = SpeculativeMethod::kDspark;
  c.max_image_tokens = 6;
  c.compress_ratios = {1, 4};
  return c;
}

// The KV pages (B = 4 tokens each) of the engine's sequences; slot = page * 4 + position % 4.
constexpr int32_t kPagesPerSequence = 6;
constexpr int32_t kPages[][kPagesPerSequence] = {
    {7, 3, 9, 2, 12, 15},      // sequence 0
    {5, 11, 6, 0, 13, 16},     // sequence 1
    {1, 4, 8, 10, 14, 17},     // sequence 2 (its prompt holds an image)
    {18, 19, 20, 21, 22, 23},  // unused pages behind the CUDA-graph padding request
};

struct DemoRequest {
  int32_t sequence;   // row of kPages
  int32_t seq_len;    // tokens in the KV cache after this step (context + query)
  int32_t query_len;  // tokens scheduled this step: positions [seq_len - query_len, seq_len)
};

struct DemoStep {
  const char* title;
  const char* story;
  bool causal;
  std::vector<DemoRequest> requests;  // decode requests first, as the scheduler orders them
  int32_t padding_tokens;             // CUDA-graph padding after the scheduled tokens
  std::vector<ImageSpan> image_spans;
  std::vector<ChunkPlanRequest> chunk_plans;
};

std::vector<DemoStep> demo_steps() {
  return {
      {"verify drafts beside a chunked prefill with an image",
       "Sequences 0 and 1 verify their drafts: each sends 1 + k = 3 tokens, and a request with\n"
       "query_len <= theta = 3 is a decode. Sequence 2 prefills the second chunk of its prompt\n"
       "(positions 6..13); positions 7..12 are an image, whose tokens see each other both ways,\n"
       "so their prefill rows reach past the causal window (the 'img L/R' column). Decode rows\n"
       "are causal: the last W = 8 positions up to and including the token itself.",
       /*causal=*/true,
       {{0, 13, 3}, {1, 7, 3}, {2, 14, 8}},
       /*padding_tokens=*/0,
       {{/*request=*/2, /*start=*/7, /*end=*/12}},
       {{1, 4, std::nullopt}, {4, 4, std::nullopt}}},
      {"DSpark draft (non-causal)",
       "The drafter proposes the next tokens of sequences 0 and 1 in one non-causal pass: the 3\n"
       "query tokens of a request all see the same keys (the last W context positions plus the\n"
       "whole query block), so all rows of a request are equal. They use the wide non-causal\n"
       "buffer (width round_up(W + theta, 64) = 64); sequence 2 is not scheduled.",
       /*causal=*/false,
       {{0, 15, 3}, {1, 9, 3}},
       /*padding_tokens=*/0,
       {},
       {}},
      {"verify under a CUDA graph (padded)",
       "All three sequences verify 3 tokens (sequence 2 finished its prompt): 9 tokens. The\n"
       "engine replays a CUDA graph captured for 12 tokens and 4 requests, so tokens 9..11 are\n"
       "padding (slot -1: invalid, lens 0, rows all -1, mapped to request 0) and request 3 is\n"
       "empty (seq_len 0, no tokens).",
       /*causal=*/true,
       {{0, 16, 3}, {1, 10, 3}, {2, 17, 3}, {3, 0, 0}},
       /*padding_tokens=*/3,
       {},
       {}},
  };
}

BatchFile make_batch(const BuilderConfig& config, const DemoStep& step) {
  BatchFile f;
  f.config = config;
  f.query_start_loc = {0};
  f.block_table_rows = static_cast<int64_t>(step.requests.size());
  f.block_table_cols = kPagesPerSequence;
  for (const DemoRequest& req : step.requests) {
    const int32_t* pages = kPages[req.sequence];
    f.seq_lens.push_back(req.seq_len);
    f.query_start_loc.push_back(f.query_start_loc.back() + req.query_len);
    f.block_table.insert(f.block_table.end(), pages, pages + kPagesPerSequence);
    for (int32_t pos = req.seq_len - req.query_len; pos < req.seq_len; ++pos) {
      f.slot_mapping.push_back(int64_t{pages[pos / config.block_size]} * config.block_size +
                               pos % config.block_size);
    }
  }
  f.slot_mapping.insert(f.slot_mapping.end(), step.padding_tokens, -1);
  f.causal = step.causal;
  f.image_spans = step.image_spans;
  f.chunk_plan_requests = step.chunk_plans;
  return f;
}

Status run_demo(const std::string& backend) {
  const BuilderConfig config = demo_config();
  auto builder = testing::StepBuilder::create(config, backend_named(backend));
  SPARSE_SWA_RETURN_IF_ERROR(builder.status());
  const std::vector<DemoStep> steps = demo_steps();

  std::cout << "sparse-swa demo: three consecutive steps of one engine, built by one "
               "metadata builder (backend "
            << backend << ").\n"
            << "Every token gets a row of KV slot ids it attends to through the sliding window;\n"
            << "slot = page * B + position % B, with the pages of each sequence below.\n";
  for (size_t s = 0; s < std::size(kPages); ++s) {
    std::cout << "  sequence " << s << " pages:";
    for (int32_t page : kPages[s]) std::cout << ' ' << page;
    std::cout << "\n";
  }

  const int32_t* first_decode_rows = nullptr;
  bool buffers_reused = true;
  for (size_t s = 0; s < steps.size(); ++s) {
    const BatchFile file = make_batch(config, steps[s]);
    SwaMetadata md;
    SPARSE_SWA_RETURN_IF_ERROR(builder.value()->build(file.batch_input(), &md));
    auto plans = run_chunk_plans(md, file.chunk_plan_requests);
    SPARSE_SWA_RETURN_IF_ERROR(plans.status());
    std::cout << "\n=== Step " << s + 1 << " of " << steps.size() << ": " << steps[s].title
              << " ===\n"
              << steps[s].story << "\n\n";
    SPARSE_SWA_RETURN_IF_ERROR(
        print_metadata_table(std::cout, file, builder.value()->derived(), md, plans.value()));
    if (md.causal && md.num_decode_tokens > 0) {
      const int32_t* rows = builder.value()->last_decode_rows();
      if (first_decode_rows == nullptr) first_decode_rows = rows;
      buffers_reused = buffers_reused && rows == first_decode_rows;
    }
  }
  std::cout << "\nOne builder built all " << steps.size()
            << " steps: its buffers were sized once from max_num_batched_tokens = "
            << config.max_num_batched_tokens << " and max_num_seqs = " << config.max_num_seqs
            << ";\nevery step's rows are views into them (causal decode rows at the same address "
               "in steps 1 and 3: "
            << (buffers_reused ? "yes" : "no") << ").\n"
            << "Next: sparse-swa build BATCH.json [--format table] on a batch file of "
               "your own.\n";
  return flush_stdout();
}

}  // namespace

void add_demo_command(CLI::App& app, int* exit_code) {
  auto backend = std::make_shared<std::string>("cpu");
  CLI::App* cmd = app.add_subcommand(
      "demo", "Build and explain three consecutive steps on embedded example data");
  add_backend_option(*cmd, backend.get());
  cmd->callback([backend, exit_code] {
    const Status status = run_demo(*backend);
    *exit_code = status.ok() ? kExitOk : report_error(status);
  });
}

}  // namespace sparse_swa::cli
