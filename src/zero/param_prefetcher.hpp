// Reads of NVMe-offloaded parameter slices ahead of their all-gathers (DeepSpeed's
// AsyncPartitionedParameterSwapper): a fixed pool of offload_param.buffer_count aligned host buffers, each large
// enough for the largest slice, each holding at most one unit's slice.
//
// A buffer is free, reading (a read started ahead by start(); it may have finished) or claimed (its slice feeds an
// all-gather until release()). The engine calls start() for the units the schedule will gather next, as long as
// buffers are free, and claim() when it issues a unit's all-gather: claim() waits only for the rest of that unit's
// read, beginning it first when none was started (in a free buffer, or else in the one read furthest ahead, whose
// read is dropped). discard() drops a read started ahead, before the unit's slice is rewritten, so no buffer ever
// holds a slice older than the file.
//
// Errors: start() never throws; a read that cannot be started or fails is kept with its buffer and thrown by the
// claim() of that unit as the IoError of the I/O engine or ParamSwap (file, offset, size, errno). The buffer is
// free again afterwards.
//
// Threads: the engine's training thread only; the I/O engine's threads do the reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <vector>

#include "io/aio_engine.hpp"
#include "io/aligned_buffer.hpp"
#include "zero/param_swap.hpp"

namespace zero3::detail {

class ParamPrefetcher {
 public:
  struct Claim {
    const std::byte* data = nullptr;  // the unit's slice (ParamSwap::slice_bytes), valid until release(unit)
    bool read_ahead = false;          // the read was started by start(), before this claim
    double wait_seconds = 0;          // how long claim() blocked on the read
  };

  // `swap` must outlive the prefetcher. buffer_count >= 1 (InvalidArgument otherwise).
  ParamPrefetcher(ParamSwap& swap, size_t buffer_count);
  // Waits for the reads in flight: the kernel may still be writing into the buffers.
  ~ParamPrefetcher();
  ParamPrefetcher(const ParamPrefetcher&) = delete;
  ParamPrefetcher& operator=(const ParamPrefetcher&) = delete;

  // Starts reading `unit` ahead into a free buffer. False when no buffer is free (nothing started); true when the
  // unit has a buffer now (also when it already had one).
  bool start(size_t unit);
  // Blocks until `unit`'s slice is in a buffer and returns it, claimed. Needs can_claim(unit). Throws the read's
  // IoError.
  Claim claim(size_t unit);
  // Returns `unit`'s claimed buffer to the pool; the caller no longer reads it.
  void release(size_t unit);
  // Drops a read of `unit` started ahead (waiting for the kernel to be done with the buffer, ignoring its
  // error); nothing when the unit has no buffer. InvalidArgument when its buffer is claimed.
  void discard(size_t unit);

  bool holds(size_t unit) const { return slot_of_.at(unit) >= 0; }
  bool claimed(size_t unit) const;
  // The unit holds a buffer, or some buffer is not claimed.
  bool can_claim(size_t unit) const;
  size_t free_buffers() const;
  // The units whose buffers are claimed, the longest-claimed first.
  std::vector<size_t> claimed_units() const;
  // The units read ahead and not claimed, the earliest started first.
  std::vector<size_t> reading_units() const;
  // Whether the read of a unit read ahead is complete (successfully or not); never blocks.
  bool read_done(size_t unit) const;
  size_t buffer_count() const { return slots_.size(); }
  size_t buffer_bytes() const { return buffer_bytes_; }

 private:
  struct Slot {
    enum class State { free, reading, claimed } state = State::free;
    io::AlignedBuffer buffer;
    size_t unit = 0;
    io::IoTicket ticket;
    std::exception_ptr error;  // the read could not be started
    uint64_t seq = 0;          // when it was started (reading) or claimed (claimed)
  };

  std::vector<size_t> units_in(Slot::State state) const;
  Slot& take_slot();
  void begin_read(Slot& slot, size_t unit);
  void settle(Slot& slot) noexcept;

  ParamSwap& swap_;
  size_t buffer_bytes_ = 0;
  std::vector<Slot> slots_;
  std::vector<int> slot_of_;  // per unit: its slot, or -1
  uint64_t seq_ = 0;
};

}  // namespace zero3::detail
