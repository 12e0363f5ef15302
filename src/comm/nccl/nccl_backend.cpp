// Registers the "nccl" communicator backend. "auto" picks it when this process sees a CUDA device.
#include <cuda_runtime.h>

#include "comm/nccl/nccl_communicator.hpp"
#include "comm/registry.hpp"

namespace zero3::comm {
namespace {

std::unique_ptr<Communicator> make_nccl(const CommOptions& options, const LaunchInfo& launch,
                                        std::shared_ptr<Store> store) {
  return std::make_unique<NcclCommunicator>(options, launch, std::move(store));
}

bool nccl_usable(const CommOptions&, const LaunchInfo&) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // "no driver" is an answer here, not an error to report later
    return false;
  }
  return count > 0;
}

const BackendRegistrar kNcclBackend("nccl", &make_nccl, &nccl_usable);

}  // namespace
}  // namespace zero3::comm
