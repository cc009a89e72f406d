// MetadataBuilder's front end: validates the config, then creates the backend asked for.
#include "sparse_swa/metadata_builder.h"

#include "backend.h"

namespace sparse_swa {

const char* backend_name(Backend b) { return b == Backend::kCuda ? "cuda" : "cpu"; }

bool cuda_backend_available() { return detail::cuda_device_usable(); }

StatusOr<std::unique_ptr<MetadataBuilder>> MetadataBuilder::create(const BuilderConfig& config,
                                                                   Backend backend,
                                                                   void* cuda_stream) {
  SPARSE_SWA_RETURN_IF_ERROR(validate_config(config));
  const DerivedConfig derived = derive_config(config);
  if (backend == Backend::kCpu) return detail::create_cpu_metadata_builder(config, derived);
  return detail::create_cuda_metadata_builder(config, derived, cuda_stream);
}

}  // namespace sparse_swa
