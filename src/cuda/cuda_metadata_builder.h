// The CUDA backend of MetadataBuilder (internal header: no CUDA headers needed to include it).
#pragma once

#include <cstdint>
#include <memory>

#include "sparse_swa/metadata_builder.h"

namespace sparse_swa::detail {

// True when the CUDA runtime reports at least one usable device.
bool cuda_device_usable();

StatusOr<std::unique_ptr<MetadataBuilder>> create_cuda_metadata_builder(
    const BuilderConfig& config, const DerivedConfig& derived, void* cuda_stream);

// Test hook: fills every persistent output buffer of a CUDA builder with `byte`, so that a
// check cannot pass on values left by an earlier build. Errors for a non-CUDA builder.
Status poison_cuda_builder_outputs(MetadataBuilder* builder, uint8_t byte);

}  // namespace sparse_swa::detail
