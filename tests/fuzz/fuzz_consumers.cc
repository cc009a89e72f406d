// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the index consumers (consumers.h), host backend. Each input describes a
// small valid step (config + batch, bounded replay in some, built by the CPU builder), optionally
// corrupts copies of the metadata and batch arrays (the consumers document errors for metadata the
// builder would have rejected), then drives every conversion with fuzzed shapes and values:
// compressed_topk_to_global, copy_global_topk, build_mixed_matrix, prefill_chunk_plan +
// combined_prefill_shape + build_combined_prefill + check_prefill_topk, and to_ragged.
// Each call must return an error that wrote nothing, or outputs that keep the view invariants
// (lens <= width, -1 past lens, invalid tokens -1 / 0, nothing written outside the view); on
// uncorrupted steps the values are also compared with independent computations.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "metadata_invariants.h"
#include "sparse_swa/consumers.h"
#include "sparse_swa/metadata_builder.h"

namespace {

using namespace sparse_swa;

constexpr int32_t kPoison = 0x5a5a5a5a;
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

[[noreturn]] void report(const char* stage, const std::string& detail) {
  std::fprintf(stderr, "fuzz_consumers: %s: %s\n", stage, detail.c_str());
  std::abort();
}

void expect_invalid(const Status& s, const char* stage) {
  if (s.code() != StatusCode::kInvalidArgument || s.message().empty()) {
    report(stage, "expected INVALID_ARGUMENT with a message, got " + s.to_string());
  }
}

// Mostly small values near the interesting range, sometimes any int32.
int32_t fuzz_int(FuzzedDataProvider& in, int32_t lo, int32_t hi) {
  return in.ConsumeBool() ? in.ConsumeIntegralInRange<int32_t>(lo, hi)
                          : in.ConsumeIntegral<int32_t>();
}

int32_t pick_ratio(FuzzedDataProvider& in) {
  static constexpr int32_t kRatios[] = {1, 2, 4, 128, 1, 2, 4, 128, 0, 3, -4};
  return in.PickValueInArray(kRatios);
}

// An output index view over owned, poisoned storage.
struct OutView {
  std::vector<int32_t> data, lens;
  IndexView view;
  OutView(int64_t rows, int32_t width, int64_t stride) {
    data.assign(std::max<int64_t>(rows, 0) * std::max<int64_t>(stride, 0) + 1, kPoison);
    lens.assign(std::max<int64_t>(rows, 0) + 1, kPoison);
    view = {data.data(), lens.data(), rows, width, stride, 0, MemorySpace::kHost};
  }
  bool untouched() const {
    return std::all_of(data.begin(), data.end(), [](int32_t v) { return v == kPoison; }) &&
           std::all_of(lens.begin(), lens.end(), [](int32_t v) { return v == kPoison; });
  }
  // Rows >= `rows_written` and the stride gaps still hold the poison.
  std::string outside_intact(int64_t rows_written) const {
    for (int64_t i = 0; i < view.rows; ++i) {
      for (int64_t j = i < rows_written ? view.width : 0; j < view.row_stride; ++j) {
        if (data[i * view.row_stride + j] != kPoison) {
          return str_cat("element [", i, "][", j, "] outside the written rows changed");
        }
      }
      if (i >= rows_written && lens[i] != kPoison) return str_cat("lens[", i, "] changed");
    }
    if (data.back() != kPoison || lens.back() != kPoison) return "written past the view";
    return "";
  }
};

// A small valid step: the builder's inputs, owned.
struct Step {
  BuilderConfig config;
  std::vector<int32_t> qsl{0}, seq_lens, block_table, replay;
  int64_t cols = 0;
  std::vector<int64_t> slots;
  std::vector<ImageSpan> spans;
  bool causal = true;

