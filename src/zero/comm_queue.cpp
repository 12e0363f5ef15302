#include "zero/comm_queue.hpp"

#include <chrono>

#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {

CommQueue::CommQueue(bool async) : async_(async) {
  if (async_) thread_ = std::thread([this] { worker(); });
}

CommQueue::~CommQueue() {
  if (!async_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    if (!pending_.empty()) log::debug("communication queue: dropping ", pending_.size(), " queued operations");
    for (auto& t : pending_) {
      t->error = std::make_exception_ptr(std::runtime_error("dropped: the engine was destroyed"));
      t->done = true;
    }
    pending_.clear();
  }
  cv_.notify_all();
  done_cv_.notify_all();
  thread_.join();
}

void CommQueue::run(const Ticket& task) {
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lock(mu_);
    err = error_;
  }
  if (!err) {
    try {
      task->fn();
    } catch (...) {
      err = std::current_exception();
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = err;
    }
  }
  task->fn = nullptr;  // drop captured buffers' references early
  std::lock_guard<std::mutex> lock(mu_);
  task->error = err;
  task->done = true;
}

CommQueue::Ticket CommQueue::submit(std::string what, std::function<void()> fn) {
  auto task = std::make_shared<Task>();
  task->what = std::move(what);
  task->fn = std::move(fn);
  if (!async_) {
    // Inline, the submitting thread itself is the one blocked for the collective's duration.
    auto start = std::chrono::steady_clock::now();
    run(task);
    double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::lock_guard<std::mutex> lock(mu_);
    blocked_seconds_ += spent;
    last_ = task;
    return task;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(task);
    last_ = task;
  }
  cv_.notify_one();
  return task;
}

void CommQueue::worker() {
  for (;;) {
    Ticket task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
      if (stop_) return;
      task = pending_.front();
      pending_.pop_front();
    }
    run(task);
    done_cv_.notify_all();
  }
}

void CommQueue::wait(const Ticket& ticket) {
  if (!ticket) return;
  std::exception_ptr err;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!ticket->done) {
      auto start = std::chrono::steady_clock::now();
      done_cv_.wait(lock, [&] { return ticket->done; });
      blocked_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    err = ticket->error;
  }
  if (err) std::rethrow_exception(err);
}

bool CommQueue::done(const Ticket& ticket) {
  if (!ticket) return true;
  std::lock_guard<std::mutex> lock(mu_);
  return ticket->done;
}

void CommQueue::track(std::string what, WorkPtr work) {
  std::lock_guard<std::mutex> lock(mu_);
  tracked_.emplace_back(std::move(what), std::move(work));
}

void CommQueue::wait_submitted() {
  Ticket last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = last_;
  }
  wait(last);
}

void CommQueue::drain() {
  Ticket last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = last_;
  }
  wait(last);
  std::vector<std::pair<std::string, WorkPtr>> tracked;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_) std::rethrow_exception(error_);
    tracked.swap(tracked_);
  }
  auto start = std::chrono::steady_clock::now();
  std::exception_ptr err;
  for (auto& [what, work] : tracked) {
    try {
      try {
        work->wait();
      } catch (const CommError&) {
        rethrow_comm_error(what + " failed: ");
      }
    } catch (...) {
      if (!err) err = std::current_exception();
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  blocked_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (err && !error_) error_ = err;
  if (error_) std::rethrow_exception(error_);
}

void rethrow_comm_error(const std::string& prefix) {
  try {
    throw;
  } catch (const CollectiveMismatchError& e) {
    throw CollectiveMismatchError(prefix + e.what());
  } catch (const TimeoutError& e) {
    throw TimeoutError(prefix + e.what());
  } catch (const CommError& e) {
    throw CommError(prefix + e.what());
  }
}

double CommQueue::blocked_seconds() {
  std::lock_guard<std::mutex> lock(mu_);
  return blocked_seconds_;
}

std::exception_ptr CommQueue::error() {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

}  // namespace zero3::detail
