// Makes a CUDA device current on the calling thread for the guard's lifetime and restores the previous one.
// Every entry point of the cuda backend that allocates or launches takes one, so a caller whose thread has
// another device current (several devices in one process) still gets its memory on the right device.
#pragma once

#include <cuda_runtime.h>

#include "device/cuda/cuda_check.hpp"

namespace zero3::detail {

class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device) {
    ZERO3_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device)
      ZERO3_CUDA_CHECK(cudaSetDevice(device));
    else
      previous_ = -1;
  }
  ~CudaDeviceGuard() {
    // Restoring cannot fail for a device that was current a moment ago; an error here has nowhere to go.
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace zero3::detail
