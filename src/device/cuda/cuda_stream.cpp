#include "device/cuda/cuda_stream.hpp"

#include "device/cuda/cuda_check.hpp"
#include "device/cuda/cuda_device_guard.hpp"

namespace zero3::detail {

CudaStream::CudaStream(int device, int priority) : device_(device) {
  CudaDeviceGuard guard(device);
  ZERO3_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority));
}

CudaStream::~CudaStream() {
  // Destroying a stream with queued work is allowed: CUDA finishes the work, then releases the stream.
  if (stream_ != nullptr && cudaStreamDestroy(stream_) != cudaSuccess) cudaGetLastError();
}

void CudaStream::synchronize() const {
  CudaDeviceGuard guard(device_);
  ZERO3_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

bool CudaStream::idle() const {
  CudaDeviceGuard guard(device_);
  cudaError_t e = cudaStreamQuery(stream_);
  if (e == cudaErrorNotReady) {
    cudaGetLastError();  // "not ready" is an answer, not an error to report later
    return false;
  }
  ZERO3_CUDA_CHECK(e);
  return true;
}

int CudaStream::greatest_priority() {
  int least = 0, greatest = 0;
  ZERO3_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  return greatest;
}

CudaEvent::CudaEvent(int device, bool timing) : device_(device) {
  CudaDeviceGuard guard(device);
  ZERO3_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
}

CudaEvent::~CudaEvent() {
  if (event_ != nullptr && cudaEventDestroy(event_) != cudaSuccess) cudaGetLastError();
}

// The event's device is made current for every call: cudaStreamLegacy (the default stream) names the legacy
// stream of the current device, and a thread whose current device is another one would otherwise record on, or
// make wait, that device's stream (a cross-device wait is legal, so nothing would fail: the ordering would be
// silently lost).
void CudaEvent::record(cudaStream_t stream) {
  CudaDeviceGuard guard(device_);
  ZERO3_CUDA_CHECK(cudaEventRecord(event_, stream));
}

void CudaEvent::make_wait(cudaStream_t stream) const {
  CudaDeviceGuard guard(device_);
  ZERO3_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0));
}

void CudaEvent::synchronize() const {
  CudaDeviceGuard guard(device_);
  ZERO3_CUDA_CHECK(cudaEventSynchronize(event_));
}

bool CudaEvent::done() const {
  CudaDeviceGuard guard(device_);
  cudaError_t e = cudaEventQuery(event_);
  if (e == cudaErrorNotReady) {
    cudaGetLastError();  // "not ready" is an answer, not an error to report later
    return false;
  }
  ZERO3_CUDA_CHECK(e);
  return true;
}

float CudaEvent::elapsed_ms(const CudaEvent& start) const {
  float ms = 0.0f;
  ZERO3_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
  return ms;
}

}  // namespace zero3::detail