  BatchInput input() const {
    static constexpr int32_t kNoBlocks[1] = {0};
    BatchInput b;
    b.query_start_loc = qsl;
    b.seq_lens = seq_lens;
    b.block_table = {block_table.empty() ? kNoBlocks : block_table.data(),
                     static_cast<int64_t>(seq_lens.size()), cols, cols, MemorySpace::kHost};
    b.slot_mapping = slots;
    b.causal = causal;
    b.image_spans = spans;
    b.replay_start = replay;
    return b;
  }
};

Step make_step(FuzzedDataProvider& in) {
  Step s;
  BuilderConfig& c = s.config;
  c.window_size = in.ConsumeIntegralInRange<int32_t>(1, 40);
  c.block_size = in.ConsumeIntegralInRange<int32_t>(1, 16);
  c.speculative_method = static_cast<SpeculativeMethod>(in.ConsumeIntegralInRange<int>(0, 2));
  if (c.speculative_method != SpeculativeMethod::kNone) {
    c.num_speculative_tokens = in.ConsumeIntegralInRange<int32_t>(0, 4);
    c.parallel_drafting = in.ConsumeBool();
  }
  c.max_image_tokens = in.ConsumeBool() ? in.ConsumeIntegralInRange<int32_t>(1, 12) : 0;
  const int mask = in.ConsumeIntegralInRange<int>(1, 15);
  for (int i = 0; i < 4; ++i) {
    if (mask & (1 << i)) c.compress_ratios.push_back(i == 3 ? 128 : 1 << i);
  }
  const int32_t num_reqs = in.ConsumeIntegralInRange<int32_t>(0, 6);
  std::vector<int32_t> query_lens(num_reqs);
  int64_t max_seq = 1;
  for (int32_t r = 0; r < num_reqs; ++r) {
    query_lens[r] = in.ConsumeIntegralInRange<int32_t>(0, in.ConsumeBool() ? 3 : 24);
    s.seq_lens.push_back(query_lens[r] + in.ConsumeIntegralInRange<int32_t>(0, 90));
    s.qsl.push_back(s.qsl.back() + query_lens[r]);
    max_seq = std::max<int64_t>(max_seq, s.seq_lens.back());
  }
  s.cols = (max_seq + c.block_size - 1) / c.block_size + in.ConsumeIntegralInRange<int>(0, 1);
  for (int64_t i = 0; i < num_reqs * s.cols; ++i) {
    s.block_table.push_back(in.ConsumeIntegralInRange<int32_t>(0, 4000));
  }
  for (int32_t r = 0; r < num_reqs; ++r) {
    for (int32_t j = 0; j < query_lens[r]; ++j) {
      const int64_t pos = s.seq_lens[r] - query_lens[r] + j;
      const int64_t slot = int64_t{s.block_table[r * s.cols + pos / c.block_size]} * c.block_size +
                           pos % c.block_size;
      s.slots.push_back(in.ConsumeProbability<float>() < 0.1f ? -1 : slot);
    }
  }
  const int32_t padding = in.ConsumeIntegralInRange<int32_t>(0, 4);
  for (int32_t i = 0; i < padding; ++i) s.slots.push_back(-1);
  if (c.max_image_tokens > 0) {
    for (int32_t r = 0; r < num_reqs; ++r) {
      if (s.seq_lens[r] == 0 || !in.ConsumeBool()) continue;
      const int32_t start = in.ConsumeIntegralInRange<int32_t>(0, s.seq_lens[r] - 1);
      const int32_t len = in.ConsumeIntegralInRange<int32_t>(1, c.max_image_tokens);
      s.spans.push_back({r, start, std::min(start + len - 1, s.seq_lens[r] - 1)});
    }
  }
  s.causal = !(c.speculative_method == SpeculativeMethod::kDspark && in.ConsumeBool());
  // SWA bounded replay in some steps (docs/semantics.md#bounded-replay): a start inside each
  // prefix and, on causal steps, the pages wholly below it freed (-1) as an engine frees them.
  if (in.ConsumeBool()) {
    for (int32_t r = 0; r < num_reqs; ++r) {
      const int32_t rs = in.ConsumeIntegralInRange<int32_t>(0, s.seq_lens[r] - query_lens[r]);
      s.replay.push_back(rs);
      for (int64_t blk = 0; s.causal && (blk + 1) * c.block_size <= rs; ++blk) {
        s.block_table[r * s.cols + blk] = -1;
      }
    }
  }
  // The span buffers hold max_num_batched_tokens spans (the reference asserts it too).
  c.max_num_batched_tokens =
      std::max<int32_t>(static_cast<int32_t>(std::max(s.slots.size(), s.spans.size())), 1) +
      in.ConsumeIntegralInRange<int32_t>(0, 8);
  c.max_num_seqs = std::max(num_reqs, 1);
  c.max_model_len = max_seq + in.ConsumeIntegralInRange<int32_t>(0, 64);
  return s;
}

// Copies of the metadata arrays and of the batch arrays, which may be corrupted.
struct OwnedStep {
  SwaMetadata md;
  std::vector<int32_t> token_to_req, decode_rows, decode_lens, prefill_rows, prefill_lens, left,
      right, gather, prefill_seq, prefill_ql, replay;
  std::vector<uint8_t> valid;
  std::vector<int32_t> qsl, seq_lens, block_table;
  BatchInput batch;

