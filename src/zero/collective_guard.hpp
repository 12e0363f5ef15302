// The engine's collectives over a communicator that cannot compare calls across ranks itself (nccl: comm.hpp,
// "Agreement"). Ranks whose schedules differ would hand NCCL collectives of different sizes, which hang it or
// move the wrong bytes; the guard keeps any such call from reaching the library.
//
// Before each collective the guard all-gathers a description of it (operation, count, dtype, reduce op, root:
// 4 floats per rank) on the same communicator, on a stream of its own, and compares the descriptions on the
// host; only when every rank issues the same call does the collective itself go out. A difference is a
// CollectiveMismatchError on every rank, the collective is not issued, and the communicator stays in step
// (usable for the exchange that explains the difference). The host waits for each description (on nccl that
// exchange runs after the collectives issued before it), so the training thread runs at most about one
// collective ahead of the device's communication. Its buffers live for one comparison (from the device's caches).
//
// set_checking(false) passes calls straight through: the engine turns the comparison off in the micro-steps it
// does not check entry by entry (after the first, unless zero3.check_schedule_every_step), as PyTorch's
// TORCH_DISTRIBUTED_DEBUG=DETAIL compares collectives only when asked, since each comparison is a host wait.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "comm/collective_args.hpp"
#include "zero3/comm.hpp"
#include "zero3/device.hpp"

namespace zero3::detail {

class CollectiveGuard final : public Communicator {
 public:
  // `device` holds the buffers the communicator works on (its memory for nccl) and must outlive the guard.
  CollectiveGuard(std::shared_ptr<Communicator> inner, Device& device);
  CollectiveGuard(const CollectiveGuard&) = delete;
  CollectiveGuard& operator=(const CollectiveGuard&) = delete;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* backend() const override { return inner_->backend(); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  int cuda_device() const override { return inner_->cuda_device(); }
  bool checks_collectives() const override { return true; }

  WorkPtr all_gather_into(void* out, const void* in, size_t count, DType dtype, Stream stream) override;
  WorkPtr reduce_scatter(void* out, const void* in, size_t count, DType dtype, ReduceOp op, Stream stream) override;
  WorkPtr all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, Stream stream) override;
  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root, Stream stream) override;
  WorkPtr all_to_all(void* out, const void* in, size_t count, DType dtype, Stream stream) override;
  void barrier() override;
  // Point-to-point transfers pass straight through: only two ranks take part, so there is nothing to compare across
  // the world (gloo compares the two sides itself; comm.hpp).
  WorkPtr send_recv(const std::vector<PeerTransfer>& transfers, Stream stream) override {
    return inner_->send_recv(transfers, stream);
  }
  // The child is the inner communicator's, unguarded.
  std::unique_ptr<Communicator> split(int color, int key) override { return inner_->split(color, key); }

  // Calls compared so far.
  uint64_t calls() const { return calls_; }
  // Whether calls are compared before they are issued (the default) or passed through.
  void set_checking(bool on) { checking_ = on; }
  bool checking() const { return checking_; }

 private:
  void agree(const comm::CollectiveCall& call);

  std::shared_ptr<Communicator> inner_;
  Device& device_;
  std::unique_ptr<DeviceStream> stream_;
  std::unique_ptr<DeviceEvent> allocated_;  // recorded on the compute stream after each call's allocation
  uint64_t calls_ = 0;
  bool checking_ = true;
};

}  // namespace zero3::detail
