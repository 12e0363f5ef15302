// The one family of check macros. Every call into CUDA, cuBLAS, NCCL, Gloo or the OS goes through
// ZERO3_CHECK_GEN (or one of its wrappers in the backend that owns the library), which throws a typed
// zero3 error naming the statement, file:line, the rank, and the library's own error string.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>

#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {

// "<what> failed: <detail> (rank R, file.cpp:123)"
std::string describe_failure(const char* what, const std::string& detail, const char* file, int line);

[[noreturn]] void throw_errno(const char* what, int err, const char* file, int line);

}  // namespace zero3::detail

// Generic form: `ok` is an expression over `_r` (the statement's result); `describe` turns `_r` into text.
// (The parameter must not be called `detail`: it would replace the namespace name in the body.)
#define ZERO3_CHECK_GEN(ErrorType, stmt, ok, describe)                                              \
  do {                                                                                               \
    auto _r = (stmt);                                                                                \
    if (!(ok)) {                                                                                     \
      throw ErrorType(::zero3::detail::describe_failure(#stmt, (describe), __FILE__, __LINE__));      \
    }                                                                                                \
  } while (0)

// A syscall returning -1 and setting errno; throws IoError with strerror.
#define ZERO3_CHECK_SYS(stmt)                                                     \
  do {                                                                           \
    if ((stmt) == -1) ::zero3::detail::throw_errno(#stmt, errno, __FILE__, __LINE__); \
  } while (0)

// Throws ErrorType with the streamed arguments when cond is false. For argument and state checks at
// the boundary: name the argument, its value and what was expected.
#define ZERO3_REQUIRE(cond, ErrorType, ...)                          \
  do {                                                               \
    if (!(cond)) throw ErrorType(::zero3::log::concat(__VA_ARGS__)); \
  } while (0)
