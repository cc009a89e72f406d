// SPDX-License-Identifier: Apache-2.0
// SwaMetadata for Python: the reference DeepseekSparseSWAMetadata's field names over arrays that
// alias the builder's persistent buffers (valid until that builder's next build()).
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "array_input.h"
#include "batch_arrays.h"
#include "sparse_swa/metadata.h"
#include "sparse_swa/metadata_builder.h"

namespace sparse_swa::python {

namespace nb = nanobind;

struct PyMetadata {
  SwaMetadata md;
  nb::object builder;               // the Python MetadataBuilder; None for a copy()
  MetadataBuilder* impl = nullptr;  // the backend that built `md`; null for a copy()
  uint64_t generation = 0;          // that backend's build count when `md` was built
  std::shared_ptr<const uint64_t> backend_generation;  // that backend's build count now
  int32_t block_size = 0;
  Place place;                  // where the batch arrays (and device outputs) live
  void* cuda_stream = nullptr;  // the builder's default stream (the consumers' default)
  Framework device_framework = Framework::kNumpy;
  Framework host_framework = Framework::kNumpy;
  BatchObjects inputs;
  // The arrays of the field list (metadata_fields.h; an index view gives two), exported lazily.
  std::vector<nb::object> arrays;
  std::vector<std::vector<int32_t>> owned_host_arrays;  // copy(): the host arrays, owned
  nb::dict tile_sched;                                  // layer type name -> scheduler object
  nb::dict flashinfer_sparse_index_cache;

  // ValueError unless this is the metadata of its builder's last build() on that backend (a
  // later build rewrote the buffers it reads). A copy() owns what it reads and always passes.
  void expect_current() const;
  // Array `which` of the field list's arrays (or None), exported on first use and cached.
  nb::object array(size_t which);
  // A detached snapshot: every array copied by its framework, host lens owned.
  PyMetadata copy();
};

void bind_metadata(nb::module_& m);

}  // namespace sparse_swa::python
