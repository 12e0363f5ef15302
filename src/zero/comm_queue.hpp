// The engine's communication queue: every collective the engine issues goes through it, in the order the
// training thread submits them, which is the same order on every rank.
//
// async (overlap_comm): one worker thread runs the tasks one after another while the training thread goes
// on; a task issues its collective, waits for it, and does the work that depends on the result (for a
// reduce-scatter, accumulating into the gradient slices). Otherwise each task runs inside submit().
//
// On a device with streams (cuda) a task only enqueues its collective on a stream and hands the Work to
// track(); the stream order does the rest, and drain() waits for every tracked Work, so a failed or
// timed-out collective still surfaces (at the latest at the next drain) with the name of its task.
//
// A task that throws poisons the queue: the tasks after it are not run (their collectives would no longer
// match the other ranks') and every wait() rethrows the first error.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "zero3/comm.hpp"

namespace zero3::detail {

class CommQueue {
 public:
  struct Task;
  using Ticket = std::shared_ptr<Task>;

  explicit CommQueue(bool async);
  // Lets the running task finish (a collective ends by completing or by its timeout) and drops the rest.
  ~CommQueue();
  CommQueue(const CommQueue&) = delete;
  CommQueue& operator=(const CommQueue&) = delete;

  // Queues `fn`; `what` names it in errors ("all_gather of unit 'layers.3'").
  Ticket submit(std::string what, std::function<void()> fn);

  // Blocks until the task ran; rethrows its error, or the error that poisoned the queue before it.
  void wait(const Ticket& ticket);
  bool done(const Ticket& ticket);
  // Waits for every task submitted so far and every tracked Work; rethrows the first error.
  void drain();
  // Waits for every task submitted so far (not for the Works tracked on streams); rethrows the queue's error.
  void wait_submitted();
  // Called by a task whose collective completes on a stream: drain() waits for `work`; an error is
  // rethrown as "<what> failed: <error>" and poisons the queue.
  void track(std::string what, WorkPtr work);

  bool async() const { return async_; }
  // The error that poisoned the queue, or null.
  std::exception_ptr error();

  // Seconds the calling threads spent blocked on tasks: in wait() and drain() on unfinished tasks, and,
  // without a worker thread, running them inside submit().
  double blocked_seconds();

 private:
  void run(const Ticket& task);
  void worker();

  bool async_;
  std::mutex mu_;
  std::condition_variable cv_;       // worker: new task or stop
  std::condition_variable done_cv_;  // waiters: a task finished
  std::deque<Ticket> pending_;
  Ticket last_;
  bool stop_ = false;
  std::exception_ptr error_;
  std::vector<std::pair<std::string, WorkPtr>> tracked_;
  double blocked_seconds_ = 0.0;
  std::thread thread_;
};

// Inside a catch block for a CommError: throws it again with `prefix` before its message, keeping its type
// (TimeoutError, CollectiveMismatchError), so that the name of the operation is added without losing what failed.
[[noreturn]] void rethrow_comm_error(const std::string& prefix);

struct CommQueue::Task {
  std::string what;
  std::function<void()> fn;
  bool done = false;
  std::exception_ptr error;
};

}  // namespace zero3::detail