  OwnedStep(const SwaMetadata& src, const BatchInput& b) : md(src) {
    token_to_req.assign(src.token_to_req_indices.begin(), src.token_to_req_indices.end());
    valid.assign(src.is_valid_token.begin(), src.is_valid_token.end());
    auto copy_view = [](const ConstIndexView& v, std::vector<int32_t>* rows,
                        std::vector<int32_t>* lens) {
      rows->assign(v.data, v.data + v.rows * v.row_stride);
      lens->assign(v.lens, v.lens + v.rows);
      ConstIndexView out = v;
      out.data = rows->data();
      out.lens = lens->data();
      return out;
    };
    md.decode_swa = copy_view(src.decode_swa, &decode_rows, &decode_lens);
    md.prefill_swa = copy_view(src.prefill_swa, &prefill_rows, &prefill_lens);
    left.assign(src.left_visible.begin(), src.left_visible.end());
    right.assign(src.right_visible.begin(), src.right_visible.end());
    gather.assign(src.prefill_gather_lens.begin(), src.prefill_gather_lens.end());
    prefill_seq.assign(src.prefill_seq_lens_host.begin(), src.prefill_seq_lens_host.end());
    prefill_ql.assign(src.prefill_query_lens_host.begin(), src.prefill_query_lens_host.end());
    replay.assign(src.replay_start.begin(), src.replay_start.end());
    md.token_to_req_indices = token_to_req;
    md.is_valid_token = valid;
    md.left_visible = left;
    md.right_visible = right;
    md.prefill_gather_lens = gather;
    md.prefill_seq_lens_host = prefill_seq;
    md.prefill_query_lens_host = prefill_ql;
    md.replay_start = replay;
    qsl.assign(b.query_start_loc.begin(), b.query_start_loc.end());
    seq_lens.assign(b.seq_lens.begin(), b.seq_lens.end());
    block_table.assign(b.block_table.data,
                       b.block_table.data + b.block_table.rows * b.block_table.stride);
    batch = b;
    batch.query_start_loc = qsl;
    batch.seq_lens = seq_lens;
    if (!block_table.empty()) batch.block_table.data = block_table.data();
  }

