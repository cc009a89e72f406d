// SwaMetadata for Python: the reference DeepseekSparseSWAMetadata's field names over arrays that
// alias the builder's persistent buffers (valid until that builder's next build()).
#pragma once

#include <nanobind/nanobind.h>

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "array_input.h"
#include "batch_arrays.h"
#include "sparse_swa/metadata.h"
#include "sparse_swa/metadata_builder.h"

namespace sparse_swa::python {

namespace nb = nanobind;

enum class MetadataArray : int {
  kDecodeSwaIndices,     // [Td, 1, decode_swa_width] int32
  kDecodeSwaLens,        // [Td] int32
  kPrefillSwaIndices,    // [Tp, 1, W + Mi] int32, None when Tp == 0
  kPrefillSwaLens,       // [Tp] int32, None when Tp == 0
  kLeftVisible,          // [T] int32, None unless the image path ran
  kRightVisible,         // [T] int32, None unless the image path ran
  kGatherLens,           // [Rp] int32, None when Rp == 0
  kPrefillSeqLensCpu,    // [Rp] int32 host, None when Rp == 0
  kPrefillQueryLensCpu,  // [Rp] int32 host, None when Rp == 0
  kTokenToReq,           // [T] int32
  kIsValidToken,         // [T] bool
  kCount,
};

struct PyMetadata {
  SwaMetadata md;
  nb::object builder;               // the Python MetadataBuilder; None for a copy()
  MetadataBuilder* impl = nullptr;  // the backend that built `md`; null for a copy()
  uint64_t generation = 0;          // that backend's build count when `md` was built
  std::shared_ptr<const uint64_t> backend_generation;  // that backend's build count now
  int32_t block_size = 0;
  Place place;  // where the batch arrays (and device outputs) live
  Framework device_framework = Framework::kNumpy;
  Framework host_framework = Framework::kNumpy;
  BatchObjects inputs;
  std::array<nb::object, static_cast<int>(MetadataArray::kCount)> arrays;  // exported lazily
  std::vector<int32_t> owned_host_lens;  // copy(): [2 * Rp] prefill seq lens then query lens
  nb::dict tile_sched;                   // layer type name -> scheduler object
  nb::dict flashinfer_sparse_index_cache;

  // ValueError unless this is the metadata of its builder's last build() on that backend (a
  // later build rewrote the buffers it reads). A copy() owns what it reads and always passes.
  void expect_current() const;
  // The array (or None), exported on first use and cached.
  nb::object array(MetadataArray which);
  // A detached snapshot: every array copied by its framework, host lens owned.
  PyMetadata copy();
};

void bind_metadata(nb::module_& m);

}  // namespace sparse_swa::python
