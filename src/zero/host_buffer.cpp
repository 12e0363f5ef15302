#include "zero/host_buffer.hpp"

#include <cstdlib>

#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {
namespace {

constexpr size_t kPageableAlignment = 64;

}  // namespace

HostBuffer::HostBuffer(Device& device, HostMemory kind, MemoryCounters& counters, MemoryCategory category, size_t bytes)
    : device_(&device), kind_(kind), counters_(&counters), category_(category), bytes_(bytes) {
  if (bytes == 0) return;
  if (kind == HostMemory::pinned) {
    ptr_ = device.allocate_host(bytes);
  } else {
    const size_t rounded = (bytes + kPageableAlignment - 1) / kPageableAlignment * kPageableAlignment;
    ptr_ = std::aligned_alloc(kPageableAlignment, rounded);
    if (ptr_ == nullptr) {
      bytes_ = 0;
      throw Error(log::concat("engine: cannot allocate ", bytes, " bytes of host memory for ", to_string(category),
                              " (", counters.total(), " bytes of host memory already held by the engine)"));
    }
  }
  counters.add(category, static_cast<int64_t>(bytes));
}

void HostBuffer::reset_after(DeviceStream& stream) noexcept {
  if (ptr_ != nullptr && kind_ == HostMemory::pinned) {
    device_->deallocate_host_after(ptr_, bytes_, stream.get());
    counters_->add(category_, -static_cast<int64_t>(bytes_));
    ptr_ = nullptr;
    bytes_ = 0;
    return;
  }
  try {
    if (ptr_ != nullptr) stream.synchronize();
  } catch (const std::exception& e) {
    log::error("engine: waiting for a stream before freeing ", bytes_, " bytes of host memory: ", e.what(),
               "; the memory is kept");
    counters_->add(category_, -static_cast<int64_t>(bytes_));
    ptr_ = nullptr;
    bytes_ = 0;
    return;
  }
  reset();
}

void HostBuffer::reset() noexcept {
  if (ptr_ != nullptr) {
    if (kind_ == HostMemory::pinned) {
      device_->deallocate_host(ptr_, bytes_);
    } else {
      std::free(ptr_);
    }
    counters_->add(category_, -static_cast<int64_t>(bytes_));
  }
  ptr_ = nullptr;
  bytes_ = 0;
}

}  // namespace zero3::detail
