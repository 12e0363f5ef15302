// ZERO3_NCCL_CHECK: NCCL's member of the ZERO3_CHECK_GEN family (src/core/check.hpp). A failing call throws
// CommError "<statement> failed: <ncclGetErrorString>: <ncclGetLastError> (rank R, file:line)".
//
// For calls that must return ncclSuccess. On a non-blocking communicator a call may also return
// ncclInProgress; the communicator handles those calls itself (nccl_communicator.cpp).
#pragma once

#include <nccl.h>

#include <string>

#include "core/check.hpp"

namespace zero3::detail {

// "<NCCL's name for r>: <NCCL's last error message for comm>" (comm may be null).
inline std::string nccl_error_detail(ncclResult_t r, ncclComm_t comm) {
  std::string s = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last && *last) s += std::string(": ") + last;
  return s;
}

}  // namespace zero3::detail

#define ZERO3_NCCL_CHECK(stmt) \
  ZERO3_CHECK_GEN(::zero3::CommError, stmt, _r == ncclSuccess, ::zero3::detail::nccl_error_detail(_r, nullptr))
