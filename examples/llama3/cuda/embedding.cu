// Token embedding on the device (cuda_ops.hpp; the indexing and the order of the sums: kernel_math/embedding_math.hpp,
// as the CPU op). Forward copies rows of the table, one element per grid-stride iteration. Backward runs one block
// per distinct id of the batch (EmbeddingGrouping): each thread owns columns of that table row and adds the row's
// tokens into it one after the other in token order, as the CPU loop does, so no two threads ever write the same
// element and the result has the CPU's bits.
#include "cuda/cuda_check.hpp"
#include "cuda/cuda_ops.hpp"
#include "cuda/kernel_support.cuh"
#include "kernel_math/embedding_math.hpp"

namespace llama3::cuda {
namespace {

using namespace kernels;
using namespace kernel_math;

constexpr int kBackwardThreads = 256;

template <typename T>
__global__ void embedding_forward_kernel(const int32_t* ids, int64_t tokens, const T* table, int64_t hidden, T* x) {
  const int64_t total = tokens * hidden;
  for (int64_t idx = global_thread(); idx < total; idx += grid_threads()) {
    const int64_t i = idx / hidden, j = idx - i * hidden;
    x[idx] = table[embedding_source(ids, i, j, hidden)];
  }
}

template <typename T>
__global__ void embedding_backward_kernel(const int32_t* rows, const int32_t* offsets, const int32_t* token_ids,
                                          const T* dx, int64_t hidden, float* dtable) {
  const int64_t u = blockIdx.x;
  float* drow = dtable + static_cast<int64_t>(rows[u]) * hidden;
  const int32_t t0 = offsets[u], t1 = offsets[u + 1];
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    drow[j] = embedding_grad_column(drow[j], dx, token_ids, t0, t1, hidden, j);
  }
}

}  // namespace

void embedding_forward(const int32_t* ids, int64_t tokens, const void* table, int64_t hidden, void* x, DType act,
                       cudaStream_t stream) {
  detail::check_non_negative(tokens, "embedding_forward", "tokens");
  detail::check_non_negative(hidden, "embedding_forward", "hidden");
  detail::check_act(act, "embedding_forward");
  if (tokens * hidden == 0) return;
  dispatch_act(act, "embedding_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    embedding_forward_kernel<T><<<element_blocks(tokens * hidden), kElementThreads, 0, stream>>>(
        ids, tokens, static_cast<const T*>(table), hidden, static_cast<T*>(x));
    LLAMA3_CUDA_CHECK_LAUNCH("embedding_forward_kernel");
  });
}

void embedding_backward(const int32_t* rows, const int32_t* offsets, const int32_t* token_ids, int64_t n_rows,
                        const void* dx, int64_t hidden, float* dtable, DType act, cudaStream_t stream) {
  detail::check_non_negative(n_rows, "embedding_backward", "n_rows");
  detail::check_non_negative(hidden, "embedding_backward", "hidden");
  detail::check_act(act, "embedding_backward");
  if (n_rows == 0 || hidden == 0) return;
  dispatch_act(act, "embedding_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    embedding_backward_kernel<T><<<row_blocks(n_rows, "embedding_backward"), kBackwardThreads, 0, stream>>>(
        rows, offsets, token_ids, static_cast<const T*>(dx), hidden, dtable);
    LLAMA3_CUDA_CHECK_LAUNCH("embedding_backward_kernel");
  });
}

}  // namespace llama3::cuda
