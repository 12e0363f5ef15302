// RMSNorm on the device (cuda_ops.hpp; the terms of kernel_math/rmsnorm_math.hpp, as the CPU op), with the residual add
// fused in front of the forward (add_rmsnorm_forward) and behind the input gradient (rmsnorm_backward's residual).
//
// Forward and the input gradient: one block of kRowThreads per row, 16-byte loads and stores when the row length
// and the pointers allow (kernel_support.cuh), element by element otherwise; the row's sum (of x^2, or of
// w*dy*xhat) is a block_sum, so its order is fixed for a given path. The weight gradient sums over rows without
// atomics: a first kernel gives every (block of kDwChunkRows rows, column) its partial sum, rows in increasing order; a
// second adds the partials of each column in chunk order and then adds the total to dw. The partials live in a
// stream-ordered allocation of chunks * n floats from the zero3 device's pool, on its compute stream.
#include <algorithm>
#include <initializer_list>
#include <string>

#include "cuda/cuda_check.hpp"
#include "cuda/cuda_ops.hpp"
#include "cuda/kernel_support.cuh"
#include "kernel_math/rmsnorm_math.hpp"

namespace llama3::cuda {
namespace {

using namespace kernels;
using namespace kernel_math;

constexpr int kRowThreads = 256;
// The dw partial-sum blocks: 32 columns x kDwRowThreads threads walking a chunk of rows.
constexpr int kDwRowThreads = 8;
constexpr int64_t kDwChunkRows = 128;
constexpr int64_t kMaxGridY = 65535;

// One block per row, V elements per step of a thread (V = kPack<T>: 16-byte loads and stores; V = 1: scalar).
// kAdd: the row is h = a + b, rounded to T and stored (the residual add fused in front of the norm), and the
// norm reads the rounded h, as a separate add kernel followed by the norm would; otherwise the row is a.
// y may alias a: every element is read and written by the same thread, the write after the block's sum.
template <typename T, int V, bool kAdd>
__global__ void rmsnorm_forward_kernel(const T* a, const T* b, T* h, const T* w, T* y, float* rstd, int64_t n,
                                       float eps) {
  __shared__ ReduceScratch scratch;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * n;
  const T* xr = (kAdd ? h : a) + row;  // the normalised row, read again in the second pass
  const int64_t groups = n / V;
  float ss = 0.0f;
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
    float v[V];
    load_pack<T, V>(a + row + g * V, v);
    if constexpr (kAdd) {
      float u[V];
      load_pack<T, V>(b + row + g * V, u);
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = rounded(v[k] + u[k], h);
      store_pack<T, V>(h + row + g * V, v);
    }
#pragma unroll
    for (int k = 0; k < V; ++k) ss += rmsnorm_square(v[k]);
  }
  ss = block_sum(ss, scratch);
  const float r = rmsnorm_rstd(ss, n, eps);
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
    float v[V], wv[V];
    load_pack<T, V>(xr + g * V, v);
    load_pack<T, V>(w + g * V, wv);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = rmsnorm_output(v[k], wv[k], r);
    store_pack<T, V>(y + row + g * V, v);
  }
  if (rstd != nullptr && threadIdx.x == 0) rstd[blockIdx.x] = r;
}

// dx = residual + the input gradient (residual null: the gradient alone; residual == dx: accumulate), V elements
// per step as above. Each element of residual and dx is read and written by one thread, after the block's sum.
template <typename T, int V>
__global__ void rmsnorm_backward_dx_kernel(const T* x, const T* w, const float* rstd, const T* dy, const T* residual,
                                           T* dx, int64_t n) {
  __shared__ ReduceScratch scratch;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * n;
  const float r = rstd[blockIdx.x];
  const int64_t groups = n / V;
  float dot = 0.0f;
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
    float xv[V], wv[V], dv[V];
    load_pack<T, V>(x + row + g * V, xv);
    load_pack<T, V>(w + g * V, wv);
    load_pack<T, V>(dy + row + g * V, dv);
#pragma unroll
    for (int k = 0; k < V; ++k) dot += rmsnorm_dot_term(xv[k], wv[k], dv[k], r);
  }
  const float mean = rmsnorm_dot_mean(block_sum(dot, scratch), n);
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
    float xv[V], wv[V], dv[V], out[V] = {};
    load_pack<T, V>(x + row + g * V, xv);
    load_pack<T, V>(w + g * V, wv);
    load_pack<T, V>(dy + row + g * V, dv);
    if (residual != nullptr) {
      load_pack<T, V>(residual + row + g * V, out);
    }
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float grad = rmsnorm_input_grad(xv[k], wv[k], dv[k], r, mean);
      out[k] = residual != nullptr ? out[k] + grad : grad;
    }
    store_pack<T, V>(dx + row + g * V, out);
  }
}

// partial[c, col] = sum over rows r of chunk c, in increasing order within each of the kDwRowThreads lanes of
// rows and then the lanes in order, of dy[r, col] * (x[r, col] * rstd[r]).
template <typename T>
__global__ void rmsnorm_dw_partial_kernel(const T* x, const float* rstd, const T* dy, float* partial, int64_t rows,
                                          int64_t n, int64_t chunk_rows) {
  __shared__ float acc[kDwRowThreads][kWarp + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kWarp + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  float s = 0.0f;
  if (col < n) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kDwRowThreads) {
      s += rmsnorm_weight_grad_term(load(x, r * n + col), load(dy, r * n + col), rstd[r]);
    }
  }
  acc[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < n) {
    float t = 0.0f;
    for (int k = 0; k < kDwRowThreads; ++k) t += acc[k][threadIdx.x];
    partial[static_cast<int64_t>(blockIdx.y) * n + col] = t;
  }
}

