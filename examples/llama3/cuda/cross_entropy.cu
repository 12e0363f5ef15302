// The LM head fused with cross-entropy on the device (cuda_ops.hpp LmHeadLoss; ops/cross_entropy.hpp), and
// sum_rows / add_rows.
//
// The chunks are backend/lm_head_plan.hpp's: as many rows as fit the workspace cap (1 GiB by default), so the
// f32 weight gradient, which each chunk's dW GEMM reads and writes whole, is passed over a few times per
// micro-batch rather than once per few hundred rows.
//
// Per chunk of rows: logits = x_c w^T (Blas, f32 out) into the workspace; cross_entropy_rows_kernel, one block
// per row, takes the row's max and its sum of exp in double (block reductions, fixed order), writes the loss
// and, for the backward, grad_scale * (softmax - onehot) over the row (in place in f32, or as a bf16 copy when act
// is bf16, since the GEMMs that read it take A and B of one type); then dx_c = dlogits_c w (act) and dw += dlogits_c^T
// x_c (f32) through Blas. Workspace: chunk_rows * vocab f32 (+ as many act elements with bf16), stream-ordered on the
// Blas stream, grown on demand.
#include <algorithm>
#include <string>

#include "backend/lm_head_plan.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/cuda_ops.hpp"
#include "cuda/kernel_support.cuh"
#include "kernel_math/cross_entropy_math.hpp"
#include "ops/cross_entropy.hpp"

namespace llama3::cuda {
namespace {

using namespace kernels;
using namespace kernel_math;

constexpr int kLossThreads = 512;
constexpr int kSumThreads = 256;
constexpr int kSumTile = 4 * kSumThreads;  // floats staged per pass of sum_rows_kernel

// The row's loss into row_loss[row] (if row_loss is set); with write_grad the row becomes
// grad_scale * (softmax - onehot): in place, or rounded into grad_copy when that is set. An ignored row has loss 0
// and gradient 0; a target outside [0, vocab) (the caller checks targets on the host) gives a NaN loss and a 0
// gradient.
//
// The terms are kernel_math/cross_entropy_math.hpp's with its ShiftedExp exponentials (the CPU op takes them in
// double; the CPU tests measure the difference): the max is exact; each thread adds its exponentials in double and
// the block adds the threads' sums in double, so the sum of exponentials is exact to double's round-off at any
// vocabulary; the log-sum-exp is formed in double, each probability through exp_shifted, the target's p - 1
// through expm1 in double.
template <typename T>
__global__ void cross_entropy_rows_kernel(float* logits, T* grad_copy, const int32_t* targets, float* row_loss,
                                          int64_t vocab, float grad_scale, bool write_grad) {
  __shared__ ReduceScratch scratch;
  __shared__ ReduceScratchF64 scratch64;
  const int64_t row = blockIdx.x;
  float* x = logits + row * vocab;
  T* gc = grad_copy != nullptr ? grad_copy + row * vocab : nullptr;
  const int32_t target = targets[row];
  if (target == kIgnoreIndex || target < 0 || target >= vocab) {
    // The same branch for every thread of the block: no barrier is skipped by part of it.
    if (write_grad) {
      for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
        if (gc != nullptr) {
          store(gc, j, 0.0f);
        } else {
          x[j] = 0.0f;
        }
      }
    }
    if (row_loss != nullptr && threadIdx.x == 0) row_loss[row] = target == kIgnoreIndex ? 0.0f : NAN;
    return;
  }
  const float xt = x[target];  // read before any thread overwrites the row
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) mx = fmaxf(mx, x[j]);
  mx = block_max(mx, scratch);
  // The sum of exponentials is 1 (the largest logit's) + rest; rest is summed on its own and log1p taken, and the
  // loss formed from the parts, so that a row whose largest logit holds nearly all the probability keeps the
  // digits of its small loss and p - 1.
  CrossEntropySums part;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) cross_entropy_add<ShiftedExp>(part, x[j], mx);
  const double rest = block_sum(part.rest, scratch64);
  const double ties = block_sum(part.ties, scratch64);  // exact: a sum of small integers
  const double log_sum = cross_entropy_log_sum(rest, ties), dt = cross_entropy_target_shift(xt, mx);
  if (row_loss != nullptr && threadIdx.x == 0) row_loss[row] = static_cast<float>(cross_entropy_loss(log_sum, dt));
  if (!write_grad) return;
  const double m = static_cast<double>(mx);
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float g = j == target ? cross_entropy_target_grad(dt, log_sum, grad_scale)
                                : ShiftedExp::grad(x[j], m, log_sum, grad_scale);
    if (gc != nullptr) {
      store(gc, j, g);
    } else {
      x[j] = g;
    }
  }
}

