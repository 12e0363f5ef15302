#include "device/cuda/device_pool.hpp"

#include <cstdint>
#include <optional>

#include "device/cuda/cuda_check.hpp"
#include "device/cuda/cuda_device_guard.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {

DevicePool::DevicePool(int device, cudaStream_t compute) : device_(device), compute_(compute) {
  CudaDeviceGuard guard(device);
  int supported = 0;
  ZERO3_CUDA_CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device));
  if (supported == 0) {
    throw CudaError(log::concat(where(),
                                ": CUDA reports no stream-ordered memory pools on this device "
                                "(cudaDevAttrMemoryPoolsSupported = 0); zero3 allocates device memory "
                                "from one (CUDA 11.2 or later, a driver with cudaMallocAsync)"));
  }
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  ZERO3_CUDA_CHECK(cudaMemPoolCreate(&pool_, &props));
  // Keep everything the pool maps: by default it gives its free memory back at every synchronization, and each
  // step would map it again.
  uint64_t keep = UINT64_MAX;
  if (cudaError_t e = cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep); e != cudaSuccess) {
    std::string what = cuda_error_detail(e);
    cudaMemPoolDestroy(pool_);
    cudaGetLastError();
    throw CudaError(log::concat(where(), ": setting the memory pool's release threshold failed: ", what));
  }
}

DevicePool::~DevicePool() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!live_.empty()) {
    log::warn(where(), ": ", live_.size(), " allocations (", stats_.bytes_in_use,
              " bytes) still live when the device was destroyed; they are not freed");
  }
  // At process exit the CUDA runtime may already be gone; every call below then fails harmlessly.
  std::optional<CudaDeviceGuard> guard;
  try {
    guard.emplace(device_);
  } catch (const std::exception&) {
    cudaGetLastError();
  }
  // An event destroyed before it completes is released when it does.
  for (cudaEvent_t e : other_stream_frees_) cudaEventDestroy(e);
  for (cudaEvent_t e : idle_events_) cudaEventDestroy(e);
  // Returns at once; CUDA releases the pool when its last allocation and queued free are gone.
  cudaMemPoolDestroy(pool_);
  cudaGetLastError();
}

std::string DevicePool::where() const { return log::concat("cuda:", device_); }

int64_t DevicePool::pool_attribute(cudaMemPoolAttr attr) const {
  uint64_t value = 0;
  if (cudaMemPoolGetAttribute(pool_, attr, &value) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return static_cast<int64_t>(value);
}

cudaError_t DevicePool::try_alloc_locked(void** ptr, size_t bytes, cudaStream_t stream) {
  cudaError_t e = cudaMallocFromPoolAsync(ptr, bytes, pool_, stream);
  if (e == cudaErrorMemoryAllocation) cudaGetLastError();  // an answer, not an error to report later
  return e;
}

void* DevicePool::allocate(size_t bytes) { return allocate(bytes, compute_); }

void* DevicePool::allocate(size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  CudaDeviceGuard guard(device_);
  void* ptr = nullptr;
  cudaError_t e = try_alloc_locked(&ptr, bytes, stream);
  size_t waited = 0;
  if (e == cudaErrorMemoryAllocation) {
    // No device-wide synchronization: first the frees queued on other streams (their events), then the pool's
    // free memory back to the device (a range too fragmented for this request may fit once mapped anew), then
    // the allocating stream's own queued frees.
    ++stats_.out_of_memory_retries;
    waited = other_stream_frees_.size();
    wait_frees_on_other_streams_locked();
    e = try_alloc_locked(&ptr, bytes, stream);
    if (e == cudaErrorMemoryAllocation) {
      trim_locked();
      e = try_alloc_locked(&ptr, bytes, stream);
    }
    if (e == cudaErrorMemoryAllocation && cudaStreamSynchronize(stream) == cudaSuccess) {
      trim_locked();
      e = try_alloc_locked(&ptr, bytes, stream);
    }
  }
  if (e != cudaSuccess) {
    std::string what = cuda_error_detail(e);
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    cudaGetLastError();
    throw CudaError(log::concat(
        where(), ": cannot allocate ", bytes, " bytes from zero3's stream-ordered memory pool: ", what, "; the pool ",
        "holds ", pool_attribute(cudaMemPoolAttrReservedMemCurrent), " bytes reserved, ",
        pool_attribute(cudaMemPoolAttrUsedMemCurrent), " of them in use (high-water: ",
        pool_attribute(cudaMemPoolAttrReservedMemHigh), " reserved, ", pool_attribute(cudaMemPoolAttrUsedMemHigh),
        " in use), zero3 holds ", stats_.bytes_in_use, " bytes in ", live_.size(), " allocations",
        e == cudaErrorMemoryAllocation
            ? log::concat("; after waiting for ", waited,
                          " frees queued on other streams and for the allocating stream, and giving the pool's free "
                          "memory back to the device, it reports ")
            : std::string("; the device reports "),
        free_bytes, " of ", total_bytes, " bytes free"));
  }
  live_.emplace(ptr, Live{bytes, stream});
  ++stats_.allocations;
  stats_.bytes_in_use += static_cast<int64_t>(bytes);
  if (stats_.bytes_in_use > stats_.peak_bytes_in_use) stats_.peak_bytes_in_use = stats_.bytes_in_use;
  const int64_t reserved = pool_attribute(cudaMemPoolAttrReservedMemCurrent);
  if (reserved > last_reserved_) ++stats_.device_allocations;
  last_reserved_ = reserved;
  return ptr;
}

void DevicePool::deallocate(void* ptr, size_t bytes) noexcept {
  if (ptr == nullptr) return;
  cudaStream_t stream = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(ptr);
    if (it != live_.end()) stream = it->second.stream;
  }
  deallocate_after(ptr, bytes, stream != nullptr ? stream : compute_);
}

