#include "comm/nccl/nccl_version.hpp"

#include <nccl.h>

#include "comm/nccl/nccl_check.hpp"

namespace zero3::comm {

std::string nccl_runtime_version() {
  int v = 0;
  ZERO3_NCCL_CHECK(ncclGetVersion(&v));
  // NCCL_VERSION(): X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z since 2.9.
  int major = v >= 10000 ? v / 10000 : v / 1000;
  int minor = v >= 10000 ? (v % 10000) / 100 : (v % 1000) / 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(v % 100);
}

std::string nccl_build_version() {
  return std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." + std::to_string(NCCL_PATCH);
}

}  // namespace zero3::comm
