// Torch's current CUDA stream against the engine's compute stream, for a model whose parameters and gradients are
// views of the engine's device memory.
//
// The engine computes on its device's compute stream (Device::default_stream()): a unit's gathered parameters and
// its zeroed gradient buffer are ready there once its scope is open, and it reads the gradients and reuses the
// memory there once the scope closes. Torch queues the model's kernels on its own current stream of that device,
// which may be another. So, around every use of a scope's memory by torch: after the scope opens, torch's stream
// waits for an event recorded on the engine's stream; before it closes, the engine's stream waits for an event
// recorded on torch's stream. Neither blocks the host.
//
// It is written against c10's device-independent interface (c10/core/impl/DeviceGuardImplInterface.h: torch's
// current stream, and events recorded and waited for on torch's streams, which for CUDA are cudaEvent_t), and the
// CUDA runtime for the engine's side. So it compiles against any libtorch, including builds without CUDA (which
// have no c10_cuda library to link), and it runs where libtorch has CUDA. Where it has not, check_torch_device()
// says so instead.
#pragma once

#include <memory>

#include "zero3/device.hpp"

namespace zero3::libtorch::detail {

// Throws Unsupported, naming the device and the reason, when torch cannot compute on `device`: a cuda device with a
// libtorch built without CUDA, a zero3 built without CUDA, or a device index that torch does not see. Nothing for
// the cpu device.
void check_torch_device(const Device& device);

class StreamOrder {
 public:
  // `device` must be a cuda device that check_torch_device() accepted; it must outlive this object.
  explicit StreamOrder(Device& device);
  ~StreamOrder();
  StreamOrder(const StreamOrder&) = delete;
  StreamOrder& operator=(const StreamOrder&) = delete;

  // Work torch queues on its current stream from now on runs after the work queued on the engine's stream so far.
  void torch_after_engine();
  // Work queued on the engine's stream from now on runs after the work torch queued on its current stream so far.
  void engine_after_torch();

 private:
  struct Events;
  Device& device_;
  std::unique_ptr<Events> events_;
};

}  // namespace zero3::libtorch::detail
