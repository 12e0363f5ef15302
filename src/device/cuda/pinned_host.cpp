#include "device/cuda/pinned_host.hpp"

#include "device/cuda/caching_allocator.hpp"

namespace zero3::detail {
namespace {

CachingAllocator& pinned_pool() {
  // Never destroyed: host memory is returned by the process's exit, and a static destructor would run
  // after the CUDA runtime has unloaded.
  static CachingAllocator* pool = [] {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) {
      cudaGetLastError();
      device = 0;
    }
    return new CachingAllocator(device, MemoryKind::pinned_host);
  }();
  return *pool;
}

}  // namespace

void* pinned_host_allocate(size_t bytes) { return pinned_pool().allocate(bytes); }

void pinned_host_deallocate(void* ptr, size_t bytes) noexcept { pinned_pool().deallocate(ptr, bytes); }

void pinned_host_deallocate_after(void* ptr, size_t bytes, Stream stream) noexcept {
  pinned_pool().deallocate_after(ptr, bytes, stream);
}

CachingAllocatorStats pinned_host_stats() { return pinned_pool().stats(); }

void pinned_host_empty_cache() { pinned_pool().empty_cache(); }

}  // namespace zero3::detail
