// Device memory for the cuda backend: CUDA's stream-ordered allocator (cudaMallocAsync / cudaFreeAsync) on one
// memory pool of the Device's own (cudaMemPoolCreate), which keeps what it maps (release threshold: all of it),
// so a training step that allocates and frees the same sizes maps no device memory once the first step has
// grown the pool, and no call here synchronizes the device.
//
// Order. An allocation is ordered on a stream (allocate(): the compute stream): work queued on that stream
// after the call may use it at once; other streams must first be ordered after that stream (an event). A free
// is ordered on a stream too: the memory returns to the pool when the stream gets there, and an allocation on
// the same stream reuses it at once, without waiting for anything. Memory freed on another stream is reused
// once that free has run (CUDA's default reuse rules: the allocating stream waits on the freeing stream's event
// or the free has completed); such frees also record an event here, for the out-of-memory path.
//
// Out of memory: when cudaMallocAsync fails, the pool (1) waits for the frees queued on other streams (their
// events only, never the device), (2) gives the pool's free memory back to the device (cudaMemPoolTrimTo), so
// the retry can map one range where free pieces were too small, (3) waits for the allocating stream itself and
// trims again; after each it tries once more. A last failure is a CudaError naming the request, what the pool
// holds (reserved, used, their high-water marks), zero3's bytes in use and the device's free memory.
//
// Threads: every member may be called from any thread; a mutex protects the bookkeeping. Statistics are
// exact at any moment.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace zero3::detail {

struct DevicePoolStats {
  int64_t bytes_in_use = 0;  // requested bytes of live allocations
  int64_t peak_bytes_in_use = 0;
  int64_t bytes_reserved = 0;          // device memory the pool has mapped (cudaMemPoolAttrReservedMemCurrent)
  int64_t peak_bytes_reserved = 0;     // its high-water mark (cudaMemPoolAttrReservedMemHigh)
  int64_t bytes_used = 0;              // of it, allocated and not yet freed in stream order (UsedMemCurrent)
  int64_t peak_bytes_used = 0;         // (UsedMemHigh)
  int64_t allocations = 0;             // allocate() calls that returned memory
  int64_t device_allocations = 0;      // of which made the pool map more device memory
  int64_t frees_on_other_streams = 0;  // frees ordered on another stream than the block's allocation
  int64_t out_of_memory_retries = 0;   // allocations that failed, freed memory up and tried again
  int64_t trims = 0;                   // times the pool gave its free memory back to the device
};

class DevicePool {
 public:
  // A pool on CUDA device `device` whose allocate() orders its memory on `compute` (cudaStreamLegacy or the
  // caller's stream). Throws CudaError when the device has no stream-ordered pools or CUDA refuses one.
  DevicePool(int device, cudaStream_t compute);
  // Live blocks are logged (a leak in the caller) and stay valid; the pool is released once they are freed.
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // At least 256-byte aligned; nullptr for 0 bytes. Ordered on the compute stream, or on `stream`. Throws
  // CudaError.
  void* allocate(size_t bytes);
  void* allocate(size_t bytes, cudaStream_t stream);
  // `bytes` as passed to allocate(); freed on the stream it was allocated on. Unknown pointers are logged and
  // ignored (this runs in destructors).
  void deallocate(void* ptr, size_t bytes) noexcept;
  // Freed in the order of `stream`, after the work queued there so far.
  void deallocate_after(void* ptr, size_t bytes, cudaStream_t stream) noexcept;

  // Gives the pool's free memory back to the device, after the frees queued on other streams than the compute
  // stream (memory still to be freed on the compute stream stays mapped until it gets there).
  void trim();

  // stats(), with the pool's own figures (reserved, used) read from CUDA.
  DevicePoolStats stats();
  int64_t bytes_in_use();
  int64_t peak_bytes_in_use();
  int device() const { return device_; }
  cudaStream_t compute() const { return compute_; }

 private:
  struct Live {
    size_t bytes;
    cudaStream_t stream;  // where it was allocated
  };

  // With mu_ held.
  cudaError_t try_alloc_locked(void** ptr, size_t bytes, cudaStream_t stream);
  void wait_frees_on_other_streams_locked();
  void trim_locked();
  int64_t pool_attribute(cudaMemPoolAttr attr) const;
  std::string where() const;

  const int device_;
  const cudaStream_t compute_;
  cudaMemPool_t pool_ = nullptr;
  std::mutex mu_;
  std::unordered_map<void*, Live> live_;
  std::vector<cudaEvent_t> other_stream_frees_;  // recorded after a free on another stream, not seen done yet
  std::vector<cudaEvent_t> idle_events_;
  int64_t last_reserved_ = 0;  // the pool's reserved bytes after the last allocation or trim
  DevicePoolStats stats_;
};

}  // namespace zero3::detail
