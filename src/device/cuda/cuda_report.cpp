#include <cublas_api.h>
#include <cuda_runtime.h>

#include "device/cuda_report.hpp"

namespace zero3 {

CudaReport query_cuda() {
  CudaReport r;
  r.compiled = true;
  r.toolkit_version = CUDART_VERSION;
  cudaRuntimeGetVersion(&r.runtime_version);
  if (cudaDriverGetVersion(&r.driver_version) != cudaSuccess) r.driver_version = 0;
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS) {
    r.cublas_version = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
  }
  cudaError_t e = cudaGetDeviceCount(&r.device_count);
  if (e != cudaSuccess) {
    r.device_count = 0;
    r.no_device = cudaGetErrorString(e);
    cudaGetLastError();
    return r;
  }
  for (int i = 0; i < r.device_count; ++i) {
    cudaDeviceProp p{};
    CudaDeviceInfo d;
    d.index = i;
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
      d.name = std::string("(properties unavailable: ") + cudaGetErrorString(cudaGetLastError()) + ")";
    } else {
      d.name = p.name;
      d.cc_major = p.major;
      d.cc_minor = p.minor;
      d.total_bytes = p.totalGlobalMem;
      d.multiprocessors = p.multiProcessorCount;
      char bus[32] = {};
      if (cudaDeviceGetPCIBusId(bus, sizeof bus, i) == cudaSuccess) d.pci_bus_id = bus;
    }
    r.devices.push_back(d);
  }
  return r;
}

}  // namespace zero3
