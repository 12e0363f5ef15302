// The cuda Device: device memory from CUDA's stream-ordered pool, copies and fills ordered on streams, and the
// engine's element kernels launched from the single-source element functions. Registered as "cuda"
// ("cuda:N" picks device N); make_device("auto") picks it when a device is usable.
//
// Streams: the device computes on one stream, the compute stream: the caller's when it was made with one
// (make_device(name, stream); the caller keeps it alive), else CUDA's legacy default stream. Every operation
// takes a Stream; nullptr means the compute stream, and copy(), move() and fill_zero() with nullptr return only
// when the operation has finished (the Device contract). make_stream() gives non-blocking streams (they do not
// wait for the legacy default stream); order them with make_event(): record on the producer, wait_on the
// consumer.
// Memory: one stream-ordered pool (device_pool.hpp) per device: allocate() is ordered on the compute stream and
// reuses what frees on that stream gave back without any wait; nothing here calls cudaMalloc or cudaFree, and
// the pool maps device memory only while it grows. Memory that queued work may still use is freed with
// deallocate_after().
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "device/cuda/cuda_device_kernels.hpp"
#include "device/cuda/device_pool.hpp"
#include "device/device_kernels.hpp"
#include "zero3/device.hpp"

namespace zero3::detail {

class CudaDevice final : public DeviceBackend {
 public:
  // Throws CudaError "cuda:N: no CUDA device: <CUDA's message>" when CUDA finds no device, and
  // InvalidArgument when N is past the last device or `compute_stream` belongs to another device.
  // `compute_stream`: the caller's stream to compute on; nullptr: CUDA's legacy default stream.
  explicit CudaDevice(int index, Stream compute_stream = nullptr);
  ~CudaDevice() override;

  DeviceType type() const override { return DeviceType::cuda; }
  int index() const override { return index_; }
  std::string name() const override { return "cuda:" + std::to_string(index_); }

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) noexcept override;
  // Freed in the order of `stream` (cudaFreeAsync), after the work queued there so far.
  void deallocate_after(void* ptr, size_t bytes, Stream stream) noexcept override;
  // Page-locked memory from the process-wide pinned cache (pinned_host.hpp).
  void* allocate_host(size_t bytes) override;
  void deallocate_host(void* ptr, size_t bytes) noexcept override;
  void deallocate_host_after(void* ptr, size_t bytes, Stream stream) noexcept override;
  // The compute stream (the caller's, or cudaStreamLegacy), queued asynchronously.
  Stream default_stream() const override { return reinterpret_cast<Stream>(compute_); }
  // A non-blocking stream and a CUDA event on this device (cuda_stream.hpp).
  std::unique_ptr<DeviceStream> make_stream() override;
  std::unique_ptr<DeviceEvent> make_event() override;

  void copy(void* dst, const void* src, size_t bytes, Stream stream = nullptr) override;
  void move(void* dst, const void* src, size_t bytes, Stream stream = nullptr) override;
  void fill_zero(void* ptr, size_t bytes, Stream stream = nullptr) override;
  void synchronize() override;

  int64_t bytes_in_use() const override;
  int64_t peak_bytes_in_use() const override;

  DeviceKernels& kernels() override { return kernels_; }

  DevicePool& pool() { return *pool_; }
  const cudaDeviceProp& properties() const { return properties_; }

 private:
  // `s`, or the compute stream for nullptr.
  cudaStream_t stream_of(Stream s) const { return s != nullptr ? reinterpret_cast<cudaStream_t>(s) : compute_; }

  const int index_;
  const cudaStream_t compute_;
  cudaDeviceProp properties_{};
  std::unique_ptr<DevicePool> pool_;
  CudaKernels kernels_;
};

// Number of usable CUDA devices; 0 when CUDA cannot find one, and then `why` (if not null) gets CUDA's
// message ("CUDA driver version is insufficient for CUDA runtime version", "no CUDA-capable device is
// detected", ...). Never throws.
int cuda_device_count(std::string* why = nullptr);

}  // namespace zero3::detail
