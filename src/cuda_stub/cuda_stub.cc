// SPDX-License-Identifier: Apache-2.0
// The CUDA entry points of src/backend.h in a CPU-only build (SPARSE_SWA_CUDA=OFF or no nvcc):
// no device, and every call returns UNAVAILABLE. CUDA builds link src/cuda/ instead.
#include "backend.h"

namespace sparse_swa::detail {

namespace {

constexpr const char* kConfigureHint = "(configure with a CUDA toolkit and SPARSE_SWA_CUDA=ON)";

Status no_cuda_backend() {
  return unavailable("backend cuda: this build of sparse_swa has no CUDA backend ", kConfigureHint);
}
Status no_device_memory() {
  return unavailable("device memory: this build of sparse_swa has no CUDA backend");
}
Status no_device_views(const char* entry_point) {
  return unavailable(entry_point, ": device views need the CUDA backend");
}
Status no_device_cache() {
  return unavailable(
      "cache.space: device memory needs the CUDA backend, and this build of sparse_swa has none ",
      kConfigureHint);
}

}  // namespace

bool cuda_device_usable() { return false; }
Status cuda_device_alloc(void** ptr, size_t) {
  *ptr = nullptr;
  return no_device_memory();
}
void cuda_device_free(void*) {}
bool cuda_stream_capturing(void*) { return false; }
Status cuda_copy_host_to_device(void*, const void*, size_t) { return no_device_memory(); }
Status cuda_copy_device_to_host(void*, const void*, size_t) { return no_device_memory(); }

StatusOr<std::unique_ptr<BuilderRows>> create_cuda_builder_rows(const BuilderConfig&,
                                                                const DerivedConfig&, void*) {
  return no_cuda_backend();
}
Status cuda_init_metadata_launch_probe(MetadataLaunchProbe*) { return no_cuda_backend(); }
Status cuda_launch_metadata_kernel_without_rows(const MetadataLaunchProbe&, void*, bool) {
  return no_cuda_backend();
}

Status cuda_encode_kv_rows(MatrixView<const float>, std::span<const int64_t>, const KvCacheView&,
                           const KvCodecOptions&) {
  return no_device_cache();
}
Status cuda_encode_kv_rows_bf16(MatrixView<const uint16_t>, std::span<const int64_t>,
                                const KvCacheView&, const KvCodecOptions&) {
  return no_device_cache();
}
Status cuda_decode_kv_rows(const ConstKvCacheView&, std::span<const int64_t>, MatrixView<float>,
                           const KvCodecOptions&) {
  return no_device_cache();
}

Status cuda_compressed_topk_to_global(const SwaMetadata&, int32_t, MatrixView<const int32_t>,
                                      const CompressedCache&, IndexView, void*) {
  return no_device_views("compressed_topk_to_global");
}
Status cuda_copy_global_topk(const SwaMetadata&, int32_t, ConstIndexView, IndexView, void*) {
  return no_device_views("copy_global_topk");
}
Status cuda_build_mixed_matrix(const ConsumerStep&, const CompressedTopk&, const MixedMatrixShape&,
                               MixedMatrixForm, IndexView, std::span<int32_t>, void*) {
  return no_device_views("build_mixed_matrix");
}
Status cuda_build_combined_prefill(const ConsumerStep&, const CombineChunk&,
                                   MatrixView<const int32_t>, IndexView, void*) {
  return no_device_views("build_combined_prefill");
}
Status cuda_to_ragged(const ConstIndexView&, const RaggedView&, void*) {
  return no_device_views("to_ragged");
}

Status cuda_sparse_attention(const SparseAttentionParams&, const AttentionOverrides&, void*) {
  return no_cuda_backend();
}
int64_t cuda_sparse_attention_workspace_bytes(const SparseAttentionParams&) { return 0; }
int64_t cuda_sparse_attention_max_workspace_bytes() { return 0; }
AttentionKernel cuda_sparse_attention_kernel(const SparseAttentionParams&) {
  return AttentionKernel::kAuto;
}
Status cuda_sparse_attention_from_host(const SparseAttentionParams&) { return no_cuda_backend(); }

}  // namespace sparse_swa::detail
