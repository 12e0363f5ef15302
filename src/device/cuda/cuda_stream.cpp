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

void CudaStream::synchronize() const { ZERO3_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

bool CudaStream::idle() const {
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

void CudaEvent::record(cudaStream_t stream) { ZERO3_CUDA_CHECK(cudaEventRecord(event_, stream)); }

void CudaEvent::make_wait(cudaStream_t stream) const { ZERO3_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0)); }

void CudaEvent::synchronize() const { ZERO3_CUDA_CHECK(cudaEventSynchronize(event_)); }

bool CudaEvent::done() const {
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
