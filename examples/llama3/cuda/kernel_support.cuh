// What the example's kernels share (only for cuda/*.cu): float loads and round-to-nearest-even stores of the
// activation types, block reductions in a fixed order, launch geometry, and the act -> C++ type dispatch.
//
// Reductions: block_sum (float or double) / block_max combine the threads of a block with warp shuffles (xor
// butterfly) and then the warps' results in warp order. For a given blockDim and input the result is always the
// same bits. Every thread of the block must call them (they contain __syncthreads), and blockDim.x must be a
// multiple of 32 (at most 1024).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

#include "cuda/cuda_check.hpp"
#include "zero3/device.hpp"
#include "zero3/dtype.hpp"
#include "zero3/error.hpp"

namespace llama3::cuda::kernels {

// ---- Element access: every kernel computes in float. ----

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }

__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

// The float a store of type T gives back (bf16: rounded to nearest even), for kernels that use a value they also
// store (a residual sum that is then normalised) exactly as a later kernel would read it.
__device__ __forceinline__ float rounded(float v, const float*) { return v; }
__device__ __forceinline__ float rounded(float v, const __nv_bfloat16*) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

// ---- Vectorized access: 16 bytes per load and store. ----
//
// kPack<T> elements fill 16 bytes (4 f32, 8 bf16). load_pack / store_pack move V consecutive elements through
// registers as floats: with V a multiple of kPack<T>, in 16-byte loads and stores (the pointer must be 16-byte
// aligned); with V = 1, element by element. A kernel templated on V runs its vector body when the host has checked
// the alignment and that V divides the row (vector_width), and its scalar form otherwise: odd sizes and offsets
// take the scalar kernel, which computes the same values in the same order per element.
template <typename T>
inline constexpr int kPack = static_cast<int>(16 / sizeof(T));

template <typename T>
struct alignas(16) Pack {
  T e[kPack<T>];
};

template <typename T, int V>
__device__ __forceinline__ void load_pack(const T* p, float* v) {
  if constexpr (V % kPack<T> == 0) {
#pragma unroll
    for (int j = 0; j < V; j += kPack<T>) {
      const Pack<T> pk = *reinterpret_cast<const Pack<T>*>(p + j);
#pragma unroll
      for (int k = 0; k < kPack<T>; ++k) v[j + k] = load(pk.e, k);
    }
  } else {
    static_assert(V == 1, "load_pack: V is 1 or a multiple of the 16-byte pack");
    v[0] = load(p, 0);
  }
}

template <typename T, int V>
__device__ __forceinline__ void store_pack(T* p, const float* v) {
  if constexpr (V % kPack<T> == 0) {
#pragma unroll
    for (int j = 0; j < V; j += kPack<T>) {
      Pack<T> pk;
#pragma unroll
      for (int k = 0; k < kPack<T>; ++k) store(pk.e, k, v[j + k]);
      *reinterpret_cast<Pack<T>*>(p + j) = pk;
    }
  } else {
    static_assert(V == 1, "store_pack: V is 1 or a multiple of the 16-byte pack");
    store(p, 0, v[0]);
  }
}

// True when every pointer (null ones aside) is 16-byte aligned.
inline bool aligned16(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// Calls f(std::integral_constant<int, kPack<T>>) when `vector` holds, else f(std::integral_constant<int, 1>).
template <typename T, typename F>
void dispatch_width(bool vector, F&& f) {
  if (vector) {
    std::forward<F>(f)(std::integral_constant<int, kPack<T>>{});
  } else {
    std::forward<F>(f)(std::integral_constant<int, 1>{});
  }
}

// ---- Block reductions. ----

inline constexpr int kWarp = 32;

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Shared scratch of one reduction: a slot per warp and one for the result.
template <typename T>
struct BlockScratch {
  T warp[kWarp];
  T result;
};
using ReduceScratch = BlockScratch<float>;
using ReduceScratchF64 = BlockScratch<double>;

template <bool kMax, typename T>
__device__ __forceinline__ T warp_reduce(T v) {
  if constexpr (kMax) {
    return warp_max(v);
  } else {
    return warp_sum(v);
  }
}

template <bool kMax, typename T>
__device__ __forceinline__ T block_reduce(T v, BlockScratch<T>& s) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  v = warp_reduce<kMax>(v);
  if (lane == 0) s.warp[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T r = lane < warps ? s.warp[lane] : (kMax ? T(-INFINITY) : T(0));
    r = warp_reduce<kMax>(r);
    if (lane == 0) s.result = r;
  }
  __syncthreads();
  const T result = s.result;
  __syncthreads();  // the scratch may be reused by the next reduction
  return result;
}

