// What the CUDA runtime says about this machine, for `zero3 env`: versions and devices. Compiled in every
// build: with CUDA it asks the runtime (src/device/cuda/cuda_report.cpp), without it `compiled` is false.
// Never throws; a failing query is recorded as text. Any cudaGetDeviceCount error means "no device".
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace zero3 {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
  size_t total_bytes = 0;
  int multiprocessors = 0;
  std::string pci_bus_id;
};

struct CudaReport {
  bool compiled = false;
  int toolkit_version = 0;     // CUDART_VERSION zero3 was compiled with (13000 = 13.0)
  int runtime_version = 0;     // cudaRuntimeGetVersion
  int driver_version = 0;      // cudaDriverGetVersion; 0 when no driver is installed
  std::string cublas_version;  // "13.0.2" (cublasGetProperty), empty if unknown
  int device_count = 0;
  std::string no_device;  // CUDA's message when cudaGetDeviceCount failed
  std::vector<CudaDeviceInfo> devices;
};

CudaReport query_cuda();

// 13000 -> "13.0", 12040 -> "12.4"; 0 -> "none".
std::string cuda_version_string(int version);

}  // namespace zero3