// dw[col] += sum over chunks, in order, of partial[c, col].
__global__ void rmsnorm_dw_finish_kernel(const float* partial, int64_t chunks, int64_t n, float* dw) {
  for (int64_t col = global_thread(); col < n; col += grid_threads()) {
    float t = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) t += partial[c * n + col];
    dw[col] += t;
  }
}

// A device allocation from the zero3 device's pool, ordered on its compute stream and freed there when it goes
// out of scope.
class StreamScratch {
 public:
  StreamScratch(size_t bytes, zero3::Device& device) : device_(device), bytes_(bytes), ptr_(device.allocate(bytes)) {}
  ~StreamScratch() { device_.deallocate_after(ptr_, bytes_, device_.default_stream()); }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  float* floats() const { return static_cast<float*>(ptr_); }

 private:
  zero3::Device& device_;
  size_t bytes_;
  void* ptr_;
};

}  // namespace

namespace {

// The 16-byte kernels take rows whose length is a multiple of the pack and pointers on 16-byte boundaries (every
// row then starts on one).
template <typename T>
bool vector_rows(int64_t n, std::initializer_list<const void*> pointers) {
  return n % kPack<T> == 0 && aligned16(pointers);
}

template <bool kAdd>
void norm_forward(const char* op, const void* a, const void* b, void* h, const void* w, void* y, float* rstd,
                  int64_t rows, int64_t n, float eps, DType act, cudaStream_t stream) {
  detail::check_non_negative(rows, op, "rows");
  detail::check_non_negative(n, op, "n");
  detail::check_act(act, op);
  if (rows == 0 || n == 0) return;
  dispatch_act(act, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_width<T>(vector_rows<T>(n, {a, b, h, w, y}), [&](auto width) {
      rmsnorm_forward_kernel<T, decltype(width)::value, kAdd><<<row_blocks(rows, op), kRowThreads, 0, stream>>>(
          static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(h), static_cast<const T*>(w),
          static_cast<T*>(y), rstd, n, eps);
      LLAMA3_CUDA_CHECK_LAUNCH(op);
    });
  });
}

}  // namespace

void rmsnorm_forward(const void* x, const void* w, void* y, float* rstd, int64_t rows, int64_t n, float eps, DType act,
                     cudaStream_t stream) {
  norm_forward<false>("rmsnorm_forward", x, nullptr, nullptr, w, y, rstd, rows, n, eps, act, stream);
}

void add_rmsnorm_forward(const void* a, const void* b, void* h, const void* w, void* y, float* rstd, int64_t rows,
                         int64_t n, float eps, DType act, cudaStream_t stream) {
  norm_forward<true>("add_rmsnorm_forward", a, b, h, w, y, rstd, rows, n, eps, act, stream);
}

void rmsnorm_backward(const void* x, const void* w, const float* rstd, const void* dy, const void* residual, void* dx,
                      float* dw, int64_t rows, int64_t n, DType act, zero3::Device& device) {
  const auto stream = static_cast<cudaStream_t>(device.default_stream());
  detail::check_non_negative(rows, "rmsnorm_backward", "rows");
  detail::check_non_negative(n, "rmsnorm_backward", "n");
  detail::check_act(act, "rmsnorm_backward");
  if (rows == 0 || n == 0) return;
  // Every argument is checked before the first launch.
  if (rstd == nullptr) throw zero3::InvalidArgument("rmsnorm_backward: rstd is null (the forward's rstd is needed)");
  const int64_t col_blocks = (n + kWarp - 1) / kWarp;
  if (dw != nullptr && col_blocks > int64_t{0x7fffffff}) {
    throw zero3::InvalidArgument("rmsnorm_backward: n = " + std::to_string(n) + " is too wide");
  }
  dispatch_act(act, "rmsnorm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xt = static_cast<const T*>(x);
    const T* dyt = static_cast<const T*>(dy);
    dispatch_width<T>(vector_rows<T>(n, {x, w, dy, residual, dx}), [&](auto width) {
      rmsnorm_backward_dx_kernel<T, decltype(width)::value>
          <<<row_blocks(rows, "rmsnorm_backward"), kRowThreads, 0, stream>>>(
              xt, static_cast<const T*>(w), rstd, dyt, static_cast<const T*>(residual), static_cast<T*>(dx), n);
      LLAMA3_CUDA_CHECK_LAUNCH("rmsnorm_backward_dx_kernel");
    });
    if (dw == nullptr) return;
    // At most kMaxGridY chunks (grid.y), each of at least kDwChunkRows rows.
    const int64_t chunk_rows = std::max(kDwChunkRows, (rows + kMaxGridY - 1) / kMaxGridY);
    const int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
    StreamScratch partial(static_cast<size_t>(chunks * n) * sizeof(float), device);
    const dim3 grid(static_cast<unsigned int>(col_blocks), static_cast<unsigned int>(chunks));
    const dim3 block(kWarp, kDwRowThreads);
    rmsnorm_dw_partial_kernel<T><<<grid, block, 0, stream>>>(xt, rstd, dyt, partial.floats(), rows, n, chunk_rows);
    LLAMA3_CUDA_CHECK_LAUNCH("rmsnorm_dw_partial_kernel");
    rmsnorm_dw_finish_kernel<<<element_blocks(n), kElementThreads, 0, stream>>>(partial.floats(), chunks, n, dw);
    LLAMA3_CUDA_CHECK_LAUNCH("rmsnorm_dw_finish_kernel");
  });
}

}  // namespace llama3::cuda
