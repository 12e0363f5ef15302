// The Work of one NCCL collective: a CUDA event recorded on the collective's stream right after it.
//
// The operation is complete when the event has fired, unless the watchdog failed it first (timeout, NCCL
// asynchronous error, abort): a stored error always wins over the event, because aborting a communicator
// ends its kernels and so fires the events behind them. wait() blocks the calling host thread; it polls the
// event (cudaEventQuery, any thread may call it) and sleeps on a condition variable between polls, which the
// watchdog also signals when it fails the Work. The Work owns its event and may outlive the communicator.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>

#include "zero3/comm.hpp"

namespace zero3::comm {

class NcclWork final : public Work {
 public:
  // Takes ownership of `event`.
  NcclWork(std::string description, cudaEvent_t event);
  ~NcclWork() override;
  NcclWork(const NcclWork&) = delete;
  NcclWork& operator=(const NcclWork&) = delete;

  void wait() override;
  bool wait_for(std::chrono::milliseconds timeout) override;
  bool is_completed() override;

  // For the watchdog and the communicator.
  enum class State { running, done, failed };
  State poll();                         // checks the event without blocking
  void fail(std::exception_ptr error);  // no effect once the Work is done
  const std::string& description() const { return description_; }
  std::chrono::steady_clock::time_point issued() const { return issued_; }

 private:
  // With mu_ held: done_ or the event fired. Records a CUDA error of the query as the Work's error.
  bool settle_locked();

  const std::string description_;
  const std::chrono::steady_clock::time_point issued_ = std::chrono::steady_clock::now();
  cudaEvent_t event_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace zero3::comm
