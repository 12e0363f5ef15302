#include "device/cuda/pinned_host.hpp"

#include "device/cuda/pinned_host_cache.hpp"

namespace zero3::detail {
namespace {

PinnedHostCache& pinned_pool() {
  // Never destroyed: host memory is returned by the process's exit, and a static destructor would run
  // after the CUDA runtime has unloaded.
  static PinnedHostCache* pool = [] {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) {
      cudaGetLastError();
      device = 0;
    }
    return new PinnedHostCache(device);
  }();
  return *pool;
}

}  // namespace

void* pinned_host_allocate(size_t bytes) { return pinned_pool().allocate(bytes); }

void pinned_host_deallocate(void* ptr, size_t bytes) noexcept { pinned_pool().deallocate(ptr, bytes); }

void pinned_host_deallocate_after(void* ptr, size_t bytes, Stream stream) noexcept {
  pinned_pool().deallocate_after(ptr, bytes, stream);
}

PinnedHostCacheStats pinned_host_stats() { return pinned_pool().stats(); }

void pinned_host_empty_cache() { pinned_pool().empty_cache(); }

}  // namespace zero3::detail
