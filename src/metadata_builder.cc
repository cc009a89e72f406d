// SPDX-License-Identifier: Apache-2.0
// MetadataBuilder's front end: the config check at create(); per step, every host check, the
// split, the image spans, the scalars and the prefill host plan, once for both backends, and one
// call into the backend (src/backend.h's BuilderRows) that writes the rows.
#include "sparse_swa/metadata_builder.h"

#include <algorithm>
#include <array>
#include <new>
#include <vector>

#include "backend.h"
#include "batch_checks.h"

namespace sparse_swa {

namespace detail {

// The builder's host side: span CSR scratch, the prefill host plan it exports, the buffers a
// batch must not overlap, and the last build as a draft update needs it.
struct BuilderHost {
  std::vector<int32_t> span_indptr;         // [max_seqs + 1]
  std::vector<int32_t> span_starts;         // [max_tokens]
  std::vector<int32_t> span_ends;           // [max_tokens]
  std::vector<int32_t> prefill_seq_lens;    // [max_seqs]
  std::vector<int32_t> prefill_query_lens;  // [max_seqs]
  SpanCsr spans;                            // the step's spans, over the vectors above
  OwnedBuffers owned;
  // The last build, kept where the caller cannot write it.
  DraftUpdateRecord last_build;
};

Status poison_cuda_builder_outputs(MetadataBuilder* builder, uint8_t byte) {
  if (builder->backend() != Backend::kCuda) {
    return invalid_argument("builder: expected a CUDA backend builder");
  }
  return BuilderInternals::rows(*builder).poison(byte);
}

}  // namespace detail

namespace {

// The CUDA backend plans with host copies of query_start_loc and seq_lens.
Status check_host_copies_given(const BatchInput& b) {
  if ((b.query_start_loc_host.empty() || b.seq_lens_host.empty()) && !b.seq_lens.empty()) {
    return invalid_argument(
        "batch.query_start_loc_host / batch.seq_lens_host: the CUDA "
        "backend needs host copies of query_start_loc and seq_lens");
  }
  return Status::Ok();
}

MemorySpace space_of(Backend backend) {
  return backend == Backend::kCuda ? MemorySpace::kDevice : MemorySpace::kHost;
}

}  // namespace

const char* backend_name(Backend b) { return b == Backend::kCuda ? "cuda" : "cpu"; }

bool cuda_backend_available() { return detail::cuda_device_usable(); }

MetadataBuilder::MetadataBuilder(const BuilderConfig& config, const DerivedConfig& derived,
                                 Backend backend)
    : config_(config), derived_(derived), backend_(backend) {}

MetadataBuilder::~MetadataBuilder() = default;

StatusOr<std::unique_ptr<MetadataBuilder>> MetadataBuilder::create(const BuilderConfig& config,
                                                                   Backend backend,
                                                                   void* cuda_stream) {
  SPARSE_SWA_RETURN_IF_ERROR(validate_config(config));
  const DerivedConfig derived = derive_config(config);
  auto rows = backend == Backend::kCpu
                  ? detail::create_cpu_builder_rows(config, derived)
                  : detail::create_cuda_builder_rows(config, derived, cuda_stream);
  SPARSE_SWA_RETURN_IF_ERROR(rows.status());
  std::unique_ptr<MetadataBuilder> builder(new MetadataBuilder(config, derived, backend));
  builder->rows_ = std::move(rows).value();
  try {
    auto host = std::make_unique<detail::BuilderHost>();
    const size_t max_tokens = static_cast<size_t>(config.max_num_batched_tokens);
    const size_t max_seqs = static_cast<size_t>(config.max_num_seqs);
    if (derived.widens_images) {
      host->span_indptr.assign(max_seqs + 1, 0);
      host->span_starts.assign(max_tokens, 0);
      host->span_ends.assign(max_tokens, 0);
    }
    host->prefill_seq_lens.assign(max_seqs, 0);
    host->prefill_query_lens.assign(max_seqs, 0);
    builder->rows_->add_owned_buffers(&host->owned);
    host->owned.add(host->prefill_seq_lens.data(), sizeof(int32_t) * max_seqs,
                    "prefill_seq_lens_host");
    host->owned.add(host->prefill_query_lens.data(), sizeof(int32_t) * max_seqs,
                    "prefill_query_lens_host");
    host->owned.seal();
    builder->host_ = std::move(host);
  } catch (const std::bad_alloc&) {
    return unavailable(
        "MetadataBuilder::create: out of host memory for the persistent buffers "
        "(max_num_batched_tokens = ",
        config.max_num_batched_tokens, ")");
  }
  return builder;
}

Status MetadataBuilder::prepare_build(const BatchInput& b, detail::RowsPlan* plan,
                                      SwaMetadata* md) {
  detail::BuilderHost& h = *host_;
  const bool on_device = backend_ == Backend::kCuda;
  if (on_device) SPARSE_SWA_RETURN_IF_ERROR(check_host_copies_given(b));
  SPARSE_SWA_RETURN_IF_ERROR(detail::check_batch_outside(b, h.owned));
  SPARSE_SWA_RETURN_IF_ERROR(
      detail::check_batch(config_, derived_, b, /*arrays_on_host=*/!on_device, &plan->split));
  h.spans = {h.span_indptr.data(), h.span_starts.data(), h.span_ends.data(),
             config_.max_num_batched_tokens, 0};
  // A builder that does not widen ignores the spans: neither read nor checked
  // (docs/semantics.md#image-widening-switch).
  if (config_.widen_image_spans) {
    SPARSE_SWA_RETURN_IF_ERROR(detail::build_span_csr(b.image_spans, detail::host_seq_lens(b),
                                                      config_.max_image_tokens, &h.spans));
  }
  plan->spans = &h.spans;
  plan->with_image =
      derived_.widens_images && plan->split.num_prefill_tokens > 0 && h.spans.count > 0;
  plan->decode_width = b.causal ? config_.window_size : derived_.noncausal_index_width;
  *md = detail::step_metadata_scalars(config_, derived_, b, plan->split, space_of(backend_));
  return Status::Ok();
}

void MetadataBuilder::finish_build(const BatchInput& b, const detail::RowsPlan& plan,
                                   SwaMetadata* md) {
  detail::BuilderHost& h = *host_;
  const size_t rp = static_cast<size_t>(plan.split.num_prefills);
  detail::fill_prefill_host_plan(b, plan.split, h.prefill_seq_lens.data(),
                                 h.prefill_query_lens.data());
  md->prefill_seq_lens_host = {h.prefill_seq_lens.data(), rp};
  md->prefill_query_lens_host = {h.prefill_query_lens.data(), rp};
  h.last_build = {.decode_rows = md->decode_swa.data,
                  .decode_lens = md->decode_swa.lens,
                  .decode_width = md->decode_swa.width,
                  .noncausal = !b.causal,
                  .num_reqs = b.num_reqs(),
                  .num_tokens = b.num_tokens(),
                  .num_decodes = plan.split.num_decodes,
                  .num_decode_tokens = plan.split.num_decode_tokens};
}

Status MetadataBuilder::build(const BatchInput& b, SwaMetadata* out) {
  detail::RowsPlan plan;
  SwaMetadata md;
  SPARSE_SWA_RETURN_IF_ERROR(prepare_build(b, &plan, &md));
  SPARSE_SWA_RETURN_IF_ERROR(rows_->write_rows(b, plan, &md));
  // The rows are written (or enqueued): from here on nothing fails.
  finish_build(b, plan, &md);
  *out = md;
  return Status::Ok();
}

Status MetadataBuilder::build_groups(std::span<MetadataBuilder* const> builders,
                                     std::span<const BatchInput> batches,
                                     std::span<SwaMetadata> out) {
  const size_t n = builders.size();
  if (n == 0 || n > static_cast<size_t>(kMaxBuildGroups)) {
    return invalid_argument("builders: expected 1..", kMaxBuildGroups, " builders, got ", n);
  }
  if (batches.size() != n || out.size() != n) {
    return invalid_argument("batches: expected one batch and one output per builder (", n,
                            "), got ", batches.size(), " batches and ", out.size(), " outputs");
  }
  for (size_t g = 0; g < n; ++g) {
    if (builders[g] == nullptr) return invalid_argument("builders[", g, "]: got null");
    if (builders[g]->backend_ != builders[0]->backend_) {
      return invalid_argument("builders[", g, "]: expected the ",
                              backend_name(builders[0]->backend_), " backend of builders[0], got ",
                              backend_name(builders[g]->backend_));
    }
    if (builders[g]->rows_->stream() != builders[0]->rows_->stream()) {
      return invalid_argument("builders[", g,
                              "]: expected the CUDA stream of builders[0] (one launch writes every "
                              "group), got another");
    }
    for (size_t h = 0; h < g; ++h) {
      if (builders[h] == builders[g]) {
        return invalid_argument("builders[", g, "]: expected distinct builders, got builders[", h,
                                "] again (one builder's buffers hold one group)");
      }
    }
  }
  // Every group's checks before any group is written; a batch must also stay clear of the
  // other groups' outputs, which the same launch writes.
  std::array<detail::RowsPlan, kMaxBuildGroups> plans;
  std::array<SwaMetadata, kMaxBuildGroups> mds;
  for (size_t g = 0; g < n; ++g) {
    for (size_t h = 0; h < n; ++h) {
      if (h == g) continue;
      const Status outside = detail::check_batch_outside(batches[g], builders[h]->host_->owned);
      if (!outside.ok()) {
        return invalid_argument("batches[", g, "] against builders[", h, "]: ", outside.message());
      }
    }
    const Status prepared = builders[g]->prepare_build(batches[g], &plans[g], &mds[g]);
    if (!prepared.ok())
      return Status(prepared.code(), str_cat("batches[", g, "]: ", prepared.message()));
  }
  std::array<detail::BuilderRows*, kMaxBuildGroups> rows;
  for (size_t g = 0; g < n; ++g) rows[g] = builders[g]->rows_.get();
  SPARSE_SWA_RETURN_IF_ERROR(
      rows[0]->write_rows_groups({rows.data(), n}, batches, {plans.data(), n}, {mds.data(), n}));
  for (size_t g = 0; g < n; ++g) {
    builders[g]->finish_build(batches[g], plans[g], &mds[g]);
    out[g] = mds[g];
  }
  return Status::Ok();
}

Status MetadataBuilder::update_draft_decode_rows(const BatchInput& b, SwaMetadata* md) {
  detail::BuilderHost& h = *host_;
  const bool on_device = backend_ == Backend::kCuda;
  SPARSE_SWA_RETURN_IF_ERROR(
      detail::check_draft_update_target(md, h.last_build, space_of(backend_), b));
  SPARSE_SWA_RETURN_IF_ERROR(detail::check_batch_outside(b, h.owned));
  SPARSE_SWA_RETURN_IF_ERROR(
      detail::check_draft_update_batch(config_, derived_, b, /*arrays_on_host=*/!on_device));
  if (h.last_build.num_decode_tokens == 0) return Status::Ok();
  SPARSE_SWA_RETURN_IF_ERROR(rows_->update_decode_rows(b, h.last_build));
  md->tile_schedulers = derived_.layer_types;
  return Status::Ok();
}

Status MetadataBuilder::take_device_error() { return rows_->take_device_error(); }

void MetadataBuilder::set_cuda_stream(void* cuda_stream) { rows_->set_stream(cuda_stream); }

}  // namespace sparse_swa
