// SPDX-License-Identifier: Apache-2.0
// The CUDA backend of MetadataBuilder: the persistent device buffers and one kernel launch per
// step (the front end, src/metadata_builder.cc, has done the host checks and planning).
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <span>
#include <vector>

#include "backend.h"
#include "batch_checks.h"
#include "cuda/cuda_utils.h"
#include "cuda/metadata_kernel.cuh"

namespace sparse_swa::detail {

namespace {

class CudaBuilderRows final : public BuilderRows {
 public:
  CudaBuilderRows(const BuilderConfig& config, const DerivedConfig& derived, cudaStream_t stream)
      : config_(config), derived_(derived), stream_(stream) {}
  ~CudaBuilderRows() override {
    for (cudaEvent_t& e : staging_done_) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }

  Status allocate();
  void add_owned_buffers(OwnedBuffers* owned) const override;
  Status write_rows(const BatchInput& batch, const RowsPlan& plan, SwaMetadata* md) override;
  Status write_rows_groups(std::span<BuilderRows* const> rows, std::span<const BatchInput> batches,
                           std::span<const RowsPlan> plans, std::span<SwaMetadata> mds) override;
  Status update_decode_rows(const BatchInput& batch, const DraftUpdateRecord& last) override;
  Status take_device_error() override;
  void set_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }
  void* stream() const override { return stream_; }
  Status poison(uint8_t byte) override;

 private:
  MetadataKernelParams base_params(const BatchInput& b) const;
  // A build's kernel parameters (the spans staged), `md`'s views and the draft update's record;
  // the caller launches. *launch: whether the step has work for the kernel.
  Status prepare_build(const BatchInput& b, const RowsPlan& plan, SwaMetadata* md,
                       MetadataKernelParams* params, bool* launch);
  // Uploads the host span CSR (through a pinned staging buffer) for the kernel.
  Status stage_spans(const BatchInput& b, const SpanCsr& csr, MetadataKernelParams* params);

