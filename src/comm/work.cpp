#include "comm/work.hpp"

#include "zero3/error.hpp"

namespace zero3 {

namespace {

class CompletedWork final : public Work {
 public:
  void wait() override {}
  bool wait_for(std::chrono::milliseconds) override { return true; }
  bool is_completed() override { return true; }
};

}  // namespace

WorkPtr completed_work() {
  // Stateless, so one shared instance serves every caller.
  static const WorkPtr done = std::make_shared<CompletedWork>();
  return done;
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::max:
      return "max";
  }
  return "?";
}

namespace comm {

void AsyncWork::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  // The worker enforces the timeout on every transfer it waits for, so it always finishes; this bound only
  // guards against a worker stuck outside the transport. A large operation may legitimately run longer than
  // one timeout in total, and the caller may free its buffers once wait() returns or throws, so the bound is
  // generous: twice the timeout plus half a minute.
  auto limit = 2 * timeout_ + std::chrono::seconds(30);
  if (!cv_.wait_for(lock, limit, [&] { return done_; })) {
    throw TimeoutError(description_ + " did not complete within " + std::to_string(limit.count()) +
                       " ms; the communicator's worker is stuck and the job must be stopped");
  }
  if (error_) std::rethrow_exception(error_);
}

bool AsyncWork::wait_for(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return done_; })) return false;
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool AsyncWork::is_completed() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void AsyncWork::complete() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
}

void AsyncWork::fail(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::move(error);
    done_ = true;
  }
  cv_.notify_all();
}

}  // namespace comm
}  // namespace zero3
