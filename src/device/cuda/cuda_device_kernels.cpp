#include "device/cuda/cuda_device_kernels.hpp"

#include "device/cuda/cuda_check.hpp"
#include "device/cuda/cuda_device_guard.hpp"
#include "device/cuda/cuda_kernels.hpp"
#include "device/cuda/pinned_host.hpp"

namespace zero3::detail {

void CudaKernels::scale_copy(void* dst, DType dst_type, const void* src, DType src_type, float scale, int64_t n,
                             Stream stream) {
  if (n <= 0) return;
  if (dst == src && dst_type == src_type && scale == 1.0f) return;
  CudaDeviceGuard guard(device_);
  if (dst_type == src_type && scale == 1.0f) {
    ZERO3_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * dtype_size(dst_type), cudaMemcpyDeviceToDevice,
                                     stream_of(stream)));
    return;
  }
  cuda::launch_scale_copy(dst, dst_type, src, src_type, scale, n, stream_of(stream));
}

void CudaKernels::scale_add(void* dst, DType dst_type, const void* src, DType src_type, float scale, int64_t n,
                            Stream stream) {
  if (n <= 0) return;
  CudaDeviceGuard guard(device_);
  cuda::launch_scale_add(dst, dst_type, src, src_type, scale, n, stream_of(stream));
}

GradStats CudaKernels::grad_stats(const void* x, DType type, int64_t n, Stream stream) {
  if (n <= 0) return {};
  CudaDeviceGuard guard(device_);
  const int64_t chunks = cuda::grad_stats_chunks(n);
  // Layout of the scratch and of its host copy: the non-finite counter, then one double per chunk.
  const size_t bytes = sizeof(unsigned long long) + static_cast<size_t>(chunks) * sizeof(double);
  const cudaStream_t s = stream_of(stream);
  void* scratch = scratch_.allocate(bytes, s);
  auto* counter = static_cast<unsigned long long*>(scratch);
  auto* sums = reinterpret_cast<double*>(counter + 1);
  PinnedHostBuffer host(bytes);
  try {
    ZERO3_CUDA_CHECK(cudaMemsetAsync(counter, 0, sizeof(unsigned long long), s));
    cuda::launch_grad_stats_chunks(x, type, n, sums, counter, s);
    ZERO3_CUDA_CHECK(cudaMemcpyAsync(host.data(), scratch, bytes, cudaMemcpyDeviceToHost, s));
    ZERO3_CUDA_CHECK(cudaStreamSynchronize(s));
  } catch (...) {
    scratch_.deallocate_after(scratch, bytes, s);
    throw;
  }
  scratch_.deallocate_after(scratch, bytes, s);
  GradStats out;
  out.non_finite = static_cast<int64_t>(*host.as<unsigned long long>());
  const double* host_sums = reinterpret_cast<const double*>(host.as<unsigned long long>() + 1);
  for (int64_t c = 0; c < chunks; ++c) out.sum_squares += host_sums[c];
  return out;
}

void CudaKernels::accumulate_grad_stats(const void* x, DType type, int64_t n, double* acc, Stream stream) {
  if (n <= 0) return;
  CudaDeviceGuard guard(device_);
  const int64_t chunks = cuda::grad_stats_chunks(n);
  const size_t bytes = sizeof(unsigned long long) + static_cast<size_t>(chunks) * sizeof(double);
  const cudaStream_t s = stream_of(stream);
  void* scratch = scratch_.allocate(bytes, s);  // freed in the order of s: reused there without a host wait
  auto* counter = static_cast<unsigned long long*>(scratch);
  auto* sums = reinterpret_cast<double*>(counter + 1);
  try {
    ZERO3_CUDA_CHECK(cudaMemsetAsync(counter, 0, sizeof(unsigned long long), s));
    cuda::launch_grad_stats_chunks(x, type, n, sums, counter, s);
    cuda::launch_add_grad_stats(sums, chunks, counter, acc, s);
  } catch (...) {
    scratch_.deallocate_after(scratch, bytes, s);
    throw;
  }
  scratch_.deallocate_after(scratch, bytes, s);
}

void CudaKernels::grad_stats_to_f32(const double* acc, float* out, Stream stream) {
  CudaDeviceGuard guard(device_);
  cuda::launch_grad_stats_f32(acc, out, stream_of(stream));
}

void CudaKernels::adam(float* p, const float* g, float* m, float* v, int64_t n, const AdamStepConsts& c, void* copy_out,
                       DType copy_type, Stream stream) {
  if (n <= 0) return;
  CudaDeviceGuard guard(device_);
  cuda::launch_adam(p, g, m, v, n, c, copy_out, copy_type, stream_of(stream));
}

void CudaKernels::init_fill(float* out, const FillSpec& spec, uint64_t seed, uint64_t param_stream, int64_t begin,
                            int64_t end, Stream stream) {
  CudaDeviceGuard guard(device_);
  cuda::launch_philox_fill(out, spec, seed, param_stream, begin, end, stream_of(stream));
}

void CudaKernels::quantize(void* dst, const void* src, DType src_type, int64_t chunk, int64_t chunks,
                           const QuantFormat& f, Stream stream) {
  check_quant_args("quantize", f, chunk, chunks);
  if (chunk == 0 || chunks == 0) return;
  CudaDeviceGuard guard(device_);
  cuda::launch_quantize(dst, src, src_type, chunk, chunks, f, stream_of(stream));
}

void CudaKernels::dequantize(void* dst, DType dst_type, const void* src, int64_t chunk, int64_t chunks,
                             const QuantFormat& f, Stream stream) {
  check_quant_args("dequantize", f, chunk, chunks);
  if (chunk == 0 || chunks == 0) return;
  CudaDeviceGuard guard(device_);
  cuda::launch_dequantize(dst, dst_type, src, chunk, chunks, f, stream_of(stream));
}

void CudaKernels::dequantize_sum(float* dst, const void* src, int64_t chunk, int64_t chunks, const QuantFormat& f,
                                 Stream stream) {
  check_quant_args("dequantize_sum", f, chunk, chunks);
  if (chunk == 0) return;
  CudaDeviceGuard guard(device_);
  cuda::launch_dequantize_sum(dst, src, chunk, chunks, f, stream_of(stream));
}

}  // namespace zero3::detail
