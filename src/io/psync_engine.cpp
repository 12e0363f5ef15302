// psync: the fallback that works everywhere. Each worker thread does one pread/pwrite at a time, so the
// engine's parallelism is aio.intra_op_parallelism threads (queue_depth does not apply).
#include <unistd.h>

#include <cerrno>

#include "io/kernel_queue.hpp"

namespace zero3::io::detail {
namespace {

class PsyncQueue final : public KernelQueue {
 public:
  size_t depth() const override { return 1; }

  void prepare(IoPiece* piece) override { prepared_.push_back(piece); }

  void submit(std::vector<IoCompletion>&) override {}

  void reap(std::vector<IoCompletion>& out) override {
    for (IoPiece* p : prepared_) {
      ssize_t n = p->op == IoOp::read ? ::pread(p->fd, p->buffer, p->length, static_cast<off_t>(p->offset))
                                      : ::pwrite(p->fd, p->buffer, p->length, static_cast<off_t>(p->offset));
      out.push_back({p, n < 0 ? -static_cast<int64_t>(errno) : static_cast<int64_t>(n)});
    }
    prepared_.clear();
  }

 private:
  std::vector<IoPiece*> prepared_;
};

}  // namespace

std::unique_ptr<KernelQueue> make_psync_queue() { return std::make_unique<PsyncQueue>(); }

}  // namespace zero3::io::detail