  // One corruption of a metadata or batch value; sizes and pointers stay truthful.
  void corrupt(FuzzedDataProvider& in) {
    auto poke = [&](auto& vec, int32_t lo, int32_t hi) {
      if (vec.empty()) return;
      const size_t i = in.ConsumeIntegralInRange<size_t>(0, vec.size() - 1);
      vec[i] = static_cast<std::remove_reference_t<decltype(vec[0])>>(fuzz_int(in, lo, hi));
    };
    const int32_t t = static_cast<int32_t>(token_to_req.size());  // the true count
    // 22 picks one of the later kinds too, so that older inputs keep their meaning.
    int kind = in.ConsumeIntegralInRange<int>(0, 22);
    if (kind == 22) kind += in.ConsumeIntegralInRange<int>(0, 4);
    switch (kind) {
      case 0:
        poke(token_to_req, -2, 8);
        break;
      case 1:
        poke(valid, 0, 2);
        break;
      case 2:
        poke(decode_lens, -2, 80);
        break;
      case 3:
        poke(decode_rows, -3, 5000);
        break;
      case 4:
        poke(prefill_lens, -2, 80);
        break;
      case 5:
        poke(prefill_rows, -3, 5000);
        break;
      case 6:
        poke(left, -2, 20);
        break;
      case 7:
        poke(right, -2, 20);
        break;
      case 8:
        poke(gather, -2, 120);
        break;
      case 9:
        poke(prefill_seq, -2, 150);
        break;
      case 10:
        poke(prefill_ql, -2, 40);
        break;
      case 11:
        md.num_decode_tokens = fuzz_int(in, -2, t + 2);
        break;
      case 12:
        md.num_prefill_tokens = fuzz_int(in, -2, t + 2);
        break;
      case 13:
        md.num_decodes = fuzz_int(in, -2, 8);
        break;
      case 14:
        md.num_prefills = fuzz_int(in, -2, 8);
        break;
      case 15:
        md.num_tokens = fuzz_int(in, -2, t);
        break;
      case 16:
        md.window_size = fuzz_int(in, -1, 60);
        break;
      case 17:
        md.causal = !md.causal;
        break;
      case 18:
        md.decode_swa.width =
            in.ConsumeIntegralInRange<int32_t>(0, static_cast<int32_t>(md.decode_swa.row_stride));
        break;
      case 19:
        poke(qsl, -2, 160);
        break;
      case 20:
        poke(seq_lens, -2, 160);
        break;
      case 21:
        poke(block_table, -2, 5000);
        break;
      case 22:
        md.max_decode_query_len = fuzz_int(in, -1, 30);
        break;
      case 23:
        md.num_reqs = fuzz_int(in, -2, 8);
        break;
      case 24:
        md.max_model_len = in.ConsumeBool() ? fuzz_int(in, -1, 200) : in.ConsumeIntegral<int64_t>();
        break;
      case 25:
        md.max_num_batched_tokens = fuzz_int(in, -1, 40);
        break;
      default:
        poke(replay, -2, 120);
        break;
    }
  }
};

// Independent global slot of local compressed index l of request r (consumers.h, 1.).
int32_t global_slot(const CompressedCache& cache, int32_t r, int32_t l) {
  if (l < 0) return -1;
  const int64_t blk = l / cache.block_size;
  if (blk >= cache.block_table.cols) return -1;
  const int64_t id = cache.block_table.data[r * cache.block_table.stride + blk];
  if (id < 0) return -1;
  const int64_t g = id * cache.block_size + l % cache.block_size;
  return g > kInt32Max ? -1 : static_cast<int32_t>(g);
}

// A matrix of fuzzed values (ints kept alive by `storage`).
MatrixView<const int32_t> fuzz_matrix(FuzzedDataProvider& in, int64_t rows, int64_t cols,
                                      int32_t hi, std::vector<int32_t>* storage) {
  const int64_t stride = cols + in.ConsumeIntegralInRange<int64_t>(0, 2);
  storage->resize(std::max<int64_t>(rows, 0) * stride + 1);
  for (int32_t& v : *storage) v = in.remaining_bytes() > 0 ? fuzz_int(in, -2, hi) : 0;
  return {storage->data(), rows, cols, stride, MemorySpace::kHost};
}

struct Cache {
  std::vector<int32_t> table;
  CompressedCache cache;
};

Cache fuzz_cache(FuzzedDataProvider& in, int32_t num_reqs) {
  Cache c;
  c.cache.compress_ratio = pick_ratio(in);
  c.cache.block_size = in.ConsumeIntegralInRange<int32_t>(-1, 8);
  // num_reqs may be corrupted: the table stays small (and too short for a huge count).
  const int64_t rows = std::clamp<int64_t>(
      int64_t{std::clamp(num_reqs, 0, 64)} + in.ConsumeIntegralInRange<int>(-1, 1), 0, 64);
  const int64_t cols = in.ConsumeIntegralInRange<int64_t>(0, 8);
  c.cache.block_table = fuzz_matrix(in, rows, cols, 300, &c.table);
  return c;
}

// The step's true token count: the span sizes are never corrupted, md.num_tokens may be.
int32_t real_tokens(const SwaMetadata& md) {
  return static_cast<int32_t>(md.token_to_req_indices.size());
}

bool token_valid(const SwaMetadata& md, int64_t t) {
  return t >= 0 && t < static_cast<int64_t>(md.is_valid_token.size()) && md.is_valid_token[t];
}

// Invariants every successful output row keeps: lens in [0, min(width, lens_limit)], invalid
// tokens all -1 with lens 0, and (when `min_value` is -1) no entry below -1. Outputs that copy
// caller values (decode rows, C128A global indices) pass INT32_MIN.
std::string check_out_row(const IndexView& out, int64_t i, bool valid, int64_t lens_limit,
                          int32_t min_value = -1) {
  const int32_t len = out.lens[i];
  if (len < 0 || len > out.width || len > lens_limit) {
    return str_cat("row ", i, ": lens ", len, " outside [0, ",
                   std::min<int64_t>(out.width, lens_limit), "]");
  }
  for (int32_t j = 0; j < out.width; ++j) {
    const int32_t v = out.row(i)[j];
    if (v < min_value || (!valid && v != -1)) return str_cat("row ", i, "[", j, "]: got ", v);
  }
  if (!valid && len != 0) return str_cat("row ", i, ": invalid token with lens ", len);
  return "";
}

void fuzz_compressed_topk(FuzzedDataProvider& in, const SwaMetadata& md, bool exact) {
  Cache c = fuzz_cache(in, md.num_reqs);
  std::vector<int32_t> local_storage;
  const int64_t rows = in.ConsumeIntegralInRange<int64_t>(0, real_tokens(md) + 1);
  const MatrixView<const int32_t> local =
      fuzz_matrix(in, rows, in.ConsumeIntegralInRange<int64_t>(0, 10), 60, &local_storage);
  const int32_t first = in.ConsumeIntegralInRange<int32_t>(-1, real_tokens(md));
  const int32_t width =
      static_cast<int32_t>(local.cols) + in.ConsumeIntegralInRange<int32_t>(-1, 2);
  OutView out(rows + in.ConsumeIntegralInRange<int>(-1, 1), width,
              width + in.ConsumeIntegralInRange<int>(0, 2));
  const Status s = compressed_topk_to_global(md, first, local, c.cache, out.view);
  if (!s.ok()) {
    expect_invalid(s, "compressed_topk_to_global");
    if (!out.untouched()) report("compressed_topk_to_global", "wrote output before failing");
    return;
  }
  if (std::string e = out.outside_intact(rows); !e.empty()) report("compressed_topk_to_global", e);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t t = first + i;
    const bool valid = token_valid(md, t);
    if (std::string e = check_out_row(out.view, i, valid, local.cols); !e.empty()) {
      report("compressed_topk_to_global", e);
    }
    if (!exact || !valid) continue;
    int32_t count = 0;
    for (int64_t j = 0; j < out.view.width; ++j) {
      const int32_t want =
          j < local.cols ? global_slot(c.cache, md.token_to_req_indices[t], local.row(i)[j]) : -1;
      if (out.view.row(i)[j] != want) {
        report("compressed_topk_to_global",
               str_cat("row ", i, "[", j, "]: got ", out.view.row(i)[j], ", expected ", want));
      }
      count += want >= 0;
    }
    if (out.view.lens[i] != count) report("compressed_topk_to_global", "lens != mapped count");
  }
}

