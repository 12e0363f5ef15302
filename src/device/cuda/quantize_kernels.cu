// Block quantization on the GPU: the element functions of kernels/block_quantize.hpp, which the cpu backend
// runs in its scalar reference and SIMD bodies, arranged for a warp per block (quantize) or a thread per
// element (dequantize, dequantize_sum).
#include "device/cuda/cuda_check.hpp"
#include "device/cuda/cuda_kernels.hpp"
#include "device/cuda/launch_config.cuh"
#include "kernels/block_quantize.hpp"
#include "kernels/elementwise.hpp"

namespace zero3::detail::cuda {
namespace {

constexpr int kWarp = 32;

// One warp per block: the maximum of |x| as bits over the lanes (shuffles; every lane ends with it), the
// scale, then the codes, each lane taking every 32nd element (int8) or byte (int4). The loop bound is the
// same for every lane of a warp, so the full-mask shuffles always have all 32 lanes.
template <DType S>
__global__ void quantize_kernel(uint8_t* dst, const void* src, int64_t chunk, int64_t chunks, QuantFormat f) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const int64_t per_chunk = quant_blocks(chunk, f.block);
  const int64_t message_bytes = quant_message_bytes(chunk, f);
  const int64_t scales = quant_scales_offset(chunk, f.bits);
  const int64_t warps = grid_threads() / kWarp;
  for (int64_t w = global_thread() / kWarp; w < chunks * per_chunk; w += warps) {
    const int64_t c = w / per_chunk;
    const int64_t b = w % per_chunk;
    const int64_t begin = b * f.block;
    const int64_t len = f.block < chunk - begin ? f.block : chunk - begin;
    const int64_t first = c * chunk + begin;

    uint32_t amax = 0;
    for (int64_t i = lane; i < len; i += kWarp) {
      uint32_t a = quant_abs_bits(load_as_f32<S>(src, first + i));
      amax = a > amax ? a : amax;
    }
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      uint32_t other = __shfl_xor_sync(0xffffffffu, amax, offset);
      amax = other > amax ? other : amax;
    }
    const QuantScale q = quant_scale(amax, f.bits);

    uint8_t* message = dst + c * message_bytes;
    if (lane == 0) memcpy(message + scales + 4 * b, &q.scale, 4);
    if (f.bits == 8) {
      for (int64_t i = lane; i < len; i += kWarp) {
        message[begin + i] = static_cast<uint8_t>(quant_code(load_as_f32<S>(src, first + i), q.inv, 8));
      }
    } else {
      const int64_t bytes = (len + 1) / 2;
      for (int64_t j = lane; j < bytes; j += kWarp) {
        const int32_t even = quant_code(load_as_f32<S>(src, first + 2 * j), q.inv, 4);
        const int32_t odd = 2 * j + 1 < len ? quant_code(load_as_f32<S>(src, first + 2 * j + 1), q.inv, 4) : 0;
        message[begin / 2 + j] = quant_pack_int4(even, odd);
      }
    }
    if (lane == 0 && b == per_chunk - 1) {
      for (int64_t p = quant_code_bytes(chunk, f.bits); p < scales; ++p) message[p] = 0;
    }
  }
}

template <DType D>
__global__ void dequantize_kernel(void* dst, const uint8_t* src, int64_t chunk, int64_t chunks, QuantFormat f) {
  const int64_t message_bytes = quant_message_bytes(chunk, f);
  for (int64_t i = global_thread(); i < chunk * chunks; i += grid_threads()) {
    const int64_t c = i / chunk;
    store_from_f32<D>(dst, i, dequant_element(src + c * message_bytes, chunk, f, i - c * chunk));
  }
}

__global__ void dequantize_sum_kernel(float* dst, const uint8_t* src, int64_t chunk, int64_t chunks, QuantFormat f) {
  const int64_t message_bytes = quant_message_bytes(chunk, f);
  for (int64_t i = global_thread(); i < chunk; i += grid_threads()) {
    float acc = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) acc += dequant_element(src + c * message_bytes, chunk, f, i);
    dst[i] = acc;
  }
}

}  // namespace

void launch_quantize(void* dst, const void* src, DType src_type, int64_t chunk, int64_t chunks, const QuantFormat& f,
                     cudaStream_t stream) {
  if (chunk <= 0 || chunks <= 0) return;
  const unsigned int blocks = blocks_for(chunks * quant_blocks(chunk, f.block) * kWarp);
  auto* out = static_cast<uint8_t*>(dst);
  switch (src_type) {
    case DType::f32:
      quantize_kernel<DType::f32><<<blocks, kThreads, 0, stream>>>(out, src, chunk, chunks, f);
      break;
    case DType::bf16:
      quantize_kernel<DType::bf16><<<blocks, kThreads, 0, stream>>>(out, src, chunk, chunks, f);
      break;
    case DType::f16:
      quantize_kernel<DType::f16><<<blocks, kThreads, 0, stream>>>(out, src, chunk, chunks, f);
      break;
  }
  ZERO3_CUDA_CHECK(cudaGetLastError());
}

void launch_dequantize(void* dst, DType dst_type, const void* src, int64_t chunk, int64_t chunks, const QuantFormat& f,
                       cudaStream_t stream) {
  if (chunk <= 0 || chunks <= 0) return;
  const unsigned int blocks = blocks_for(chunk * chunks);
  const auto* in = static_cast<const uint8_t*>(src);
  switch (dst_type) {
    case DType::f32:
      dequantize_kernel<DType::f32><<<blocks, kThreads, 0, stream>>>(dst, in, chunk, chunks, f);
      break;
    case DType::bf16:
      dequantize_kernel<DType::bf16><<<blocks, kThreads, 0, stream>>>(dst, in, chunk, chunks, f);
      break;
    case DType::f16:
      dequantize_kernel<DType::f16><<<blocks, kThreads, 0, stream>>>(dst, in, chunk, chunks, f);
      break;
  }
  ZERO3_CUDA_CHECK(cudaGetLastError());
}

void launch_dequantize_sum(float* dst, const void* src, int64_t chunk, int64_t chunks, const QuantFormat& f,
                           cudaStream_t stream) {
  if (chunk <= 0) return;
  dequantize_sum_kernel<<<blocks_for(chunk), kThreads, 0, stream>>>(dst, static_cast<const uint8_t*>(src), chunk,
                                                                    chunks, f);
  ZERO3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zero3::detail::cuda
