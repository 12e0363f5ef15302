// The asynchronous I/O engine behind NVMe offload and `zero3 iobench`: reads and writes of whole buffers at
// file offsets, split into block_size pieces with up to queue_depth pieces in flight per worker.
//
// Backends, chosen at run time: io_uring (liburing), libaio, and psync (pread/pwrite on a pool of threads).
// make_aio_engine() with no kind tries them in that order and logs why one was skipped (io_uring_queue_init
// fails under some seccomp profiles, for instance); asking for a kind by name never falls back quietly.
//
// Contract:
//  - submit() queues a request and returns at once; the engine's own threads (intra_op_parallelism of them,
//    each with its own kernel queue of queue_depth entries) submit and reap it. The caller's buffer must stay
//    alive and untouched until wait() on its ticket returns (or the engine is destroyed, which waits).
//  - Short reads and writes and EINTR/EAGAIN are retried until the whole piece is done. A read that meets the
//    end of the file, and every other failure, is an IoError naming the backend, the operation, the file,
//    the offset, the size and errno's text; wait() on that request's ticket throws it.
//  - Files opened with O_DIRECT need buffer address, offset and size aligned to kDirectIoAlignment (4096);
//    submit() checks and throws InvalidArgument otherwise.
//  - submit(), wait() and ready() may be called from any thread; one ticket is waited on by one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zero3/config.hpp"

namespace zero3::io {

// Alignment of buffers, offsets and sizes for O_DIRECT (the largest logical block size in common use).
inline constexpr size_t kDirectIoAlignment = 4096;

enum class AioEngineKind { io_uring, libaio, psync };

std::string_view aio_engine_name(AioEngineKind kind);

// "io_uring" (also "uring"), "libaio" (also "aio"), "psync" (also "pread"); nullopt otherwise.
std::optional<AioEngineKind> parse_aio_engine(std::string_view name);

enum class IoOp : uint8_t { read, write };

// An open file for the engine: owns the descriptor, remembers the path for error messages and whether it
// was opened with O_DIRECT. Move-only.
class IoFile {
 public:
  enum class Mode { read, write, read_write };

  IoFile() = default;
  // open(2) with O_CLOEXEC (plus O_DIRECT when `direct`, O_CREAT with mode 0600 when `create`). Throws
  // IoError "cannot open <path> (<how>): <strerror>"; EINVAL with O_DIRECT is reported as "the file system
  // does not support O_DIRECT".
  static IoFile open(const std::string& path, Mode mode, bool direct, bool create = false);
  ~IoFile();
  IoFile(IoFile&& other) noexcept;
  IoFile& operator=(IoFile&& other) noexcept;
  IoFile(const IoFile&) = delete;
  IoFile& operator=(const IoFile&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }
  bool is_open() const { return fd_ >= 0; }
  void close();  // a failed close is logged, not thrown

 private:
  int fd_ = -1;
  std::string path_;
  bool direct_ = false;
};

namespace detail {
struct IoRequestState;
}

// A handle on one submitted request. Copyable; empty when default-constructed.
class IoTicket {
 public:
  IoTicket() = default;
  explicit IoTicket(std::shared_ptr<detail::IoRequestState> state) : state_(std::move(state)) {}
  bool valid() const { return state_ != nullptr; }
  const std::shared_ptr<detail::IoRequestState>& state() const { return state_; }

 private:
  std::shared_ptr<detail::IoRequestState> state_;
};

// Counters since the engine was made (all requests, including failed ones).
struct AioStats {
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t pieces = 0;   // block_size pieces completed
  uint64_t retries = 0;  // short transfers and EINTR/EAGAIN resubmitted
};

class AioEngine {
 public:
  virtual ~AioEngine() = default;
  AioEngine(const AioEngine&) = delete;
  AioEngine& operator=(const AioEngine&) = delete;

  AioEngineKind kind() const { return kind_; }
  std::string_view name() const { return aio_engine_name(kind_); }
  const AioConfig& config() const { return config_; }

  // Queues `bytes` bytes between `buffer` and `file` at `offset`. `file` must outlive the request.
  virtual IoTicket submit(IoOp op, const IoFile& file, void* buffer, size_t bytes, uint64_t offset) = 0;
  IoTicket submit_read(const IoFile& file, void* buffer, size_t bytes, uint64_t offset) {
    return submit(IoOp::read, file, buffer, bytes, offset);
  }
  IoTicket submit_write(const IoFile& file, const void* buffer, size_t bytes, uint64_t offset) {
    return submit(IoOp::write, file, const_cast<void*>(buffer), bytes, offset);
  }

  // Blocks until the request is complete; throws its IoError if it failed (every time it is waited on).
  virtual void wait(const IoTicket& ticket) = 0;
  // True when the request is complete (successfully or not); never blocks, never throws.
  virtual bool ready(const IoTicket& ticket) const = 0;
  // Blocks until every request submitted so far is complete. Does not throw; errors stay with the tickets.
  virtual void drain() = 0;

  // Blocking conveniences: submit and wait.
  void read(const IoFile& file, void* buffer, size_t bytes, uint64_t offset) {
    wait(submit_read(file, buffer, bytes, offset));
  }
  void write(const IoFile& file, const void* buffer, size_t bytes, uint64_t offset) {
    wait(submit_write(file, buffer, bytes, offset));
  }

  virtual AioStats stats() const = 0;

 protected:
  AioEngine(AioEngineKind kind, const AioConfig& config) : kind_(kind), config_(config) {}

 private:
  AioEngineKind kind_;
  AioConfig config_;
};

// True when this build carries the backend (psync: always). Says nothing about whether the kernel allows it.
bool aio_engine_compiled(AioEngineKind kind);

// Makes an engine. With a kind: that backend or an error (Unsupported when not compiled in, IoError when
// the kernel refuses it, e.g. io_uring under seccomp). Without: io_uring, then libaio, then psync, logging
// at warn level why a faster backend was skipped. Config values out of range are a ConfigError naming the
// aio.* key (block_size a positive multiple of 4096; queue_depth and intra_op_parallelism >= 1).
std::unique_ptr<AioEngine> make_aio_engine(const AioConfig& config, std::optional<AioEngineKind> kind = std::nullopt);

// The kinds that can actually be made here, in preference order (tries each one).
std::vector<AioEngineKind> usable_aio_engines(const AioConfig& config = {});

}  // namespace zero3::io
