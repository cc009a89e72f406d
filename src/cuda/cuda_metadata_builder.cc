// CUDA backend of MetadataBuilder: host-side checks and planning, then one kernel launch.
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include "backend.h"
#include "batch_checks.h"
#include "cuda/cuda_utils.h"
#include "cuda/metadata_kernel.cuh"

namespace sparse_swa::detail {

namespace {

class CudaMetadataBuilder final : public MetadataBuilder {
 public:
  CudaMetadataBuilder(const BuilderConfig& config, const DerivedConfig& derived,
                      cudaStream_t stream)
      : MetadataBuilder(config, derived), stream_(stream) {}
  ~CudaMetadataBuilder() override {
    for (cudaEvent_t& e : staging_done_) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }

  Status allocate();
  Backend backend() const override { return Backend::kCuda; }
  Status build(const BatchInput& batch, SwaMetadata* out) override;
  Status update_draft_decode_rows(const BatchInput& batch, SwaMetadata* md) override;
  Status take_device_error() override;
  Status poison(uint8_t byte);

 private:
  MetadataKernelParams base_params(const BatchInput& b) const;
  Status stage_spans(const BatchInput& b, MetadataKernelParams* params);
  Status check_host_copies_given(const BatchInput& b) const;

  cudaStream_t stream_;
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
  // Host side: span CSR scratch and two pinned staging buffers for the one span upload per
  // step (two, so the host never overwrites a buffer whose copy may still be pending).
  std::vector<int32_t> span_indptr_, span_starts_, span_ends_;
  PinnedBuffer<int32_t> staging_[2];
  cudaEvent_t staging_done_[2] = {nullptr, nullptr};
  int next_staging_ = 0;
  std::vector<int32_t> prefill_seq_lens_;    // [max_seqs] host
  std::vector<int32_t> prefill_query_lens_;  // [max_seqs] host
  OwnedBuffers owned_;                       // the buffers above that the metadata exports
  // The last build, for update_draft_decode_rows, where the caller cannot write it: its host
  // query_start_loc copy, and on the device its spans and decode tokens' validity (written by
  // the build's kernel; see MetadataKernelParams).
  DraftUpdateRecord last_build_;
  std::vector<int32_t> build_query_start_loc_host_;  // [max_seqs + 1]
  DeviceBuffer<int32_t> build_query_start_loc_;      // [max_seqs + 1]
  DeviceBuffer<uint8_t> build_valid_;                // [max_tokens]
};

Status CudaMetadataBuilder::allocate() {
  const BuilderConfig& c = config();
  const DerivedConfig& d = derived();
  const size_t max_tokens = static_cast<size_t>(c.max_num_batched_tokens);
  const size_t max_seqs = static_cast<size_t>(c.max_num_seqs);
  int device = 0;
  SPARSE_SWA_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&device), "cudaGetDevice"));
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
  if (c.max_image_tokens > 0) {
    const size_t packed = max_seqs + 1 + 2 * max_tokens;
    SPARSE_SWA_RETURN_IF_ERROR(left_visible_.allocate(max_tokens));
    SPARSE_SWA_RETURN_IF_ERROR(right_visible_.allocate(max_tokens));
    SPARSE_SWA_RETURN_IF_ERROR(spans_.allocate(packed));
    span_indptr_.assign(max_seqs + 1, 0);
    span_starts_.assign(max_tokens, 0);
    span_ends_.assign(max_tokens, 0);
    for (int i = 0; i < 2; ++i) {
      SPARSE_SWA_RETURN_IF_ERROR(staging_[i].allocate(packed));
      SPARSE_SWA_RETURN_IF_ERROR(cuda_status(
          cudaEventCreateWithFlags(&staging_done_[i], cudaEventDisableTiming), "cudaEventCreate"));
    }
  }
  prefill_seq_lens_.assign(max_seqs, 0);
  prefill_query_lens_.assign(max_seqs, 0);
  build_query_start_loc_host_.assign(max_seqs + 1, 0);
  SPARSE_SWA_RETURN_IF_ERROR(build_query_start_loc_.allocate(max_seqs + 1));
  SPARSE_SWA_RETURN_IF_ERROR(build_valid_.allocate(max_tokens));
  auto own = [&](const auto& a, const char* name) { owned_.add(a.get(), a.bytes(), name); };
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
  owned_.add(prefill_seq_lens_.data(), prefill_seq_lens_.size() * sizeof(int32_t),
             "prefill_seq_lens_host");
  owned_.add(prefill_query_lens_.data(), prefill_query_lens_.size() * sizeof(int32_t),
             "prefill_query_lens_host");
  owned_.seal();
  // Start from the CPU backend's initial state: empty rows, zero lens, no error.
  SPARSE_SWA_RETURN_IF_ERROR(poison(0xff));
  SPARSE_SWA_RETURN_IF_ERROR(cuda_status(
      cudaMemsetAsync(decode_lens_.get(), 0, decode_lens_.bytes(), stream_), "cudaMemsetAsync"));
  SPARSE_SWA_RETURN_IF_ERROR(cuda_status(
      cudaMemsetAsync(error_word_.get(), 0, error_word_.bytes(), stream_), "cudaMemsetAsync"));
  return cuda_status(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

Status CudaMetadataBuilder::poison(uint8_t byte) {
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
  return cuda_status(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

MetadataKernelParams CudaMetadataBuilder::base_params(const BatchInput& b) const {
  const BuilderConfig& c = config();
  const DerivedConfig& d = derived();
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
  p.build_query_start_loc = build_query_start_loc_.get();
  p.build_valid = build_valid_.get();
  return p;
}

Status CudaMetadataBuilder::check_host_copies_given(const BatchInput& b) const {
  if ((b.query_start_loc_host.empty() || b.seq_lens_host.empty()) && !b.seq_lens.empty()) {
    return invalid_argument(
        "batch.query_start_loc_host / batch.seq_lens_host: the CUDA "
        "backend needs host copies of query_start_loc and seq_lens");
  }
  return Status::Ok();
}

Status CudaMetadataBuilder::stage_spans(const BatchInput& b, MetadataKernelParams* p) {
  SpanCsr csr{span_indptr_.data(), span_starts_.data(), span_ends_.data(),
              config().max_num_batched_tokens, 0};
  SPARSE_SWA_RETURN_IF_ERROR(
      build_span_csr(b.image_spans, host_seq_lens(b), config().max_image_tokens, &csr));
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

Status CudaMetadataBuilder::build(const BatchInput& b, SwaMetadata* out) {
  const BuilderConfig& c = config();
  const DerivedConfig& d = derived();
  SPARSE_SWA_RETURN_IF_ERROR(check_host_copies_given(b));
  SPARSE_SWA_RETURN_IF_ERROR(check_batch_outside(b, owned_));
  StepSplit split;
  SPARSE_SWA_RETURN_IF_ERROR(check_batch(c, d, b, /*arrays_on_host=*/false, &split));
  const int32_t num_tokens = b.num_tokens();

  MetadataKernelParams p = base_params(b);
  SPARSE_SWA_RETURN_IF_ERROR(stage_spans(b, &p));
  p.with_image = c.max_image_tokens > 0 && split.num_prefill_tokens > 0 && p.num_spans > 0;
  p.num_decode_tokens = split.num_decode_tokens;
  p.num_decodes = split.num_decodes;
  p.num_prefills = split.num_prefills;
  p.decode_query_len = split.decode_query_len;
  last_decode_query_len_ = split.decode_query_len;
  p.noncausal = !b.causal;
  p.decode_rows = p.noncausal ? decode_rows_noncausal_.get() : decode_rows_.get();
  p.decode_width = p.noncausal ? d.noncausal_index_width : c.window_size;
  if (num_tokens > 0 || split.num_prefills > 0) {
    SPARSE_SWA_RETURN_IF_ERROR(
        cuda_status(launch_metadata_kernel(p, launcher_, stream_), "metadata kernel launch"));
  }

  SwaMetadata md = step_metadata_scalars(c, d, b, split, MemorySpace::kDevice);
  md.token_to_req_indices = {token_to_req_.get(), static_cast<size_t>(num_tokens)};
  md.is_valid_token = {is_valid_.get(), static_cast<size_t>(num_tokens)};
  md.decode_swa = {p.decode_rows,  decode_lens_.get(), split.num_decode_tokens, p.decode_width,
                   p.decode_width, c.window_size,      MemorySpace::kDevice};
  md.prefill_swa = {prefill_rows_.get(),   prefill_lens_.get(),   split.num_prefill_tokens,
                    d.prefill_index_width, d.prefill_index_width, c.window_size,
                    MemorySpace::kDevice};
  if (p.with_image) {
    md.left_visible = {left_visible_.get(), static_cast<size_t>(num_tokens)};
    md.right_visible = {right_visible_.get(), static_cast<size_t>(num_tokens)};
  }
  const size_t rp = static_cast<size_t>(split.num_prefills);
  fill_prefill_host_plan(b, split, prefill_seq_lens_.data(), prefill_query_lens_.data());
  md.prefill_gather_lens = {gather_lens_.get(), rp};
  md.prefill_seq_lens_host = {prefill_seq_lens_.data(), rp};
  md.prefill_query_lens_host = {prefill_query_lens_.data(), rp};

  const auto qsl_host = host_query_start_loc(b);
  std::copy(qsl_host.begin(), qsl_host.end(), build_query_start_loc_host_.begin());
  last_build_ = {.decode_rows = p.decode_rows,
                 .decode_lens = decode_lens_.get(),
                 .decode_width = p.decode_width,
                 .num_reqs = b.num_reqs(),
                 .num_tokens = num_tokens,
                 .num_decodes = split.num_decodes,
                 .num_decode_tokens = split.num_decode_tokens,
                 .query_start_loc = {build_query_start_loc_host_.data(), qsl_host.size()}};
  *out = md;
  return Status::Ok();
}

Status CudaMetadataBuilder::update_draft_decode_rows(const BatchInput& b, SwaMetadata* md) {
  SPARSE_SWA_RETURN_IF_ERROR(check_draft_update_target(md, last_build_, MemorySpace::kDevice, b));
  SPARSE_SWA_RETURN_IF_ERROR(check_host_copies_given(b));
  SPARSE_SWA_RETURN_IF_ERROR(check_batch_outside(b, owned_));
  SPARSE_SWA_RETURN_IF_ERROR(check_batch(config(), derived(), b, /*arrays_on_host=*/false));
  SPARSE_SWA_RETURN_IF_ERROR(check_draft_update_spans(last_build_, b));
  if (last_build_.num_decode_tokens == 0) return Status::Ok();
  MetadataKernelParams p = base_params(b);
  p.update_only = true;
  // Tokens map over the build's spans; the kernel checks the batch's device array against them.
  p.query_start_loc = build_query_start_loc_.get();
  p.batch_query_start_loc = b.query_start_loc.data();
  p.num_decode_tokens = last_build_.num_decode_tokens;
  p.num_decodes = last_build_.num_decodes;
  p.decode_query_len = last_decode_query_len_;
  p.decode_rows = last_build_.decode_rows;
  p.decode_width = last_build_.decode_width;
  SPARSE_SWA_RETURN_IF_ERROR(
      cuda_status(launch_metadata_kernel(p, launcher_, stream_), "metadata kernel launch"));
  md->tile_schedulers = derived().layer_types;
  return Status::Ok();
}

Status CudaMetadataBuilder::take_device_error() {
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
  add(kDeviceErrorDraftSpans,
      "a draft update's query_start_loc with other spans than the last build's");
  return invalid_argument("batch (device arrays): ", what,
                          "; the affected rows were written as invalid (lens 0, all -1)");
}

}  // namespace

StatusOr<std::unique_ptr<MetadataBuilder>> create_cuda_metadata_builder(
    const BuilderConfig& config, const DerivedConfig& derived, void* cuda_stream) {
  if (!cuda_device_usable()) {
    return unavailable("backend cuda: no usable CUDA device (cudaGetDeviceCount found none)");
  }
  auto builder = std::make_unique<CudaMetadataBuilder>(config, derived,
                                                       static_cast<cudaStream_t>(cuda_stream));
  SPARSE_SWA_RETURN_IF_ERROR(builder->allocate());
  return std::unique_ptr<MetadataBuilder>(std::move(builder));
}

Status poison_cuda_builder_outputs(MetadataBuilder* builder, uint8_t byte) {
  auto* cuda = dynamic_cast<CudaMetadataBuilder*>(builder);
  if (cuda == nullptr) return invalid_argument("builder: expected a CUDA backend builder");
  return cuda->poison(byte);
}

}  // namespace sparse_swa::detail
