// zero3 errors. Every failure the library detects at run time is thrown as one of these types, never
// reported by exit(), abort() or assert(). what() is a complete sentence for a person: it names the thing
// (config key path, file, rank, unit, collective) and what was expected.
#pragma once

#include <stdexcept>
#include <string>

namespace zero3 {

// Base of every zero3 error.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A DeepSpeed/zero3 JSON config that cannot be used. The message starts with the key path.
class ConfigError : public Error {
  using Error::Error;
};

// A collective, the store, the bootstrap or the transport failed. Names the operation and the ranks.
class CommError : public Error {
  using Error::Error;
};

// A collective or store operation did not complete within its timeout.
class TimeoutError : public CommError {
  using CommError::CommError;
};

// The ranks called different collectives at the same position of their sequence (the operation, count, dtype,
// reduce op or root differ). Found before any data moved, and on every rank alike, so the communicator stays
// usable. Names each rank's call.
class CollectiveMismatchError : public CommError {
  using CommError::CommError;
};

// The CUDA runtime, cuBLAS or a kernel launch failed.
class CudaError : public Error {
  using Error::Error;
};

// A file or disk operation failed. Names the file, the offset and size where relevant, and errno.
class IoError : public Error {
  using Error::Error;
};

// A checkpoint cannot be written, or is missing, corrupt or incompatible.
class CheckpointError : public Error {
  using Error::Error;
};

// An argument to a zero3 call is out of its domain.
class InvalidArgument : public Error {
  using Error::Error;
};

// "<backend> does not support <op>": a backend was asked for something it cannot do.
class Unsupported : public Error {
  using Error::Error;
};

}  // namespace zero3
