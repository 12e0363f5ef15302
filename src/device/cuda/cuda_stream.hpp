// Owning wrappers of CUDA streams and events.
//
// Streams are created non-blocking: they do not synchronize with CUDA's legacy default stream, so a library
// call that uses the default stream behind our back cannot serialize the engine's compute and
// communication streams. Ordering between streams is always explicit: record an event on the producer,
// make the consumer wait on it (cudaStreamWaitEvent: no host synchronization).
//
// Threads: a stream or an event may be used from any thread; recording the same event from two threads
// at once is the caller's race, as in CUDA.
#pragma once

#include <cuda_runtime.h>

#include "zero3/device.hpp"

namespace zero3::detail {

class CudaStream {
 public:
  // A non-blocking stream on `device`; `priority` as cudaStreamCreateWithPriority (lower is higher;
  // 0 is the default, greatest_priority() the most urgent). Throws CudaError.
  explicit CudaStream(int device, int priority = 0);
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  cudaStream_t get() const { return stream_; }
  Stream stream() const { return reinterpret_cast<Stream>(stream_); }
  int device() const { return device_; }
  void synchronize() const;
  bool idle() const;  // every queued operation has finished

  static int greatest_priority();

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
};

class CudaEvent {
 public:
  // `timing`: the event can be used with elapsed_ms (timing events cost more to record).
  explicit CudaEvent(int device, bool timing = false);
  ~CudaEvent();
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  cudaEvent_t get() const { return event_; }
  void record(cudaStream_t stream);
  // Work queued on `stream` after this call runs after the work the event last recorded.
  void make_wait(cudaStream_t stream) const;
  void synchronize() const;
  bool done() const;
  // Milliseconds from `start` to this event; both timing events, both completed.
  float elapsed_ms(const CudaEvent& start) const;

 private:
  int device_;
  cudaEvent_t event_ = nullptr;
};

}  // namespace zero3::detail
