// libaio backend: one kernel AIO context of queue_depth entries per worker (io_setup/io_submit/io_getevents).
// Kernel AIO is only asynchronous with O_DIRECT; buffered files still work, synchronously.
#include <libaio.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "io/kernel_queue.hpp"
#include "zero3/error.hpp"

namespace zero3::io::detail {
namespace {

class LibaioQueue final : public KernelQueue {
 public:
  explicit LibaioQueue(unsigned depth) : depth_(depth), iocbs_(depth), events_(depth) {
    int rc = io_setup(static_cast<int>(depth), &ctx_);
    if (rc < 0) {
      throw IoError("io_setup(" + std::to_string(depth) + ") failed: " + std::strerror(-rc) + " (errno " +
                    std::to_string(-rc) + "); raise fs.aio-max-nr or lower aio.queue_depth");
    }
    for (auto& cb : iocbs_) free_.push_back(&cb);
  }
  ~LibaioQueue() override { io_destroy(ctx_); }

  size_t depth() const override { return depth_; }

  void prepare(IoPiece* p) override {
    iocb* cb = free_.back();
    free_.pop_back();
    if (p->op == IoOp::read) {
      io_prep_pread(cb, p->fd, p->buffer, p->length, static_cast<long long>(p->offset));
    } else {
      io_prep_pwrite(cb, p->fd, p->buffer, p->length, static_cast<long long>(p->offset));
    }
    cb->data = p;
    prepared_.push_back(cb);
  }

  void submit(std::vector<IoCompletion>& failed) override {
    size_t done = 0;
    while (done < prepared_.size()) {
      int rc = io_submit(ctx_, static_cast<long>(prepared_.size() - done), prepared_.data() + done);
      if (rc > 0) {
        done += static_cast<size_t>(rc);
        continue;
      }
      if (rc == -EINTR) continue;
      if (rc == -EAGAIN || rc == 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
      // The first iocb was refused (e.g. EINVAL for an unaligned O_DIRECT transfer, EBADF): fail it alone.
      iocb* cb = prepared_[done++];
      failed.push_back({static_cast<IoPiece*>(cb->data), static_cast<int64_t>(rc)});
      free_.push_back(cb);
    }
    prepared_.clear();
  }

  void reap(std::vector<IoCompletion>& out) override {
    int rc;
    do {
      rc = io_getevents(ctx_, 1, static_cast<long>(depth_), events_.data(), nullptr);
    } while (rc == -EINTR);
    if (rc < 0) {
      throw IoError(std::string("io_getevents failed: ") + std::strerror(-rc) + " (errno " + std::to_string(-rc) + ")");
    }
    for (int i = 0; i < rc; ++i) {
      const io_event& ev = events_[static_cast<size_t>(i)];
      // res carries the byte count, or -errno, in an unsigned long.
      out.push_back({static_cast<IoPiece*>(ev.data), static_cast<int64_t>(static_cast<long>(ev.res))});
      free_.push_back(ev.obj);
    }
  }

 private:
  io_context_t ctx_ = nullptr;
  size_t depth_;
  std::vector<iocb> iocbs_;
  std::vector<io_event> events_;
  std::vector<iocb*> free_;
  std::vector<iocb*> prepared_;
};

}  // namespace

std::unique_ptr<KernelQueue> make_libaio_queue(unsigned depth) { return std::make_unique<LibaioQueue>(depth); }

}  // namespace zero3::io::detail