// out[0] = (accumulate ? out[0] : 0) + s, where s = ((x[0] + x[1]) + x[2]) + ... in double, in row order: the
// host's loop, so the same bits. The block stages a tile of x in shared memory (coalesced loads), thread 0 adds it
// in order; n dependent additions on one thread.
__global__ void sum_rows_kernel(const float* x, int64_t n, double* out, bool accumulate) {
  __shared__ float tile[kSumTile];
  double s = 0.0;
  for (int64_t base = 0; base < n; base += kSumTile) {
    const int64_t rows = n - base < kSumTile ? n - base : kSumTile;
    for (int64_t i = threadIdx.x; i < rows; i += kSumThreads) tile[i] = x[base + i];
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int64_t i = 0; i < rows; ++i) s += static_cast<double>(tile[i]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = accumulate ? out[0] + s : s;
}

}  // namespace

struct LmHeadLoss::Impl {
  Impl(Blas& b, int64_t cap) : blas(b), workspace(b.device()), workspace_cap(cap) {}

  Blas& blas;
  StreamWorkspace workspace;  // on the Blas stream
  int64_t workspace_cap;
  int64_t weight_grad_bytes = 0;
};

LmHeadLoss::LmHeadLoss(Blas& blas, int64_t workspace_cap) {
  if (workspace_cap <= 0) {
    throw zero3::InvalidArgument("LmHeadLoss: workspace_cap = " + std::to_string(workspace_cap) + " must be > 0");
  }
  impl_ = std::make_unique<Impl>(blas, workspace_cap);
}
LmHeadLoss::~LmHeadLoss() = default;

int64_t LmHeadLoss::workspace_bytes() const { return impl_->workspace.bytes(); }
int64_t LmHeadLoss::weight_grad_bytes() const { return impl_->weight_grad_bytes; }

void LmHeadLoss::run(const void* x, const void* w, const int32_t* targets, int64_t n, int64_t hidden, int64_t vocab,
                     float grad_scale, void* dx, float* dw, float* row_loss, int64_t chunk_rows, DType act) {
  const char* op = "LmHeadLoss::run";
  detail::check_act(act, op);
  detail::check_non_negative(n, op, "n");
  if (hidden <= 0 || vocab <= 0) {
    throw zero3::InvalidArgument(std::string(op) + ": hidden " + std::to_string(hidden) + " and vocab " +
                                 std::to_string(vocab) + " must be > 0");
  }
  if (n == 0) return;
  const bool backward = dx != nullptr;
  const bool copy = backward && act != DType::f32;
  const int64_t es = static_cast<int64_t>(zero3::dtype_size(act));
  const LmHeadChunkPlan plan =
      plan_lm_head_chunks(n, hidden, vocab, es, backward, dw != nullptr, impl_->workspace_cap, chunk_rows);
  chunk_rows = plan.rows_per_chunk;
  const int64_t logits_bytes = align_up(chunk_rows * vocab * 4);
  char* ws = impl_->workspace.reserve(plan.workspace_bytes);
  float* logits = reinterpret_cast<float*>(ws);
  void* grad_copy = copy ? ws + logits_bytes : nullptr;
  const void* grad = copy ? grad_copy : static_cast<const void*>(logits);
  Blas& blas = impl_->blas;
  cudaStream_t stream = blas.stream();
  for (int64_t r0 = 0; r0 < n; r0 += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, n - r0);
    const void* xc = static_cast<const char*>(x) + r0 * hidden * es;
    blas.gemm(false, true, rows, vocab, hidden, 1.0f, xc, hidden, w, hidden, 0.0f, logits, vocab, act, DType::f32);
    dispatch_act(act, op, [&](auto tag) {
      using T = typename decltype(tag)::type;
      cross_entropy_rows_kernel<T><<<row_blocks(rows, op), kLossThreads, 0, stream>>>(
          logits, static_cast<T*>(grad_copy), targets + r0, row_loss != nullptr ? row_loss + r0 : nullptr, vocab,
          grad_scale, backward);
      LLAMA3_CUDA_CHECK_LAUNCH("cross_entropy_rows_kernel");
    });
    if (!backward) continue;
    // dx_c = dlogits_c W ; dW += dlogits_c^T x_c
    blas.gemm(false, false, rows, hidden, vocab, 1.0f, grad, vocab, w, hidden, 0.0f,
              static_cast<char*>(dx) + r0 * hidden * es, hidden, act, act);
    if (dw != nullptr) {
      blas.gemm(true, false, vocab, hidden, rows, 1.0f, grad, vocab, xc, hidden, 1.0f, dw, hidden, act, DType::f32);
      impl_->weight_grad_bytes += 8 * vocab * hidden;  // dW read and written whole (beta = 1)
    }
  }
}

void sum_rows(const float* values, int64_t n, double* out, cudaStream_t stream) {
  detail::check_non_negative(n, "sum_rows", "n");
  sum_rows_kernel<<<1, kSumThreads, 0, stream>>>(values, n, out, false);
  LLAMA3_CUDA_CHECK_LAUNCH("sum_rows_kernel");
}

void add_rows(const float* values, int64_t n, double* accumulator, cudaStream_t stream) {
  detail::check_non_negative(n, "add_rows", "n");
  sum_rows_kernel<<<1, kSumThreads, 0, stream>>>(values, n, accumulator, true);
  LLAMA3_CUDA_CHECK_LAUNCH("sum_rows_kernel");
}

}  // namespace llama3::cuda