__device__ __forceinline__ float block_sum(float v, ReduceScratch& s) { return block_reduce<false>(v, s); }
__device__ __forceinline__ double block_sum(double v, ReduceScratchF64& s) { return block_reduce<false>(v, s); }
__device__ __forceinline__ float block_max(float v, ReduceScratch& s) { return block_reduce<true>(v, s); }

// ---- Launch geometry. ----

inline constexpr int kElementThreads = 256;
// Grid-stride loops: past this many blocks each thread takes several elements.
inline constexpr int64_t kMaxElementBlocks = int64_t{1} << 20;

inline unsigned int element_blocks(int64_t work) {
  int64_t blocks = (work + kElementThreads - 1) / kElementThreads;
  if (blocks > kMaxElementBlocks) blocks = kMaxElementBlocks;
  return static_cast<unsigned int>(blocks < 1 ? 1 : blocks);
}

// One block per row: grid.x holds up to 2^31 - 1 blocks.
inline unsigned int row_blocks(int64_t rows, const char* op) {
  if (rows > int64_t{0x7fffffff}) {
    throw zero3::InvalidArgument(std::string(op) + ": " + std::to_string(rows) +
                                 " rows exceed the 2^31 - 1 blocks of a grid");
  }
  return static_cast<unsigned int>(rows);
}

__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_threads() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// ---- Scratch memory. ----

inline constexpr int64_t kWorkspaceAlign = 256;

inline int64_t align_up(int64_t bytes) { return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }

// A device scratch buffer that grows to the largest request, from the zero3 device's stream-ordered pool (the
// one pool of the process's device memory: the engine's and the model's), allocated and freed in the order of
// the device's compute stream, where the ops run, so work queued there before a regrowth still sees the old
// buffer. The device must outlive it.
class StreamWorkspace {
 public:
  explicit StreamWorkspace(zero3::Device& device) : device_(device) {}
  ~StreamWorkspace() { release(); }
  StreamWorkspace(const StreamWorkspace&) = delete;
  StreamWorkspace& operator=(const StreamWorkspace&) = delete;

  // At least `bytes` bytes; the contents are undefined after a regrowth.
  char* reserve(int64_t bytes) {
    if (bytes > bytes_) {
      release();
      data_ = device_.allocate(static_cast<size_t>(bytes));
      bytes_ = bytes;
    }
    return static_cast<char*>(data_);
  }
  int64_t bytes() const { return bytes_; }

 private:
  void release() noexcept {
    if (data_ != nullptr) device_.deallocate_after(data_, static_cast<size_t>(bytes_), device_.default_stream());
    data_ = nullptr;
    bytes_ = 0;
  }

  zero3::Device& device_;
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

// ---- act -> C++ element type. ----

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<float>) or f(TypeTag<__nv_bfloat16>); throws InvalidArgument for any other act.
template <typename F>
void dispatch_act(zero3::DType act, const char* op, F&& f) {
  detail::check_act(act, op);
  if (act == zero3::DType::f32) {
    std::forward<F>(f)(TypeTag<float>{});
  } else {
    std::forward<F>(f)(TypeTag<__nv_bfloat16>{});
  }
}

}  // namespace llama3::cuda::kernels
