// The checks of the example's CUDA code (cuda/*.cu, cuda/*.cpp): a failing CUDA runtime call or kernel launch
// throws zero3::CudaError "<statement> failed: cudaErrorX: <CUDA's message> (file:line)", and an element type
// the ops do not handle throws zero3::InvalidArgument naming the op.
//
//   LLAMA3_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream));
//   kernel<<<grid, block, 0, stream>>>(...);
//   LLAMA3_CUDA_CHECK_LAUNCH("rmsnorm_forward");   // cudaGetLastError after every launch
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "zero3/dtype.hpp"
#include "zero3/error.hpp"

namespace llama3::cuda::detail {

[[noreturn]] inline void throw_cuda_error(const std::string& what, cudaError_t e, const char* file, int line) {
  // Reading the error clears CUDA's last error when it is not sticky, so a later check does not report it again.
  cudaGetLastError();
  throw zero3::CudaError(what + " failed: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e) + " (" + file + ":" +
                         std::to_string(line) + ")");
}

// act must be f32 or bf16.
inline void check_act(zero3::DType act, const char* op) {
  if (act != zero3::DType::f32 && act != zero3::DType::bf16) {
    throw zero3::InvalidArgument(std::string(op) + ": element type " + std::string(zero3::dtype_name(act)) +
                                 " is not supported (f32 or bf16)");
  }
}

// A size or stride argument must be >= 0.
inline void check_non_negative(int64_t value, const char* op, const char* name) {
  if (value < 0) {
    throw zero3::InvalidArgument(std::string(op) + ": " + name + " = " + std::to_string(value) + " must be >= 0");
  }
}

}  // namespace llama3::cuda::detail

#define LLAMA3_CUDA_CHECK(stmt)                                                              \
  do {                                                                                       \
    const cudaError_t llama3_cuda_err_ = (stmt);                                             \
    if (llama3_cuda_err_ != cudaSuccess)                                                     \
      ::llama3::cuda::detail::throw_cuda_error(#stmt, llama3_cuda_err_, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: `name` says which kernel CUDA refused.
#define LLAMA3_CUDA_CHECK_LAUNCH(name)                                                                         \
  do {                                                                                                         \
    const cudaError_t llama3_cuda_err_ = cudaGetLastError();                                                   \
    if (llama3_cuda_err_ != cudaSuccess)                                                                       \
      ::llama3::cuda::detail::throw_cuda_error(std::string("launch of ") + (name), llama3_cuda_err_, __FILE__, \
                                               __LINE__);                                                      \
  } while (0)