  const BuilderConfig config_;
  const DerivedConfig derived_;
  cudaStream_t stream_;
  int device_ = 0;  // where the buffers live
  MetadataKernelLauncher launcher_;
  int32_t last_decode_query_len_ = 0;   // the last build's hint, reused by the draft update
  DeviceBuffer<int32_t> token_to_req_;  // [max_tokens]
  DeviceBuffer<uint8_t> is_valid_;      // [max_tokens]
  DeviceBuffer<int32_t> decode_rows_;   // [max_tokens, W]
  DeviceBuffer<int32_t> decode_rows_noncausal_;  // [max_tokens, Wn] (DSpark)
  DeviceBuffer<int32_t> decode_lens_;            // [max_tokens]
  DeviceBuffer<int32_t> prefill_rows_;           // [max_tokens, W + Mi]
  DeviceBuffer<int32_t> prefill_lens_;           // [max_tokens]
  DeviceBuffer<int32_t> left_visible_;           // [max_tokens] (vision)
  DeviceBuffer<int32_t> right_visible_;          // [max_tokens] (vision)
  DeviceBuffer<int32_t> spans_;                  // packed [max_seqs + 1 + 2 * max_tokens]
  DeviceBuffer<int32_t> gather_lens_;            // [max_seqs]
  DeviceBuffer<uint32_t> error_word_;            // [1]
  // Two pinned staging buffers for the one span upload per step (two, so the host never
  // overwrites a buffer whose copy may still be pending).
  PinnedBuffer<int32_t> staging_[2];
  cudaEvent_t staging_done_[2] = {nullptr, nullptr};
  int next_staging_ = 0;
  DeviceBuffer<int32_t> replay_start_;  // [max_seqs], exported
  DeviceBuffer<int32_t> fi_topk_lens_;  // [max_tokens] (config.flashinfer_decode_lens)
  DeviceBuffer<int32_t> fi_seq_lens_;   // [max_tokens] (config.flashinfer_decode_lens)
  // The last build, for update_decode_rows, where the caller cannot write it: its decode rows,
  // whether it was given a replay_start and wrote the FlashInfer lens, and on the device its
  // replay_start (written by the build's kernel).
  int32_t* build_decode_rows_ = nullptr;
  bool build_replay_given_ = false;
  bool build_flashinfer_lens_ = false;
  DeviceBuffer<int32_t> build_replay_start_;  // [max_seqs]
};

Status CudaBuilderRows::allocate() {
  const BuilderConfig& c = config_;
  const DerivedConfig& d = derived_;
  const size_t max_tokens = static_cast<size_t>(c.max_num_batched_tokens);
  const size_t max_seqs = static_cast<size_t>(c.max_num_seqs);
  int device = 0;
  SPARSE_SWA_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&device), "cudaGetDevice"));
  device_ = device;
  SPARSE_SWA_RETURN_IF_ERROR(
      cuda_status(init_metadata_kernel_launcher(device, &launcher_), "metadata kernel launcher"));
  SPARSE_SWA_RETURN_IF_ERROR(token_to_req_.allocate(max_tokens));
  SPARSE_SWA_RETURN_IF_ERROR(is_valid_.allocate(max_tokens));
  SPARSE_SWA_RETURN_IF_ERROR(decode_rows_.allocate(max_tokens * c.window_size));
  if (d.is_dspark) {
    SPARSE_SWA_RETURN_IF_ERROR(
        decode_rows_noncausal_.allocate(max_tokens * d.noncausal_index_width));
  }
  SPARSE_SWA_RETURN_IF_ERROR(decode_lens_.allocate(max_tokens));
  SPARSE_SWA_RETURN_IF_ERROR(prefill_rows_.allocate(max_tokens * d.prefill_index_width));
  SPARSE_SWA_RETURN_IF_ERROR(prefill_lens_.allocate(max_tokens));
  SPARSE_SWA_RETURN_IF_ERROR(gather_lens_.allocate(max_seqs));
  SPARSE_SWA_RETURN_IF_ERROR(error_word_.allocate(1));
  if (d.widens_images) {
    const size_t packed = max_seqs + 1 + 2 * max_tokens;
    SPARSE_SWA_RETURN_IF_ERROR(left_visible_.allocate(max_tokens));
    SPARSE_SWA_RETURN_IF_ERROR(right_visible_.allocate(max_tokens));
    SPARSE_SWA_RETURN_IF_ERROR(spans_.allocate(packed));
    for (int i = 0; i < 2; ++i) {
      SPARSE_SWA_RETURN_IF_ERROR(staging_[i].allocate(packed));
      SPARSE_SWA_RETURN_IF_ERROR(cuda_status(
          cudaEventCreateWithFlags(&staging_done_[i], cudaEventDisableTiming), "cudaEventCreate"));
    }
  }
  SPARSE_SWA_RETURN_IF_ERROR(replay_start_.allocate(max_seqs));
  SPARSE_SWA_RETURN_IF_ERROR(build_replay_start_.allocate(max_seqs));
  if (c.flashinfer_decode_lens) {
    SPARSE_SWA_RETURN_IF_ERROR(fi_topk_lens_.allocate(max_tokens));
    SPARSE_SWA_RETURN_IF_ERROR(fi_seq_lens_.allocate(max_tokens));
  }
  // Start from the CPU backend's initial state: empty rows, zero lens, no error.
  SPARSE_SWA_RETURN_IF_ERROR(poison(0xff));
  SPARSE_SWA_RETURN_IF_ERROR(cuda_status(
      cudaMemsetAsync(decode_lens_.get(), 0, decode_lens_.bytes(), stream_), "cudaMemsetAsync"));
  SPARSE_SWA_RETURN_IF_ERROR(cuda_status(
      cudaMemsetAsync(error_word_.get(), 0, error_word_.bytes(), stream_), "cudaMemsetAsync"));
  return cuda_status(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void CudaBuilderRows::add_owned_buffers(OwnedBuffers* owned) const {
  auto own = [&](const auto& a, const char* name) { owned->add(a.get(), a.bytes(), name); };
  own(token_to_req_, "token_to_req_indices");
  own(is_valid_, "is_valid_token");
  own(decode_rows_, "decode_swa.data");
  own(decode_rows_noncausal_, "decode_swa.data");
  own(decode_lens_, "decode_swa.lens");
  own(prefill_rows_, "prefill_swa.data");
  own(prefill_lens_, "prefill_swa.lens");
  own(left_visible_, "left_visible");
  own(right_visible_, "right_visible");
  own(gather_lens_, "prefill_gather_lens");
  own(replay_start_, "replay_start");
  own(fi_topk_lens_, "flashinfer_decode_topk_lens");
  own(fi_seq_lens_, "flashinfer_decode_seq_lens");
}

Status CudaBuilderRows::poison(uint8_t byte) {
  auto fill = [&](void* p, size_t bytes) {
    return p == nullptr ? Status::Ok()
                        : cuda_status(cudaMemsetAsync(p, byte, bytes, stream_), "cudaMemsetAsync");
  };
  SPARSE_SWA_RETURN_IF_ERROR(fill(token_to_req_.get(), token_to_req_.bytes()));
  SPARSE_SWA_RETURN_IF_ERROR(fill(is_valid_.get(), is_valid_.bytes()));
  SPARSE_SWA_RETURN_IF_ERROR(fill(decode_rows_.get(), decode_rows_.bytes()));
  SPARSE_SWA_RETURN_IF_ERROR(fill(decode_rows_noncausal_.get(), decode_rows_noncausal_.bytes()));
  SPARSE_SWA_RETURN_IF_ERROR(fill(decode_lens_.get(), decode_lens_.bytes()));
  SPARSE_SWA_RETURN_IF_ERROR(fill(prefill_rows_.get(), prefill_rows_.bytes()));
  SPARSE_SWA_RETURN_IF_ERROR(fill(prefill_lens_.get(), prefill_lens_.bytes()));
  SPARSE_SWA_RETURN_IF_ERROR(fill(left_visible_.get(), left_visible_.bytes()));
  SPARSE_SWA_RETURN_IF_ERROR(fill(right_visible_.get(), right_visible_.bytes()));
  SPARSE_SWA_RETURN_IF_ERROR(fill(gather_lens_.get(), gather_lens_.bytes()));
  SPARSE_SWA_RETURN_IF_ERROR(fill(replay_start_.get(), replay_start_.bytes()));
  SPARSE_SWA_RETURN_IF_ERROR(fill(fi_topk_lens_.get(), fi_topk_lens_.bytes()));
  SPARSE_SWA_RETURN_IF_ERROR(fill(fi_seq_lens_.get(), fi_seq_lens_.bytes()));
  return cuda_status(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

MetadataKernelParams CudaBuilderRows::base_params(const BatchInput& b) const {
  const BuilderConfig& c = config_;
  const DerivedConfig& d = derived_;
  MetadataKernelParams p{};
  p.query_start_loc = b.query_start_loc.data();
  p.seq_lens = b.seq_lens.data();
  p.block_table = b.block_table.data;
  p.block_table_stride = b.block_table.stride;
  p.block_table_cols = static_cast<int32_t>(std::min<int64_t>(b.block_table.cols, kInt32Max));
  p.slot_mapping = b.slot_mapping.data();
  p.num_reqs = b.num_reqs();
  p.num_tokens = b.num_tokens();
  p.window = c.window_size;
  p.block_size = c.block_size;
  p.block_shift = std::has_single_bit(static_cast<uint32_t>(c.block_size))
                      ? std::countr_zero(static_cast<uint32_t>(c.block_size))
                      : -1;
  p.max_image_tokens = c.max_image_tokens;
  p.token_to_req = token_to_req_.get();
  p.is_valid = is_valid_.get();
  p.decode_lens = decode_lens_.get();
  p.lens_capacity = c.max_num_batched_tokens;
  p.prefill_rows = prefill_rows_.get();
  p.prefill_width = d.prefill_index_width;
  p.prefill_lens = prefill_lens_.get();
  p.left_visible = left_visible_.get();
  p.right_visible = right_visible_.get();
  p.gather_lens = gather_lens_.get();
  p.error_word = error_word_.get();
  return p;
}

Status CudaBuilderRows::stage_spans(const BatchInput& b, const SpanCsr& csr,
                                    MetadataKernelParams* p) {
  p->num_spans = csr.count;
  if (csr.count == 0) return Status::Ok();
  // Reuse a staging buffer only once its previous upload has run (not while capturing: a
  // captured copy reads the buffer at replay time, and waiting is not allowed then).
  const int slot = next_staging_;
  next_staging_ ^= 1;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  SPARSE_SWA_RETURN_IF_ERROR(
      cuda_status(cudaStreamIsCapturing(stream_, &capture), "cudaStreamIsCapturing"));
  if (capture == cudaStreamCaptureStatusNone) {
    SPARSE_SWA_RETURN_IF_ERROR(
        cuda_status(cudaEventSynchronize(staging_done_[slot]), "cudaEventSynchronize"));
  }
  const int32_t num_reqs = b.num_reqs();
  int32_t* staged = staging_[slot].get();
  std::memcpy(staged, csr.indptr, sizeof(int32_t) * (num_reqs + 1));
  std::memcpy(staged + num_reqs + 1, csr.starts, sizeof(int32_t) * csr.count);
  std::memcpy(staged + num_reqs + 1 + csr.count, csr.ends, sizeof(int32_t) * csr.count);
  const size_t bytes = sizeof(int32_t) * (num_reqs + 1 + 2 * static_cast<size_t>(csr.count));
  SPARSE_SWA_RETURN_IF_ERROR(
      cuda_status(cudaMemcpyAsync(spans_.get(), staged, bytes, cudaMemcpyHostToDevice, stream_),
                  "cudaMemcpyAsync(image spans)"));
  SPARSE_SWA_RETURN_IF_ERROR(
      cuda_status(cudaEventRecord(staging_done_[slot], stream_), "cudaEventRecord"));
  p->spans = spans_.get();
  return Status::Ok();
}

Status CudaBuilderRows::prepare_build(const BatchInput& b, const RowsPlan& plan, SwaMetadata* md,
                                      MetadataKernelParams* params, bool* launch) {
  const BuilderConfig& c = config_;
  const DerivedConfig& d = derived_;
  const StepSplit& split = plan.split;
  const int32_t num_tokens = b.num_tokens();

  MetadataKernelParams& p = *params;
  p = base_params(b);
  SPARSE_SWA_RETURN_IF_ERROR(stage_spans(b, *plan.spans, &p));
  p.with_image = plan.with_image;
  p.num_decode_tokens = split.num_decode_tokens;
  p.num_decodes = split.num_decodes;
  p.num_prefills = split.num_prefills;
  p.decode_query_len = split.decode_query_len;
  last_decode_query_len_ = split.decode_query_len;
  p.noncausal = !b.causal;
  p.decode_rows = p.noncausal ? decode_rows_noncausal_.get() : decode_rows_.get();
  p.decode_width = plan.decode_width;
  p.replay_start = b.replay_start.empty() ? nullptr : b.replay_start.data();
  p.check_replay = p.replay_start != nullptr;
  p.replay_out = replay_start_.get();
  p.build_replay = build_replay_start_.get();
  const bool flashinfer_lens =
      c.flashinfer_decode_lens && p.noncausal && split.num_decode_tokens > 0;
  if (flashinfer_lens) {
    p.flashinfer_topk_lens = fi_topk_lens_.get();
    p.flashinfer_seq_lens = fi_seq_lens_.get();
  }
  *launch = num_tokens > 0 || split.num_prefills > 0 || b.num_reqs() > 0;

  md->token_to_req_indices = {token_to_req_.get(), static_cast<size_t>(num_tokens)};
  md->is_valid_token = {is_valid_.get(), static_cast<size_t>(num_tokens)};
  md->decode_swa = {p.decode_rows,  decode_lens_.get(), split.num_decode_tokens, p.decode_width,
                    p.decode_width, c.window_size,      MemorySpace::kDevice};
  md->prefill_swa = {prefill_rows_.get(),   prefill_lens_.get(),   split.num_prefill_tokens,
                     d.prefill_index_width, d.prefill_index_width, c.window_size,
                     MemorySpace::kDevice};
  if (p.with_image) {
    md->left_visible = {left_visible_.get(), static_cast<size_t>(num_tokens)};
    md->right_visible = {right_visible_.get(), static_cast<size_t>(num_tokens)};
  }
  md->prefill_gather_lens = {gather_lens_.get(), static_cast<size_t>(split.num_prefills)};
  md->replay_start = {replay_start_.get(), static_cast<size_t>(b.num_reqs())};
  if (flashinfer_lens) {
    const size_t td = static_cast<size_t>(split.num_decode_tokens);
    md->flashinfer_decode_topk_lens = {fi_topk_lens_.get(), td};
    md->flashinfer_decode_seq_lens = {fi_seq_lens_.get(), td};
  }
  build_decode_rows_ = p.decode_rows;
  build_replay_given_ = p.replay_start != nullptr;
  build_flashinfer_lens_ = flashinfer_lens;
  return Status::Ok();
}

Status CudaBuilderRows::write_rows(const BatchInput& b, const RowsPlan& plan, SwaMetadata* md) {
  MetadataKernelParams p;
  bool launch = false;
  SPARSE_SWA_RETURN_IF_ERROR(prepare_build(b, plan, md, &p, &launch));
  if (!launch) return Status::Ok();
  return cuda_status(launch_metadata_kernel(p, launcher_, stream_), "metadata kernel launch");
}

Status CudaBuilderRows::write_rows_groups(std::span<BuilderRows* const> rows,
                                          std::span<const BatchInput> batches,
                                          std::span<const RowsPlan> plans,
                                          std::span<SwaMetadata> mds) {
  // Every row's backend is a CudaBuilderRows on this stream (build_groups checked both).
  for (size_t g = 1; g < rows.size(); ++g) {
    const int device = static_cast<CudaBuilderRows*>(rows[g])->device_;
    if (device != device_) {
      return invalid_argument("builders[", g, "]: expected the CUDA device of builders[0] (",
                              device_, "; one launch writes every group), got device ", device);
    }
  }
  MetadataGroupParams gp{};
  gp.num_groups = static_cast<int32_t>(rows.size());
  bool any = false;
  for (size_t g = 0; g < rows.size(); ++g) {
    bool launch = false;
    SPARSE_SWA_RETURN_IF_ERROR(static_cast<CudaBuilderRows*>(rows[g])->prepare_build(
        batches[g], plans[g], &mds[g], &gp.groups[g], &launch));
    any = any || launch;
  }
  if (!any) return Status::Ok();
  return cuda_status(launch_metadata_groups_kernel(&gp, launcher_, stream_),
                     "metadata kernel launch (groups)");
}

Status CudaBuilderRows::update_decode_rows(const BatchInput& b, const DraftUpdateRecord& last) {
  MetadataKernelParams p = base_params(b);
  p.update_only = true;
  p.noncausal = last.noncausal;
  p.num_decode_tokens = last.num_decode_tokens;
  p.num_decodes = last.num_decodes;
  p.decode_query_len = last_decode_query_len_;
  p.decode_rows = build_decode_rows_;
  p.decode_width = last.decode_width;
  // The build's replay_start (the batch's is not read), checked against the current arrays.
  p.replay_start = build_replay_given_ ? build_replay_start_.get() : nullptr;
  p.check_replay = build_replay_given_;
  if (build_flashinfer_lens_) {
    p.flashinfer_topk_lens = fi_topk_lens_.get();
    p.flashinfer_seq_lens = fi_seq_lens_.get();
  }
  return cuda_status(launch_metadata_kernel(p, launcher_, stream_), "metadata kernel launch");
}

Status CudaBuilderRows::take_device_error() {
  uint32_t word = 0;
  SPARSE_SWA_RETURN_IF_ERROR(cuda_status(
      cudaMemcpyAsync(&word, error_word_.get(), sizeof(word), cudaMemcpyDeviceToHost, stream_),
      "cudaMemcpyAsync(error word)"));
  SPARSE_SWA_RETURN_IF_ERROR(cuda_status(
      cudaMemsetAsync(error_word_.get(), 0, sizeof(uint32_t), stream_), "cudaMemsetAsync"));
  SPARSE_SWA_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
  if (word == 0) return Status::Ok();
  std::string what;
  auto add = [&](uint32_t bit, const char* text) {
    if (word & bit) what += what.empty() ? text : std::string("; ") + text;
  };
  add(kDeviceErrorWindow,
      "a window outside [0, seq_len) or wider than its row (device "
      "seq_lens / query_start_loc disagree with the host copies)");
  add(kDeviceErrorBlockTable, "a block index past block_table's columns or a negative block id");
  add(kDeviceErrorSlotOverflow, "a slot id that overflows int32");
  add(kDeviceErrorPaddingSlot,
      "a padding token (past query_start_loc[num_reqs]) with a slot != -1");
  add(kDeviceErrorSlotValue, "a slot_mapping value < -1");
  add(kDeviceErrorReplayStart,
      "a replay_start outside [0, seq_len - query_len] (the request's cached prefix)");
  return invalid_argument("batch (device arrays): ", what,
                          "; the affected rows were written as invalid (lens 0, all -1)");
}

}  // namespace

StatusOr<std::unique_ptr<BuilderRows>> create_cuda_builder_rows(const BuilderConfig& config,
                                                                const DerivedConfig& derived,
                                                                void* cuda_stream) {
  if (!cuda_device_usable()) {
    return unavailable("backend cuda: no usable CUDA device (cudaGetDeviceCount found none)");
  }
  auto rows =
      std::make_unique<CudaBuilderRows>(config, derived, static_cast<cudaStream_t>(cuda_stream));
  SPARSE_SWA_RETURN_IF_ERROR(rows->allocate());
  return std::unique_ptr<BuilderRows>(std::move(rows));
}

}  // namespace sparse_swa::detail
