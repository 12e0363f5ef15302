// The Device members with a default: what a device whose work completes in the call (cpu) does.
#include <cstdlib>

#include "device/device_kernels.hpp"
#include "zero3/device.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3 {
namespace {

constexpr size_t kHostAlignment = 64;

class ImmediateStream final : public DeviceStream {
 public:
  Stream get() const override { return nullptr; }
  void synchronize() override {}
};

class ImmediateEvent final : public DeviceEvent {
 public:
  void record(Stream) override {}
  void wait_on(Stream) override {}
  void synchronize() override {}
  bool done() override { return true; }
};

}  // namespace

void Device::deallocate_after(void* ptr, size_t bytes, Stream) noexcept { deallocate(ptr, bytes); }

void* Device::allocate_host(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = std::aligned_alloc(kHostAlignment, (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment);
  if (p == nullptr) throw Error(log::concat(name(), ": cannot allocate ", bytes, " bytes of host memory"));
  return p;
}

void Device::deallocate_host(void* ptr, size_t) noexcept { std::free(ptr); }

void Device::deallocate_host_after(void* ptr, size_t bytes, Stream) noexcept { deallocate_host(ptr, bytes); }

std::unique_ptr<DeviceStream> Device::make_stream() { return std::make_unique<ImmediateStream>(); }

std::unique_ptr<DeviceEvent> Device::make_event() { return std::make_unique<ImmediateEvent>(); }

namespace detail {

DeviceKernels& kernels_of(Device& device) {
  auto* backend = dynamic_cast<DeviceBackend*>(&device);
  if (backend == nullptr) {
    throw InvalidArgument(log::concat("device \"", device.name(),
                                      "\" is not one of zero3's devices (make_device, make_cpu_device): the engine "
                                      "runs its element kernels on those only"));
  }
  return backend->kernels();
}

}  // namespace detail
}  // namespace zero3
