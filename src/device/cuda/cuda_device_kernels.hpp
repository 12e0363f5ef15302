// The cuda backend's DeviceKernels: the launchers of cuda_kernels.hpp behind the interface the engine
// calls. Everything is queued on the given stream (nullptr: the device's compute stream) and returns at
// once, except grad_stats, which waits for its stream and returns the numbers.
#pragma once

#include <cuda_runtime.h>

#include "device/cuda/device_pool.hpp"
#include "device/device_kernels.hpp"

namespace zero3::detail {

class CudaKernels final : public DeviceKernels {
 public:
  // `scratch` is the device's pool (grad_stats stages its chunk sums there); nullptr streams mean its compute
  // stream.
  CudaKernels(int device, DevicePool& scratch) : device_(device), scratch_(scratch) {}

  void scale_copy(void* dst, DType dst_type, const void* src, DType src_type, float scale, int64_t n,
                  Stream stream) override;
  void scale_add(void* dst, DType dst_type, const void* src, DType src_type, float scale, int64_t n,
                 Stream stream) override;
  GradStats grad_stats(const void* x, DType type, int64_t n, Stream stream) override;
  void accumulate_grad_stats(const void* x, DType type, int64_t n, double* acc, Stream stream) override;
  void grad_stats_to_f32(const double* acc, float* out, Stream stream) override;
  void adam(float* p, const float* g, float* m, float* v, int64_t n, const AdamStepConsts& c, void* copy_out,
            DType copy_type, Stream stream) override;
  void init_fill(float* out, const FillSpec& spec, uint64_t seed, uint64_t param_stream, int64_t begin, int64_t end,
                 Stream stream) override;
  void quantize(void* dst, const void* src, DType src_type, int64_t chunk, int64_t chunks, const QuantFormat& f,
                Stream stream) override;
  void dequantize(void* dst, DType dst_type, const void* src, int64_t chunk, int64_t chunks, const QuantFormat& f,
                  Stream stream) override;
  void dequantize_sum(float* dst, const void* src, int64_t chunk, int64_t chunks, const QuantFormat& f,
                      Stream stream) override;

 private:
  cudaStream_t stream_of(Stream s) const {
    return s != nullptr ? reinterpret_cast<cudaStream_t>(s) : scratch_.compute();
  }

  const int device_;
  DevicePool& scratch_;
};

}  // namespace zero3::detail