void fuzz_copy_global(FuzzedDataProvider& in, const SwaMetadata& md) {
  const int64_t rows = in.ConsumeIntegralInRange<int64_t>(0, real_tokens(md) + 1);
  const int32_t width = in.ConsumeIntegralInRange<int32_t>(0, 8);
  std::vector<int32_t> storage;
  const MatrixView<const int32_t> m = fuzz_matrix(in, rows, width, 900, &storage);
  std::vector<int32_t> lens(rows + 1);
  for (int32_t& l : lens)
    l = in.ConsumeBool() ? in.ConsumeIntegralInRange<int32_t>(0, width)
                         : fuzz_int(in, -1, width + 1);
  const ConstIndexView global{m.data, lens.data(), rows, width, m.stride, 0, MemorySpace::kHost};
  const int32_t first = in.ConsumeIntegralInRange<int32_t>(-1, real_tokens(md));
  const int32_t out_width = width + in.ConsumeIntegralInRange<int32_t>(-1, 2);
  OutView out(rows + in.ConsumeIntegralInRange<int>(-1, 1), out_width,
              out_width + in.ConsumeIntegralInRange<int>(0, 2));
  const Status s = copy_global_topk(md, first, global, out.view);
  if (!s.ok()) {
    expect_invalid(s, "copy_global_topk");
    if (!out.untouched()) report("copy_global_topk", "wrote output before failing");
    return;
  }
  if (std::string e = out.outside_intact(rows); !e.empty()) report("copy_global_topk", e);
  for (int64_t i = 0; i < rows; ++i) {
    const bool valid = token_valid(md, first + i);
    const int32_t len = valid ? lens[i] : 0;
    if (out.view.lens[i] != len) report("copy_global_topk", str_cat("row ", i, ": wrong lens"));
    for (int32_t j = 0; j < out.view.width; ++j) {
      const int32_t want = j < len ? global.row(i)[j] : -1;
      if (out.view.row(i)[j] != want)
        report("copy_global_topk", str_cat("row ", i, ": wrong value"));
    }
  }
}

