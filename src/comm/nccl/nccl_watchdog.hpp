// The watchdog of one NCCL communicator: NCCL has no timeouts of its own, so a peer that dies or never
// reaches a collective leaves the others spinning on the GPU forever. A thread per communicator checks, every
// poll interval, the completion events of the issued collectives and ncclCommGetAsyncError; a collective
// still running after the communicator's timeout, or an asynchronous NCCL error, aborts the communicator
// (ncclCommAbort, which ends its kernels) and fails every unfinished Work with an error that names the
// collective, its count and dtype, this rank, the communicator's size and NCCL's own error text.
//
// Locking: NcclCommState::mu is held for every NCCL call on the communicator and for the abort, so an abort
// never races an issuing thread; the pending list has its own mutex, taken after (never before) state.mu.
#pragma once

#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/nccl/nccl_work.hpp"

namespace zero3::comm {

// What a communicator shares with its watchdog.
struct NcclCommState {
  std::mutex mu;
  ncclComm_t comm = nullptr;  // null once aborted or destroyed
  bool aborted = false;
  std::string abort_reason;
  std::string name;  // "nccl communicator (rank 3 of 16, device 0)"
  int rank = 0;
  int size = 1;
  int device = 0;
  std::chrono::milliseconds timeout{600000};
};

class NcclWatchdog {
 public:
  explicit NcclWatchdog(std::shared_ptr<NcclCommState> state);
  ~NcclWatchdog();
  NcclWatchdog(const NcclWatchdog&) = delete;
  NcclWatchdog& operator=(const NcclWatchdog&) = delete;

  // Caller holds state->mu (so an abort cannot fall between issuing a collective and watching it).
  void add_locked(std::shared_ptr<NcclWork> work);

  // Caller holds state->mu. Marks the communicator aborted, fails every unfinished Work with `reason`, then
  // calls ncclCommAbort. Idempotent.
  void abort_locked(const std::string& reason);

  // Ends the thread. Unfinished Works stay pending (see take_pending).
  void stop();
  std::vector<std::shared_ptr<NcclWork>> take_pending();

  std::chrono::milliseconds interval() const { return interval_; }

 private:
  void run();
  void check_once();

  std::shared_ptr<NcclCommState> state_;
  std::chrono::milliseconds interval_;
  std::mutex list_mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<std::shared_ptr<NcclWork>> pending_;  // issue order: the front is the oldest
  std::thread thread_;
};

}  // namespace zero3::comm
