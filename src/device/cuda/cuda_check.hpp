// ZERO3_CUDA_CHECK: the CUDA runtime's member of the ZERO3_CHECK_GEN family (src/core/check.hpp). A failing
// call throws CudaError "<statement> failed: cudaErrorX: <CUDA's message> (device D) (rank R, file:line)".
// Only for code compiled with CUDA (src/device/cuda, src/comm/nccl).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/check.hpp"

namespace zero3::detail {

inline std::string cuda_error_detail(cudaError_t e) {
  // Reading the error also clears CUDA's "last error" for non-sticky errors, so a later unrelated check
  // does not report this one again.
  cudaGetLastError();
  std::string s = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
  int device = -1;
  if (cudaGetDevice(&device) == cudaSuccess) s += " (device " + std::to_string(device) + ")";
  return s;
}

}  // namespace zero3::detail

#define ZERO3_CUDA_CHECK(stmt) \
  ZERO3_CHECK_GEN(::zero3::CudaError, stmt, _r == cudaSuccess, ::zero3::detail::cuda_error_detail(_r))