// One successful build_mixed_matrix: the view invariants, and on uncorrupted steps the SWA
// section against the builder's rows (re-laid by the rule of docs/semantics.md#mixed-matrix for
// non-causal decode rows in the SM100 form).
void check_mixed_matrix(const ConsumerStep& step, MixedMatrixForm form,
                        const MixedMatrixShape& shape, const OutView& out,
                        const std::vector<int32_t>& swa_lens, bool exact, const char* stage) {
  const SwaMetadata& md = step.md;
  const int64_t t_count = md.num_tokens;
  if (t_count > out.view.rows || t_count > real_tokens(md)) {
    report(stage, "accepted num_tokens past the output or the metadata");
  }
  if (std::string e = out.outside_intact(t_count); !e.empty()) report(stage, e);
  for (int64_t t = 0; t < t_count; ++t) {
    const bool valid = token_valid(md, t);
    if (std::string e = check_out_row(out.view, t, valid, out.view.width, INT32_MIN); !e.empty()) {
      report(stage, e);
    }
    if (!swa_lens.empty() && (swa_lens[t] < 0 || swa_lens[t] > shape.swa_width)) {
      report(stage, str_cat("swa_lens[", t, "] = ", swa_lens[t]));
    }
    if (!exact || !valid) continue;
    // The SWA section repeats the builder's row for the token (decode and prefill alike).
    const bool decode = t < md.num_decode_tokens;
    const ConstIndexView& v = decode ? md.decode_swa : md.prefill_swa;
    const int64_t i = decode ? t : t - md.num_decode_tokens;
    const bool relaid = decode && !md.causal && form == MixedMatrixForm::kFlashInferSm100;
    int64_t wl = 0, sp = 0, section = shape.swa_width;
    if (relaid) {  // wl = min(pos + 1, W), sp = min(prefix, W) + ql - wl, section W + sp
      const int32_t r = md.token_to_req_indices[t];
      const int64_t qs = step.batch.query_start_loc[r];
      const int64_t ql = step.batch.query_start_loc[r + 1] - qs;
      const int64_t prefix = step.batch.seq_lens[r] - ql;
      wl = std::min<int64_t>(prefix + (t - qs) + 1, md.window_size);
      sp = std::min<int64_t>(prefix, md.window_size) + ql - wl;
      section = md.window_size + sp;
      if (out.view.lens[t] < section) {
        report(stage,
               str_cat("token ", t, ": lens ", out.view.lens[t], " below W + spill ", section));
      }
    }
    for (int64_t j = 0; j < section; ++j) {
      int32_t want;
      if (relaid) {
        const int64_t from = j < md.window_size ? (j < wl ? j : -1) : j - md.window_size + wl;
        want = from < 0 ? -1 : v.row(i)[from];
      } else {
        // Decode rows are copied whole (-1 padded to S); prefill rows are recomputed (-1 past
        // lens).
        want = j < v.width && (decode || j < v.lens[i]) ? v.row(i)[j] : -1;
      }
      if (out.view.row(t)[j] != want) {
        report(stage, str_cat("token ", t, " SWA entry ", j, ": got ", out.view.row(t)[j],
                              ", expected ", want));
      }
    }
    if (!swa_lens.empty() && swa_lens[t] != v.lens[i]) {
      report(stage, str_cat("swa_lens[", t, "] = ", swa_lens[t], ", expected ", v.lens[i]));
    }
  }
}

void fuzz_mixed_matrix(FuzzedDataProvider& in, const ConsumerStep& step, bool exact) {
  const SwaMetadata& md = step.md;
  Cache c = fuzz_cache(in, md.num_reqs);
  CompressedTopk topk;
  topk.cache = c.cache;
  std::vector<int32_t> dl, dg, dg_lens, pl;
  const int kind = in.ConsumeIntegralInRange<int>(0, 3);  // none, local, global, both
  const int64_t td = std::clamp(md.num_decode_tokens, 0, real_tokens(md));
  const int64_t tp = std::clamp(md.num_prefill_tokens, 0, real_tokens(md));
  if (kind & 1) {
    topk.decode_local = fuzz_matrix(in, td + in.ConsumeIntegralInRange<int>(-1, 1),
                                    in.ConsumeIntegralInRange<int64_t>(0, 8), 60, &dl);
  }
  if (kind & 2) {
    const int32_t w = in.ConsumeIntegralInRange<int32_t>(0, 8);
    const int64_t rows = td + in.ConsumeIntegralInRange<int>(-1, 1);
    const MatrixView<const int32_t> m = fuzz_matrix(in, rows, w, 900, &dg);
    dg_lens.resize(std::max<int64_t>(rows, 0) + 1);
    for (int32_t& l : dg_lens) l = in.ConsumeIntegralInRange<int32_t>(-1, w);
    topk.decode_global = {m.data, dg_lens.data(), rows, w, m.stride, 0, MemorySpace::kHost};
  }
  if (in.ConsumeBool()) {
    topk.prefill_local = fuzz_matrix(in, tp + in.ConsumeIntegralInRange<int>(-1, 1),
                                     in.ConsumeIntegralInRange<int64_t>(0, 10), 60, &pl);
  }
  const MixedMatrixShape shape = mixed_matrix_shape(md, topk);
  const int64_t rows = real_tokens(md) + in.ConsumeIntegralInRange<int>(-1, 1);
  const int32_t width = shape.row_width + 4 * in.ConsumeIntegralInRange<int32_t>(-1, 1);
  const int64_t stride = width + in.ConsumeIntegralInRange<int>(0, 5);
  std::vector<int32_t> swa_lens_given;
  if (in.ConsumeBool()) {
    swa_lens_given.assign(
        std::max<int64_t>(real_tokens(md) + in.ConsumeIntegralInRange<int>(-1, 1), 0), kPoison);
  }
  // Both forms on the same inputs (no input bytes pick the form).
  for (MixedMatrixForm form : {MixedMatrixForm::kFlashInferSm100, MixedMatrixForm::kVerbatim}) {
    const std::string stage = str_cat("build_mixed_matrix (", mixed_matrix_form_name(form), ")");
    OutView out(rows, width, stride);
    std::vector<int32_t> swa_lens = swa_lens_given;
    const Status s = build_mixed_matrix(step, topk, form, out.view, swa_lens);
    if (!s.ok()) {
      expect_invalid(s, stage.c_str());
      if (!out.untouched() || swa_lens != swa_lens_given) {
        report(stage.c_str(), "wrote output before failing");
      }
      continue;
    }
    check_mixed_matrix(step, form, shape, out, swa_lens, exact, stage.c_str());
  }
}

