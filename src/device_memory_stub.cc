// Device memory entry points of a CPU-only build: every call reports that there is no CUDA
// backend. CUDA builds use src/cuda/device_memory.cc instead.
#if !SPARSE_SWA_HAS_CUDA
#include <cstddef>

#include "sparse_swa/status.h"

namespace sparse_swa::detail {

namespace {
Status no_cuda() {
  return unavailable("device memory: this build of sparse_swa has no CUDA backend");
}
}  // namespace

Status device_alloc(void** ptr, size_t) {
  *ptr = nullptr;
  return no_cuda();
}
void device_free(void*) {}
Status copy_host_to_device(void*, const void*, size_t) { return no_cuda(); }
Status copy_device_to_host(void*, const void*, size_t) { return no_cuda(); }

}  // namespace sparse_swa::detail
#endif
