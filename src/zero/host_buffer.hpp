// An owning buffer of host memory for what the engine keeps off its device (offload from a GPU: the fp32
// master and Adam moments, parameter slices, the optimizer step's staging), counted in one memory category of
// the engine's host counters (MemoryStats::host_*).
//
// Two kinds: pinned (Device::allocate_host: page-locked on cuda, what asynchronous device<->host copies need)
// and pageable (64-byte aligned heap memory, for state only the host reads and writes, or when pin_memory is
// false). The contents are undefined after allocation.
//
// reset() frees at once: no device work may still be queued on the memory (synchronize the event of the last
// copy first). reset_after(stream) frees pinned memory once the work queued on `stream` has run. Allocation
// failure throws zero3::Error naming the size and the category.
#pragma once

#include <cstddef>
#include <utility>

#include "zero/device_buffer.hpp"
#include "zero3/device.hpp"

namespace zero3::detail {

enum class HostMemory { pinned, pageable };

class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(Device& device, HostMemory kind, MemoryCounters& counters, MemoryCategory category, size_t bytes);
  HostBuffer(HostBuffer&& o) noexcept { swap(o); }
  HostBuffer& operator=(HostBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      swap(o);
    }
    return *this;
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { reset(); }

  void reset() noexcept;
  // Pinned: reused once the work queued on `stream` so far has finished (no host wait). Pageable: waits for
  // `stream` first (a queued copy may still read the memory), then frees.
  void reset_after(DeviceStream& stream) noexcept;

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  bool allocated() const { return ptr_ != nullptr; }
  bool pinned() const { return kind_ == HostMemory::pinned; }

 private:
  void swap(HostBuffer& o) noexcept {
    std::swap(device_, o.device_);
    std::swap(kind_, o.kind_);
    std::swap(counters_, o.counters_);
    std::swap(category_, o.category_);
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
  }

  Device* device_ = nullptr;
  HostMemory kind_ = HostMemory::pageable;
  MemoryCounters* counters_ = nullptr;
  MemoryCategory category_ = MemoryCategory::buffers;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace zero3::detail
