#include "sparse_swa/metadata_builder.h"

#include <new>

#include "cpu/cpu_metadata_builder.h"

#if SPARSE_SWA_HAS_CUDA
#include "cuda/cuda_metadata_builder.h"
#endif

namespace sparse_swa {

const char* backend_name(Backend b) { return b == Backend::kCuda ? "cuda" : "cpu"; }

bool cuda_backend_available() {
#if SPARSE_SWA_HAS_CUDA
  return detail::cuda_device_usable();
#else
  return false;
#endif
}

StatusOr<std::unique_ptr<MetadataBuilder>> MetadataBuilder::create(const BuilderConfig& config,
                                                                   Backend backend,
                                                                   void* cuda_stream) {
  SPARSE_SWA_RETURN_IF_ERROR(validate_config(config));
  const DerivedConfig derived = derive_config(config);
  if (backend == Backend::kCpu) {
    try {
      return std::unique_ptr<MetadataBuilder>(new detail::CpuMetadataBuilder(config, derived));
    } catch (const std::bad_alloc&) {
      return unavailable(
          "MetadataBuilder::create: out of host memory for the persistent buffers "
          "(max_num_batched_tokens = ",
          config.max_num_batched_tokens, ")");
    }
  }
#if SPARSE_SWA_HAS_CUDA
  return detail::create_cuda_metadata_builder(config, derived, cuda_stream);
#else
  (void)cuda_stream;
  return unavailable(
      "backend cuda: this build of sparse_swa has no CUDA backend (configure with "
      "a CUDA toolkit and SPARSE_SWA_CUDA=ON)");
#endif
}

}  // namespace sparse_swa
