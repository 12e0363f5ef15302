#include "stream_order.hpp"

#include <c10/core/Device.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/version.h>

#include <string>

#include "zero3/build_config.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

#if ZERO3_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace zero3::libtorch::detail {
namespace {

// libtorch's CUDA implementation of the interface, registered when its CUDA library is loaded; null without.
const c10::impl::DeviceGuardImplInterface* torch_cuda() {
  if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) return nullptr;
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
}

c10::Device torch_device(const Device& device) {
  return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device.index()));
}

#if ZERO3_HAVE_CUDA
void check_cuda(cudaError_t status, const char* call, const Device& device) {
  if (status == cudaSuccess) return;
  throw CudaError(std::string("zero3::libtorch: ") + call + " on " + device.name() +
                  " failed: " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
}

// The calling thread's current device is the engine's while it lives (the engine's stream may be CUDA's legacy
// default stream, which is per device).
class OnDevice {
 public:
  explicit OnDevice(const Device& device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice", device);
    if (previous_ != device.index()) check_cuda(cudaSetDevice(device.index()), "cudaSetDevice", device);
  }
  ~OnDevice() { (void)cudaSetDevice(previous_); }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  int previous_ = 0;
};
#endif

}  // namespace

void check_torch_device(const Device& device) {
  if (device.type() != DeviceType::cuda) return;
  const std::string what = "zero3::libtorch::ShardedModel: the engine's device is " + device.name();
  const c10::impl::DeviceGuardImplInterface* cuda = torch_cuda();
  if (cuda == nullptr) {
    throw Unsupported(what + ", but this libtorch (" + TORCH_VERSION +
                      ") was built without CUDA: its tensors cannot live in CUDA memory. Build against a CUDA build "
                      "of libtorch (the PyPI wheel's, with -DTorch_DIR=<its share/cmake/Torch>), or train on the cpu "
                      "device (the config's zero3.device: \"cpu\")");
  }
#if !ZERO3_HAVE_CUDA
  throw Unsupported(what + ", but this zero3 was built without CUDA (ZERO3_CUDA off)");
#else
  const int seen = cuda->deviceCount();
  if (device.index() < 0 || device.index() >= seen) {
    throw Unsupported(what + ", but libtorch (" + TORCH_VERSION + ") sees " + std::to_string(seen) +
                      " CUDA device(s) (CUDA_VISIBLE_DEVICES, or a libtorch built for another CUDA than the driver's)");
  }
#endif
}

#if ZERO3_HAVE_CUDA

struct StreamOrder::Events {
  cudaEvent_t engine_mark = nullptr;  // recorded on the engine's stream, waited for on torch's
  cudaEvent_t torch_mark = nullptr;   // recorded on torch's stream (through libtorch), waited for on the engine's
};

StreamOrder::StreamOrder(Device& device) : device_(device), events_(std::make_unique<Events>()) {
  check_torch_device(device_);
  OnDevice on(device_);
  check_cuda(cudaEventCreateWithFlags(&events_->engine_mark, cudaEventDisableTiming), "cudaEventCreateWithFlags",
             device_);
  check_cuda(cudaEventCreateWithFlags(&events_->torch_mark, cudaEventDisableTiming), "cudaEventCreateWithFlags",
             device_);
}

StreamOrder::~StreamOrder() {
  for (cudaEvent_t e : {events_->engine_mark, events_->torch_mark}) {
    if (e == nullptr) continue;
    const cudaError_t status = cudaEventDestroy(e);
    if (status != cudaSuccess) {
      log::error("zero3::libtorch: cudaEventDestroy on ", device_.name(), " failed: ", cudaGetErrorString(status));
    }
  }
}

void StreamOrder::torch_after_engine() {
  {
    OnDevice on(device_);
    check_cuda(cudaEventRecord(events_->engine_mark, device_.default_stream()), "cudaEventRecord", device_);
  }
  const c10::impl::DeviceGuardImplInterface* cuda = torch_cuda();
  cuda->block(events_->engine_mark, cuda->getStream(torch_device(device_)));
}

void StreamOrder::engine_after_torch() {
  const c10::impl::DeviceGuardImplInterface* cuda = torch_cuda();
  void* mark = events_->torch_mark;  // libtorch records the event given (it creates one only for a null pointer)
  cuda->record(&mark, cuda->getStream(torch_device(device_)), static_cast<c10::DeviceIndex>(device_.index()),
               c10::EventFlag::PYTORCH_DEFAULT);
  OnDevice on(device_);
  check_cuda(cudaStreamWaitEvent(device_.default_stream(), events_->torch_mark, 0), "cudaStreamWaitEvent", device_);
}

#else  // A zero3 without CUDA has no cuda device: check_torch_device() refuses one.

struct StreamOrder::Events {};

StreamOrder::StreamOrder(Device& device) : device_(device) { check_torch_device(device_); }
StreamOrder::~StreamOrder() = default;
void StreamOrder::torch_after_engine() {}
void StreamOrder::engine_after_torch() {}

#endif

}  // namespace zero3::libtorch::detail