void fuzz_combined_prefill(FuzzedDataProvider& in, const ConsumerStep& step, bool exact) {
  const SwaMetadata& md = step.md;
  const int32_t ratio = pick_ratio(in);
  const int64_t chunk_size =
      in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(-1, 6) : in.ConsumeIntegral<int64_t>();
  std::vector<ChunkPlanEntry> plan;
  if (chunk_size <= (int64_t{1} << 31)) {  // larger budgets: see malformed_test (chunk plan area)
    auto p = prefill_chunk_plan(md, ratio, chunk_size);
    if (p.ok()) {
      plan = p.value();
      if (exact) {
        std::string e = fuzz::check_chunk_plan(md, ratio, chunk_size, ratio > 1, plan);
        if (!e.empty()) report("prefill_chunk_plan", e);
      }
    } else {
      expect_invalid(p.status(), "prefill_chunk_plan");
    }
  }
  ChunkPlanEntry chunk;
  if (!plan.empty() && in.ConsumeBool()) {
    chunk = plan[in.ConsumeIntegralInRange<size_t>(0, plan.size() - 1)];
  } else {
    chunk.start = fuzz_int(in, -1, 6);
    chunk.end = fuzz_int(in, -1, 7);
    chunk.compressed_width = fuzz_int(in, -1, 60);
    const int32_t extra = fuzz_int(in, -1, 160);
    // A large draw is squared: total_width is int64 and may pass int32.
    chunk.total_width =
        chunk.compressed_width + (extra > (1 << 20) ? int64_t{extra} * extra : extra);
  }
  std::vector<int32_t> pl;
  const int64_t topk =
      ratio == 1 && in.ConsumeBool() ? 0 : in.ConsumeIntegralInRange<int64_t>(0, 12);
  const MatrixView<const int32_t> local = fuzz_matrix(
      in,
      std::clamp(md.num_prefill_tokens, 0, real_tokens(md)) + in.ConsumeIntegralInRange<int>(-1, 1),
      topk, 60, &pl);
  auto shape = combined_prefill_shape(md, chunk, static_cast<int32_t>(topk));
  int64_t rows = in.ConsumeIntegralInRange<int64_t>(0, 8);
  int32_t width = in.ConsumeIntegralInRange<int32_t>(0, 200);
  if (shape.ok() && shape->rows >= 0 && shape->rows <= real_tokens(md) &&
      shape->width <= (1 << 16)) {
    rows = shape->rows + in.ConsumeIntegralInRange<int>(-1, 1);
    width = shape->width + in.ConsumeIntegralInRange<int>(-1, 1);
  } else if (!shape.ok()) {
    expect_invalid(shape.status(), "combined_prefill_shape");
  }  // else: a shape from corrupted metadata; build_combined_prefill must reject the chunk
  OutView out(rows, width, width + in.ConsumeIntegralInRange<int>(0, 2));
  const Status s = build_combined_prefill(step, chunk, ratio, local, out.view);
  const Status check = check_prefill_topk(step, ratio, local);
  if (!check.ok()) expect_invalid(check, "check_prefill_topk");
  if (!s.ok()) {
    expect_invalid(s, "build_combined_prefill");
    if (!out.untouched()) report("build_combined_prefill", "wrote output before failing");
    return;
  }
  if (!shape.ok()) report("build_combined_prefill", "accepted a chunk that the shape rejected");
  const int64_t written = shape->rows;
  if (written > out.view.rows || written > real_tokens(md)) {
    report("build_combined_prefill", "accepted a chunk with more rows than the output");
  }
  if (std::string e = out.outside_intact(written); !e.empty()) report("build_combined_prefill", e);
  int64_t first_token = md.num_decode_tokens;
  for (int32_t p = 0; p < chunk.start; ++p) first_token += md.prefill_query_lens_host[p];
  const int64_t m = chunk.total_width, n = chunk.compressed_width;
  int64_t i = 0;
  for (int32_t p = chunk.start; p < chunk.end; ++p) {
    const int64_t b = p - chunk.start;
    for (int32_t k = 0; k < md.prefill_query_lens_host[p]; ++k, ++i) {
      const bool valid = token_valid(md, first_token + i);
      if (std::string e = check_out_row(out.view, i, valid, out.view.width); !e.empty()) {
        report("build_combined_prefill", e);
      }
      if (!valid) continue;
      // Compressed entries in the request's [b * M, b * M + N), SWA entries in [b * M + N, (b + 1)
      // * M).
      const int32_t len = out.view.lens[i];
      bool in_swa = false;
      for (int32_t j = 0; j < len; ++j) {
        const int64_t v = out.view.row(i)[j];
        if (v == -1 && !in_swa) continue;
        const bool swa = v >= b * m + n && v < (b + 1) * m;
        const bool compressed = v >= b * m && v < b * m + n;
        if (exact && !(swa || (compressed && !in_swa))) {
          report("build_combined_prefill", str_cat("row ", i, "[", j, "] = ", v,
                                                   " outside request ", b, "'s workspace rows"));
        }
        in_swa |= swa;
      }
      for (int32_t j = len; j < out.view.width; ++j) {
        if (out.view.row(i)[j] != -1) report("build_combined_prefill", "non -1 past lens");
      }
    }
  }
  if (i != written) report("build_combined_prefill", "shape rows != the chunk's tokens");
}

