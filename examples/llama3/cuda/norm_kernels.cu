// RMSNorm on the device (cuda_ops.hpp; the formulas of ops/rmsnorm.hpp).
//
// Forward and the input gradient: one block of kRowThreads per row; the row's sum (of x^2, or of w*dy*xhat) is
// a block_sum, so its order is fixed. The weight gradient sums over rows without atomics: a first kernel gives
// every (block of kDwChunkRows rows, column) its partial sum, rows in increasing order; a second adds the
// partials of each column in chunk order and then adds the total to dw. The partials live in a stream-ordered
// allocation of chunks * n floats from the zero3 device's pool, on its compute stream.
#include <algorithm>

#include "cuda/cuda_check.hpp"
#include "cuda/cuda_ops.hpp"
#include "cuda/kernel_support.cuh"

namespace llama3::cuda {
namespace {

using namespace kernels;

constexpr int kRowThreads = 256;
// The dw partial-sum blocks: 32 columns x kDwRowThreads threads walking a chunk of rows.
constexpr int kDwRowThreads = 8;
constexpr int64_t kDwChunkRows = 128;
constexpr int64_t kMaxGridY = 65535;

template <typename T>
__global__ void rmsnorm_forward_kernel(const T* x, const T* w, T* y, float* rstd, int64_t n, float eps) {
  __shared__ ReduceScratch scratch;
  const int64_t row = blockIdx.x;
  const T* xr = x + row * n;
  T* yr = y + row * n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = load(xr, i);
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  const float r = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  // y may alias x: every element is read and written by the same thread, after the block has read the row.
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) store(yr, i, load(w, i) * (load(xr, i) * r));
  if (rstd != nullptr && threadIdx.x == 0) rstd[row] = r;
}

template <typename T>
__global__ void rmsnorm_backward_dx_kernel(const T* x, const T* w, const float* rstd, const T* dy, T* dx, int64_t n,
                                           bool accumulate) {
  __shared__ ReduceScratch scratch;
  const int64_t row = blockIdx.x;
  const T* xr = x + row * n;
  const T* dyr = dy + row * n;
  T* dxr = dx + row * n;
  const float r = rstd[row];
  float dot = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dot += load(w, i) * load(dyr, i) * (load(xr, i) * r);
  const float mean = block_sum(dot, scratch) / static_cast<float>(n);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float g = r * (load(w, i) * load(dyr, i) - (load(xr, i) * r) * mean);
    if (accumulate) g = load(dxr, i) + g;
    store(dxr, i, g);
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
      s += load(dy, r * n + col) * (load(x, r * n + col) * rstd[r]);
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

void rmsnorm_forward(const void* x, const void* w, void* y, float* rstd, int64_t rows, int64_t n, float eps, DType act,
                     cudaStream_t stream) {
  detail::check_non_negative(rows, "rmsnorm_forward", "rows");
  detail::check_non_negative(n, "rmsnorm_forward", "n");
  detail::check_act(act, "rmsnorm_forward");
  if (rows == 0 || n == 0) return;
  dispatch_act(act, "rmsnorm_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    rmsnorm_forward_kernel<T><<<row_blocks(rows, "rmsnorm_forward"), kRowThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(w), static_cast<T*>(y), rstd, n, eps);
    LLAMA3_CUDA_CHECK_LAUNCH("rmsnorm_forward_kernel");
  });
}

void rmsnorm_backward(const void* x, const void* w, const float* rstd, const void* dy, void* dx, float* dw,
                      int64_t rows, int64_t n, bool accumulate_dx, DType act, zero3::Device& device) {
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
    rmsnorm_backward_dx_kernel<T><<<row_blocks(rows, "rmsnorm_backward"), kRowThreads, 0, stream>>>(
        xt, static_cast<const T*>(w), rstd, dyt, static_cast<T*>(dx), n, accumulate_dx);
    LLAMA3_CUDA_CHECK_LAUNCH("rmsnorm_backward_dx_kernel");
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
