// Launchers of the cuda backend's element kernels. Each kernel runs one of the single-source element
// functions (kernels/elementwise.hpp, optim/adam_math.hpp, kernels/philox_init.hpp) per element, the same
// functions the cpu backend runs in OpenMP loops.
//
// Every launcher queues its kernel on `stream` and returns at once; it checks the launch (cudaGetLastError
// through ZERO3_CUDA_CHECK) and throws CudaError when CUDA refused it. Buffers are device memory of the
// current device. n == 0 launches nothing.
//
// Bits: the kernel files are compiled with --fmad=false (src/CMakeLists.txt), so nvcc does not contract
// a*b+c into a fused multiply-add where the element functions write two operations; with IEEE division and
// square root (nvcc's defaults) every fp32 result is the bits the cpu backend computes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/block_quantize.hpp"
#include "kernels/philox_init.hpp"
#include "optim/adam_math.hpp"
#include "zero3/dtype.hpp"

namespace zero3::detail::cuda {

// Elements per chunk of the deterministic sum of squares; the same chunking as the cpu backend's
// grad_stats (src/device/cpu/cpu_device.cpp), which is what makes the two sums the same bits.
inline constexpr int64_t kGradStatsChunk = int64_t{1} << 14;

inline int64_t grad_stats_chunks(int64_t n) { return (n + kGradStatsChunk - 1) / kGradStatsChunk; }

// cudaSuccess when the current device can run this build's kernels; cudaErrorNoKernelImageForDevice (or
// cudaErrorInvalidDeviceFunction) when the build has neither its machine code nor PTX it can compile.
cudaError_t kernel_image_status();

// dst[i] = scale * src[i] with conversion (RNE to 16-bit types).
void launch_scale_copy(void* dst, DType dst_type, const void* src, DType src_type, float scale, int64_t n,
                       cudaStream_t stream);
// dst[i] += scale * src[i], arithmetic in fp32.
void launch_scale_add(void* dst, DType dst_type, const void* src, DType src_type, float scale, int64_t n,
                      cudaStream_t stream);
// chunk_sums[c] = sum over chunk c (elements [c*kGradStatsChunk, min(n, (c+1)*kGradStatsChunk))) of
// double(x)^2, added one element after the other in index order, as the cpu loop does; *non_finite is
// incremented by the number of Inf/NaN elements (set it to 0 first). chunk_sums holds grad_stats_chunks(n).
void launch_grad_stats_chunks(const void* x, DType type, int64_t n, double* chunk_sums, unsigned long long* non_finite,
                              cudaStream_t stream);
// acc[0] += the sum of chunk_sums[0, chunks) added in chunk order from 0 (the host's order in grad_stats), acc[1] +=
// *non_finite: one thread, so that the stream-ordered statistics are the bits of the blocking ones.
void launch_add_grad_stats(const double* chunk_sums, int64_t chunks, const unsigned long long* non_finite, double* acc,
                           cudaStream_t stream);
// out = grad_stats_f32(acc) (kernels/elementwise.hpp), one thread.
void launch_grad_stats_f32(const double* acc, float* out, cudaStream_t stream);
// One Adam/AdamW step (adam_update) per element; copy_out (may be null) receives the updated p.
void launch_adam(float* p, const float* g, float* m, float* v, int64_t n, const AdamStepConsts& c, void* copy_out,
                 DType copy_type, cudaStream_t stream);
// out[0, end - begin) = elements [begin, end) of the parameter (philox_fill_block per block of four).
void launch_philox_fill(float* out, const FillSpec& spec, uint64_t seed, uint64_t param_stream, int64_t begin,
                        int64_t end, cudaStream_t stream);

// Block quantization (quantize_kernels.cu), with the arguments of DeviceKernels::quantize, dequantize and
// dequantize_sum, already checked (check_quant_args). Quantizing runs one warp per block: the lanes find
// the block's maximum |x| bits, reduce them with shuffles and write the codes; dequantizing runs one thread
// per element, and the sum adds the messages in order in each element's thread.
void launch_quantize(void* dst, const void* src, DType src_type, int64_t chunk, int64_t chunks, const QuantFormat& f,
                     cudaStream_t stream);
void launch_dequantize(void* dst, DType dst_type, const void* src, int64_t chunk, int64_t chunks, const QuantFormat& f,
                       cudaStream_t stream);
void launch_dequantize_sum(float* dst, const void* src, int64_t chunk, int64_t chunks, const QuantFormat& f,
                           cudaStream_t stream);

}  // namespace zero3::detail::cuda
