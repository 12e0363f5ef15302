// io_uring backend: one ring of queue_depth entries per worker; reads and writes are IORING_OP_READ/WRITE
// on the caller's buffer (no registered buffers, the same as fio's default).
#include <liburing.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "io/kernel_queue.hpp"
#include "zero3/error.hpp"

namespace zero3::io::detail {
namespace {

class UringQueue final : public KernelQueue {
 public:
  explicit UringQueue(unsigned depth) : depth_(depth) {
    int rc = io_uring_queue_init(depth, &ring_, 0);
    if (rc < 0) {
      throw IoError("io_uring_queue_init(" + std::to_string(depth) + " entries) failed: " + std::strerror(-rc) +
                    " (errno " + std::to_string(-rc) +
                    "); io_uring may be disabled (kernel.io_uring_disabled, a seccomp profile or an old kernel)");
    }
  }
  ~UringQueue() override { io_uring_queue_exit(&ring_); }

  size_t depth() const override { return depth_; }

  void prepare(IoPiece* p) override {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    // The worker never holds more than depth pieces, so the ring always has a free entry here.
    if (p->op == IoOp::read) {
      io_uring_prep_read(sqe, p->fd, p->buffer, static_cast<unsigned>(p->length), p->offset);
    } else {
      io_uring_prep_write(sqe, p->fd, p->buffer, static_cast<unsigned>(p->length), p->offset);
    }
    io_uring_sqe_set_data(sqe, p);
    ++unsubmitted_;
  }

  void submit(std::vector<IoCompletion>& failed) override {
    while (unsubmitted_ > 0) {
      int rc = io_uring_submit(&ring_);
      if (rc >= 0) {
        unsubmitted_ -= std::min<size_t>(unsubmitted_, static_cast<size_t>(rc));
        if (rc == 0) std::this_thread::yield();
        continue;
      }
      if (rc == -EINTR) continue;
      if (rc == -EAGAIN || rc == -EBUSY) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
      // The entries stay in the ring and a later submit would issue them; nothing can take them back, so
      // report the failure through reap() where the worker fails every piece it holds.
      broken_ = -rc;
      (void)failed;
      return;
    }
  }

  void reap(std::vector<IoCompletion>& out) override {
    if (broken_ != 0) {
      throw IoError(std::string("io_uring_submit failed: ") + std::strerror(broken_) + " (errno " +
                    std::to_string(broken_) + ")");
    }
    io_uring_cqe* cqe = nullptr;
    int rc;
    do {
      rc = io_uring_wait_cqe(&ring_, &cqe);
    } while (rc == -EINTR);
    if (rc < 0) {
      throw IoError(std::string("io_uring_wait_cqe failed: ") + std::strerror(-rc) + " (errno " + std::to_string(-rc) +
                    ")");
    }
    unsigned head;
    unsigned n = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      out.push_back({static_cast<IoPiece*>(io_uring_cqe_get_data(cqe)), cqe->res});
      ++n;
    }
    io_uring_cq_advance(&ring_, n);
  }

 private:
  io_uring ring_{};
  size_t depth_;
  size_t unsubmitted_ = 0;
  int broken_ = 0;
};

}  // namespace

std::unique_ptr<KernelQueue> make_uring_queue(unsigned depth) { return std::make_unique<UringQueue>(depth); }

}  // namespace zero3::io::detail
