// Work implementations shared by the host backends.
#pragma once

#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>

#include "zero3/comm.hpp"

namespace zero3::comm {

// A Work completed from another thread (a backend's worker) with either success or a stored exception.
// wait() rethrows the stored exception on every call. The worker turns a transport timeout into the stored
// TimeoutError; wait() itself gives up only after twice `timeout` plus 30 s, for a worker that is stuck.
// `description` names the collective, count, dtype and rank.
class AsyncWork : public Work {
 public:
  AsyncWork(std::string description, std::chrono::milliseconds timeout)
      : description_(std::move(description)), timeout_(timeout) {}

  void wait() override;
  bool wait_for(std::chrono::milliseconds timeout) override;
  bool is_completed() override;

  // Called once by the thread that ran the operation.
  void complete();
  void fail(std::exception_ptr error);

  const std::string& description() const { return description_; }

 private:
  std::string description_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace zero3::comm
