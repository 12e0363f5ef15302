// An owning buffer of device memory, counted in one memory category of the engine.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "zero3/device.hpp"
#include "zero3/memory_plan.hpp"

namespace zero3::detail {

// Bytes held per MemoryCategory, and the peak of their sum. Updated from any thread.
class MemoryCounters {
 public:
  static constexpr size_t kCategories = 6;

  void add(MemoryCategory c, int64_t bytes) {
    const auto i = static_cast<size_t>(c);
    raise(peaks_[i], bytes_[i].fetch_add(bytes) + bytes);
    raise(peak_total_, total_.fetch_add(bytes) + bytes);
  }
  int64_t bytes(MemoryCategory c) const { return bytes_[static_cast<size_t>(c)].load(); }
  int64_t peak(MemoryCategory c) const { return peaks_[static_cast<size_t>(c)].load(); }
  int64_t total() const { return total_.load(); }
  int64_t peak_total() const { return peak_total_.load(); }

 private:
  static void raise(std::atomic<int64_t>& peak, int64_t now) {
    int64_t seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
  }

  std::array<std::atomic<int64_t>, kCategories> bytes_{};
  std::array<std::atomic<int64_t>, kCategories> peaks_{};
  std::atomic<int64_t> total_{0};
  std::atomic<int64_t> peak_total_{0};
};

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Device& device, MemoryCounters& counters, MemoryCategory category, size_t bytes)
      : device_(&device), counters_(&counters), category_(category), bytes_(bytes) {
    ptr_ = device.allocate(bytes);
    counters.add(category, static_cast<int64_t>(bytes));
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept { swap(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      swap(o);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  void reset() noexcept {
    if (device_ != nullptr && bytes_ != 0) {
      // Work queued on the device's default stream (the engine's compute stream: its kernels and the user's)
      // may still use the memory: on cuda the block is reused only once that stream has passed this point.
      device_->deallocate_after(ptr_, bytes_, device_->default_stream());
      counters_->add(category_, -static_cast<int64_t>(bytes_));
    }
    ptr_ = nullptr;
    bytes_ = 0;
  }

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  bool allocated() const { return ptr_ != nullptr; }

 private:
  void swap(DeviceBuffer& o) noexcept {
    std::swap(device_, o.device_);
    std::swap(counters_, o.counters_);
    std::swap(category_, o.category_);
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
  }

  Device* device_ = nullptr;
  MemoryCounters* counters_ = nullptr;
  MemoryCategory category_ = MemoryCategory::buffers;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Byte offset of element `i` in a buffer of `t`.
inline void* element_ptr(void* base, DType t, int64_t i) {
  return static_cast<char*>(base) + static_cast<size_t>(i) * dtype_size(t);
}
inline const void* element_ptr(const void* base, DType t, int64_t i) {
  return static_cast<const char*>(base) + static_cast<size_t>(i) * dtype_size(t);
}

}  // namespace zero3::detail
