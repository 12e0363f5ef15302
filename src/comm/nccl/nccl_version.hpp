// NCCL's versions, without NCCL's headers (for `zero3 env`). Only in builds with NCCL (ZERO3_HAVE_NCCL).
#pragma once

#include <string>

namespace zero3::comm {

std::string nccl_runtime_version();  // of the loaded libnccl (ncclGetVersion), "2.28.9"
std::string nccl_build_version();    // of the nccl.h zero3 was compiled against

}  // namespace zero3::comm
