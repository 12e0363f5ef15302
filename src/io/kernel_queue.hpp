// Internals of the AIO engine: the pieces a request is split into, and the per-worker kernel queue each
// backend implements (an io_uring ring, a libaio context, or plain pread/pwrite).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/aio_engine.hpp"

namespace zero3::io::detail {

struct IoPiece {
  IoRequestState* request = nullptr;
  IoOp op = IoOp::read;
  int fd = -1;
  // What is still to transfer; advanced past the bytes done when a transfer comes back short.
  char* buffer = nullptr;
  size_t length = 0;
  uint64_t offset = 0;
  // The piece as first submitted, for error messages.
  uint64_t start_offset = 0;
  size_t start_length = 0;
};

struct IoRequestState {
  const void* engine = nullptr;  // the engine that owns the request; a ticket is waited on there only
  IoOp op = IoOp::read;
  std::string path;
  uint64_t offset = 0;
  size_t bytes = 0;
  std::vector<IoPiece> pieces;
  // Guarded by the engine's mutex.
  size_t pieces_left = 0;
  bool done = false;
  std::string error;  // the failure of the failing piece nearest the request's start, empty on success
  uint64_t error_offset = 0;  // that piece's offset, so the message does not depend on which piece finished first
};

// A completed (or unsubmittable) piece: result is the byte count transferred or -errno.
struct IoCompletion {
  IoPiece* piece;
  int64_t result;
};

// One kernel submission queue, used by one worker thread only.
class KernelQueue {
 public:
  virtual ~KernelQueue() = default;
  // Most pieces this queue holds in flight.
  virtual size_t depth() const = 0;
  // Adds a piece to the next submission (no system call).
  virtual void prepare(IoPiece* piece) = 0;
  // Hands the prepared pieces to the kernel. Pieces the kernel refused outright are appended to `failed`
  // with their -errno; they are no longer in flight.
  virtual void submit(std::vector<IoCompletion>& failed) = 0;
  // Blocks until at least one piece in flight completes and appends every available completion. Throws
  // IoError when the queue itself fails (the pieces in flight are then lost to the caller).
  virtual void reap(std::vector<IoCompletion>& out) = 0;
};

// Backend factories, one kernel queue of `depth` entries each. They throw IoError when the kernel refuses
// (io_uring_queue_init or io_setup failing), with the backend's own error text.
std::unique_ptr<KernelQueue> make_psync_queue();
std::unique_ptr<KernelQueue> make_uring_queue(unsigned depth);
std::unique_ptr<KernelQueue> make_libaio_queue(unsigned depth);

// The engine over kernel queues: one worker thread per queue, all pulling pieces from one shared list.
std::unique_ptr<AioEngine> make_queued_engine(AioEngineKind kind, const AioConfig& config,
                                              std::vector<std::unique_ptr<KernelQueue>> queues);

}  // namespace zero3::io::detail