void fuzz_ragged(FuzzedDataProvider& in, const ConstIndexView& view, const char* stage) {
  const int64_t indptr_size = view.rows + 1 + in.ConsumeIntegralInRange<int>(-1, 1);
  const int64_t capacity = ragged_capacity(view) + in.ConsumeIntegralInRange<int>(-1, 3);
  std::vector<int32_t> indptr(std::max<int64_t>(indptr_size, 0) + 1, kPoison);
  std::vector<int32_t> values(std::max<int64_t>(capacity, 0) + 1, kPoison);
  const RaggedView out{indptr.data(), indptr_size, values.data(), capacity, MemorySpace::kHost};
  const Status s = to_ragged(view, out);
  if (!s.ok()) {
    expect_invalid(s, stage);
    for (int32_t v : indptr) {
      if (v != kPoison) report(stage, "wrote indptr before failing");
    }
    return;
  }
  if (indptr[0] != 0) report(stage, "indptr[0] != 0");
  for (int64_t i = 0; i < view.rows; ++i) {
    const int32_t len = view.lens[i];
    if (len < 0 || len > view.width || indptr[i + 1] - indptr[i] != len) {
      report(stage, str_cat("row ", i, ": indptr step != lens ", len));
    }
    for (int32_t j = 0; j < len; ++j) {
      if (values[indptr[i] + j] != view.row(i)[j]) report(stage, "values differ from the row");
    }
  }
  for (size_t k = indptr[view.rows]; k < values.size(); ++k) {
    if (values[k] != kPoison) report(stage, "values written past indptr[rows]");
  }
  for (size_t k = view.rows + 1; k < indptr.size(); ++k) {
    if (indptr[k] != kPoison) report(stage, "indptr written past rows + 1");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const Step step_input = make_step(in);
  auto builder = MetadataBuilder::create(step_input.config, Backend::kCpu);
  if (!builder.ok()) report("create", builder.status().to_string());
  const BatchInput batch = step_input.input();
  SwaMetadata built;
  if (Status s = builder.value()->build(batch, &built); !s.ok()) {
    report("build", "a generated valid batch failed: " + s.to_string());
  }
  if (std::string e = fuzz::check_metadata(step_input.config, batch, built); !e.empty()) {
    report("build", e);
  }

  OwnedStep owned(built, batch);
  const int corruptions = in.ConsumeBool() ? 0 : in.ConsumeIntegralInRange<int>(1, 4);
  for (int i = 0; i < corruptions; ++i) owned.corrupt(in);
  const bool exact = corruptions == 0;
  int32_t block_size = step_input.config.block_size;
  if (!exact && in.ConsumeBool()) block_size = fuzz_int(in, -1, 17);
  const ConsumerStep step{owned.md, owned.batch, block_size};

  while (in.remaining_bytes() > 0) {
    switch (in.ConsumeIntegralInRange<int>(0, 5)) {
      case 0:
        fuzz_compressed_topk(in, owned.md, exact);
        break;
      case 1:
        fuzz_copy_global(in, owned.md);
        break;
      case 2:
        fuzz_mixed_matrix(in, step, exact);
        break;
      case 3:
        fuzz_combined_prefill(in, step, exact);
        break;
      case 4:
        fuzz_ragged(in, owned.md.decode_swa, "to_ragged(decode_swa)");
        break;
      default:
        fuzz_ragged(in, owned.md.prefill_swa, "to_ragged(prefill_swa)");
        break;
    }
  }
  return 0;
}
