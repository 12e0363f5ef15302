#include "backend/model_ops.hpp"

#include <string>

#include "backend/cpu_model_ops.hpp"
#include "zero3/error.hpp"

#if LLAMA3_HAVE_CUDA
#include "cuda/cuda_model_ops.hpp"
#endif

namespace llama3 {

std::unique_ptr<ModelOps> make_model_ops(zero3::Device& device, zero3::DType compute) {
  if (device.type() == zero3::DeviceType::cpu) return std::make_unique<CpuModelOps>();
#if LLAMA3_HAVE_CUDA
  return std::make_unique<CudaModelOps>(device, compute);
#else
  throw zero3::Unsupported("the Llama-3 model on " + device.name() +
                           ": this build has no CUDA model path (configure with CUDA to run it on a GPU)");
#endif
}

}  // namespace llama3
