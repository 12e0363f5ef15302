// Makes a CUDA device current on the calling thread for the guard's lifetime and restores the previous one.
// Every entry point of the cuda backend that allocates or launches takes one, so a caller whose thread has
// another device current (several devices in one process) still gets its memory on the right device.
//
// Restoring never creates a context: since CUDA 12, cudaSetDevice initialises the device's primary context,
// so switching back to a device the process never used (device 0, current by default on a new thread) would
// put a context on it from every rank of a node. The guard therefore switches back only when the previous
// device's primary context is already active (asked through the driver's cuDevicePrimaryCtxGetState, found at
// run time: no link to libcuda); otherwise the guard's device stays current, as PyTorch's device guards do.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "device/cuda/cuda_check.hpp"

namespace zero3::detail {

// Whether `device` has an active primary context; true when the driver cannot be asked.
inline bool cuda_primary_context_active(int device) {
  using GetState = CUresult (*)(CUdevice, unsigned int*, int*);
  static const GetState get_state = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return static_cast<GetState>(nullptr);
    }
    return reinterpret_cast<GetState>(fn);
  }();
  if (get_state == nullptr) return true;
  unsigned int flags = 0;
  int active = 0;
  return get_state(static_cast<CUdevice>(device), &flags, &active) != CUDA_SUCCESS || active != 0;
}

class CudaDeviceGuard {
 public:
  // A negative `device` leaves the current device alone (for callers whose device is the caller's choice).
  explicit CudaDeviceGuard(int device) {
    if (device < 0) return;
    ZERO3_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device)
      ZERO3_CUDA_CHECK(cudaSetDevice(device));
    else
      previous_ = -1;
  }
  ~CudaDeviceGuard() {
    // Restoring cannot fail for a device that was current a moment ago; an error here has nowhere to go.
    if (previous_ >= 0 && cuda_primary_context_active(previous_)) cudaSetDevice(previous_);
  }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace zero3::detail
