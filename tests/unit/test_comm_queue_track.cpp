// CommQueue::track, the path the engine takes on a device with streams: tasks only enqueue their collective
// and hand the Work over; drain() waits for every tracked Work and rethrows the first failure under the
// task's name, poisoning the queue as a failing task does.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "zero/comm_queue.hpp"
#include "zero3/error.hpp"

namespace zero3::detail {
namespace {

// A Work that completes (or fails) when the test says so.
class ManualWork final : public Work {
 public:
  void finish(std::exception_ptr error = nullptr) {
    error_ = error;
    done_ = true;
  }
  void wait() override {
    while (!done_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (error_) std::rethrow_exception(error_);
  }
  bool wait_for(std::chrono::milliseconds) override { return done_; }
  bool is_completed() override { return done_; }

 private:
  std::atomic<bool> done_{false};
  std::exception_ptr error_;
};

TEST(CommQueueTrack, DrainWaitsForTrackedWorks) {
  CommQueue queue(false);
  auto work = std::make_shared<ManualWork>();
  queue.wait(queue.submit("all_gather of unit 'fc1'", [&] { queue.track("all_gather of unit 'fc1'", work); }));
  std::thread finisher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    work->finish();
  });
  queue.drain();  // returns only once the Work is done
  EXPECT_TRUE(work->is_completed());
  finisher.join();
  queue.drain();  // nothing left
}

TEST(CommQueueTrack, FailedWorkSurfacesWithItsNameAndPoisonsTheQueue) {
  for (bool async : {false, true}) {
    CommQueue queue(async);
    auto ok = std::make_shared<ManualWork>();
    auto bad = std::make_shared<ManualWork>();
    ok->finish();
    bad->finish(std::make_exception_ptr(TimeoutError("did not complete within 3 s")));
    queue.submit("reduce_scatter of unit 'a'", [&] { queue.track("reduce_scatter of unit 'a' on rank 0", ok); });
    queue.submit("reduce_scatter of unit 'b'", [&] { queue.track("reduce_scatter of unit 'b' on rank 0", bad); });
    try {
      queue.drain();
      FAIL() << "drain() did not rethrow the tracked failure";
    } catch (const TimeoutError& e) {
      EXPECT_STREQ(e.what(), "reduce_scatter of unit 'b' on rank 0 failed: did not complete within 3 s");
    }
    EXPECT_NE(queue.error(), nullptr);
    bool ran = false;
    queue.submit("after", [&] { ran = true; });
    EXPECT_THROW(queue.drain(), TimeoutError);
    EXPECT_FALSE(ran) << "a poisoned queue runs no more tasks";
  }
}

}  // namespace
}  // namespace zero3::detail
