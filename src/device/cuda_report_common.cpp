// The parts of the CUDA report that need no CUDA, and the report of a build without it.
#include "device/cuda_report.hpp"
#include "zero3/build_config.hpp"

namespace zero3 {

std::string cuda_version_string(int version) {
  if (version <= 0) return "none";
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

#if !ZERO3_HAVE_CUDA
CudaReport query_cuda() { return CudaReport{}; }
#endif

}  // namespace zero3