void DevicePool::deallocate_after(void* ptr, size_t bytes, cudaStream_t stream) noexcept {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) {
    log::error(where(), ": deallocate of ", ptr, " (", bytes,
               " bytes), which this device did not allocate or already freed; ignored");
    return;
  }
  if (it->second.bytes != bytes) {
    log::error(where(), ": deallocate of ", ptr, " with ", bytes, " bytes, but it was allocated with ",
               it->second.bytes, " bytes; counting the allocated size");
  }
  stats_.bytes_in_use -= static_cast<int64_t>(it->second.bytes);
  live_.erase(it);
  try {
    // With the pool's device current: `stream` may be the legacy default stream, which means the current
    // device's.
    CudaDeviceGuard guard(device_);
    ZERO3_CUDA_CHECK(cudaFreeAsync(ptr, stream));
    if (stream == compute_) return;
    ++stats_.frees_on_other_streams;
    // Events of earlier such frees that are done go back to the idle list (a query, never a wait).
    size_t kept = 0;
    for (cudaEvent_t e : other_stream_frees_) {
      cudaError_t q = cudaEventQuery(e);
      if (q == cudaErrorNotReady) {
        cudaGetLastError();
        other_stream_frees_[kept++] = e;
      } else {
        if (q != cudaSuccess) cudaGetLastError();
        idle_events_.push_back(e);
      }
    }
    other_stream_frees_.resize(kept);
    cudaEvent_t event = nullptr;
    if (!idle_events_.empty()) {
      event = idle_events_.back();
      idle_events_.pop_back();
    } else {
      ZERO3_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    }
    other_stream_frees_.push_back(event);
    ZERO3_CUDA_CHECK(cudaEventRecord(event, stream));
  } catch (const std::exception& e) {
    // The free itself is queued or the block is lost; either way nothing here can be retried safely.
    log::error(where(), ": freeing ", bytes, " bytes in stream order: ", e.what());
    cudaGetLastError();
  }
}

void DevicePool::wait_frees_on_other_streams_locked() {
  for (cudaEvent_t e : other_stream_frees_) {
    if (cudaEventSynchronize(e) != cudaSuccess) cudaGetLastError();  // a failed stream frees nothing more
    idle_events_.push_back(e);
  }
  other_stream_frees_.clear();
}

void DevicePool::trim_locked() {
  wait_frees_on_other_streams_locked();
  if (cudaMemPoolTrimTo(pool_, 0) != cudaSuccess) cudaGetLastError();
  ++stats_.trims;
  last_reserved_ = pool_attribute(cudaMemPoolAttrReservedMemCurrent);
}

void DevicePool::trim() {
  std::lock_guard<std::mutex> lock(mu_);
  CudaDeviceGuard guard(device_);
  trim_locked();
}

int64_t DevicePool::bytes_in_use() {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_.bytes_in_use;
}

int64_t DevicePool::peak_bytes_in_use() {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_.peak_bytes_in_use;
}

DevicePoolStats DevicePool::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  DevicePoolStats s = stats_;
  s.bytes_reserved = pool_attribute(cudaMemPoolAttrReservedMemCurrent);
  s.peak_bytes_reserved = pool_attribute(cudaMemPoolAttrReservedMemHigh);
  s.bytes_used = pool_attribute(cudaMemPoolAttrUsedMemCurrent);
  s.peak_bytes_used = pool_attribute(cudaMemPoolAttrUsedMemHigh);
  return s;
}

}  // namespace zero3::detail
