#include "io/aio_engine.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "io/kernel_queue.hpp"
#include "zero3/build_config.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::io {

std::string_view aio_engine_name(AioEngineKind kind) {
  switch (kind) {
    case AioEngineKind::io_uring:
      return "io_uring";
    case AioEngineKind::libaio:
      return "libaio";
    case AioEngineKind::psync:
      return "psync";
  }
  return "?";
}

std::optional<AioEngineKind> parse_aio_engine(std::string_view name) {
  if (name == "io_uring" || name == "uring") return AioEngineKind::io_uring;
  if (name == "libaio" || name == "aio") return AioEngineKind::libaio;
  if (name == "psync" || name == "pread") return AioEngineKind::psync;
  return std::nullopt;
}

// ---- IoFile ----

IoFile IoFile::open(const std::string& path, Mode mode, bool direct, bool create) {
  int flags = O_CLOEXEC;
  flags |= mode == Mode::read ? O_RDONLY : mode == Mode::write ? O_WRONLY : O_RDWR;
  if (direct) flags |= O_DIRECT;
  if (create) flags |= O_CREAT;
  int fd;
  do {
    fd = ::open(path.c_str(), flags, 0600);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    int err = errno;
    const char* how = mode == Mode::read    ? "for reading"
                      : mode == Mode::write ? "for writing"
                                            : "for reading and writing";
    std::string msg = "cannot open " + path + " " + how + (direct ? " with O_DIRECT" : "") + ": " + std::strerror(err) +
                      " (errno " + std::to_string(err) + ")";
    if (direct && err == EINVAL) msg += "; the file system does not support O_DIRECT (direct I/O)";
    throw IoError(msg);
  }
  IoFile f;
  f.fd_ = fd;
  f.path_ = path;
  f.direct_ = direct;
  return f;
}

IoFile::~IoFile() { close(); }

IoFile::IoFile(IoFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)), direct_(other.direct_) {}

IoFile& IoFile::operator=(IoFile&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    direct_ = other.direct_;
  }
  return *this;
}

void IoFile::close() {
  if (fd_ < 0) return;
  if (::close(fd_) != 0) log::warn("closing ", path_, " failed: ", std::strerror(errno));
  fd_ = -1;
}

namespace detail {
namespace {

std::string describe_piece(AioEngineKind kind, const IoPiece& p, const IoRequestState& r) {
  std::string s = std::string(aio_engine_name(kind)) + (p.op == IoOp::read ? " read of " : " write of ") + r.path +
                  " at offset " + std::to_string(p.start_offset) + ", " + std::to_string(p.start_length) + " bytes";
  if (p.start_length != r.bytes) {
    s += " (part of a " + std::to_string(r.bytes) + "-byte request at offset " + std::to_string(r.offset) + ")";
  }
  return s;
}

class QueuedEngine final : public AioEngine {
 public:
  QueuedEngine(AioEngineKind kind, const AioConfig& config, std::vector<std::unique_ptr<KernelQueue>> queues)
      : AioEngine(kind, config), queues_(std::move(queues)) {
    workers_.reserve(queues_.size());
    for (auto& q : queues_) workers_.emplace_back([this, qp = q.get()] { worker_main(*qp); });
  }

  ~QueuedEngine() override {
    drain();
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  IoTicket submit(IoOp op, const IoFile& file, void* buffer, size_t bytes, uint64_t offset) override {
    if (!file.is_open()) throw InvalidArgument(std::string(name()) + ": submit on a file that is not open");
    if (buffer == nullptr && bytes > 0) {
      throw InvalidArgument(std::string(name()) + ": null buffer for " + std::to_string(bytes) + " bytes of " +
                            file.path());
    }
    if (file.direct()) {
      auto misaligned = [](uint64_t x) { return x % kDirectIoAlignment != 0; };
      if (misaligned(reinterpret_cast<uintptr_t>(buffer)) || misaligned(offset) || misaligned(bytes)) {
        throw InvalidArgument(std::string(name()) + (op == IoOp::read ? " read of " : " write of ") + file.path() +
                              " (O_DIRECT): buffer address, offset " + std::to_string(offset) + " and size " +
                              std::to_string(bytes) + " must all be multiples of " +
                              std::to_string(kDirectIoAlignment));
      }
    }
    auto state = std::make_shared<IoRequestState>();
    state->engine = this;
    state->op = op;
    state->path = file.path();
    state->offset = offset;
    state->bytes = bytes;
    size_t block = static_cast<size_t>(config().block_size);
    size_t n_pieces = (bytes + block - 1) / block;
    state->pieces.resize(n_pieces);
    for (size_t i = 0; i < n_pieces; ++i) {
      IoPiece& p = state->pieces[i];
      p.request = state.get();
      p.op = op;
      p.fd = file.fd();
      p.buffer = static_cast<char*>(buffer) + i * block;
      p.length = std::min(block, bytes - i * block);
      p.offset = offset + i * block;
      p.start_offset = p.offset;
      p.start_length = p.length;
    }
    state->pieces_left = n_pieces;
    {
      std::lock_guard lk(mu_);
      if (n_pieces == 0) {
        state->done = true;
        return IoTicket(state);
      }
      live_.emplace(state.get(), state);
      for (auto& p : state->pieces) pending_.push_back(&p);
    }
    work_cv_.notify_all();
    return IoTicket(state);
  }

  void wait(const IoTicket& ticket) override {
    if (!ticket.valid()) throw InvalidArgument(std::string(name()) + ": wait on an empty ticket");
    IoRequestState* s = ticket.state().get();
    if (s->engine != this) throw InvalidArgument(std::string(name()) + ": wait on a ticket of another engine");
    std::unique_lock lk(mu_);
    done_cv_.wait(lk, [&] { return s->done; });
    if (!s->error.empty()) throw IoError(s->error);
  }

  bool ready(const IoTicket& ticket) const override {
    if (!ticket.valid() || ticket.state()->engine != this) return false;
    std::lock_guard lk(mu_);
    return ticket.state()->done;
  }

  void drain() override {
    std::unique_lock lk(mu_);
    done_cv_.wait(lk, [&] { return live_.empty(); });
  }

  AioStats stats() const override {
    std::lock_guard lk(mu_);
    return stats_;
  }

 private:
  void worker_main(KernelQueue& q) {
    const size_t depth = q.depth();
    const bool single_submit = config().single_submit;
    std::vector<IoCompletion> done;
    std::unordered_set<IoPiece*> in_flight;
    std::vector<IoPiece*> batch;
    for (;;) {
      batch.clear();
      {
        std::unique_lock lk(mu_);
        if (in_flight.empty()) work_cv_.wait(lk, [&] { return stop_ || !pending_.empty(); });
        if (stop_ && pending_.empty() && in_flight.empty()) return;
        while (in_flight.size() + batch.size() < depth && !pending_.empty()) {
          batch.push_back(pending_.front());
          pending_.pop_front();
        }
      }
      for (IoPiece* p : batch) {
        in_flight.insert(p);
        q.prepare(p);
        if (single_submit) q.submit(done);
      }
      if (!batch.empty() && !single_submit) q.submit(done);
      if (done.empty() && !in_flight.empty()) {
        try {
          q.reap(done);
        } catch (const std::exception& e) {
          // The queue is unusable: fail what it held (the kernel may still own those buffers, so the error
          // says so) and let the other workers carry on.
          for (IoPiece* p : in_flight) done.push_back({p, -EIO});
          log::error(name(), " queue failed: ", e.what());
        }
      }
      for (const IoCompletion& c : done) {
        in_flight.erase(c.piece);
        settle(*c.piece, c.result);
      }
      done.clear();
    }
  }

  // A piece came back with `result` bytes or -errno: finish it, fail it, or queue the rest again.
  void settle(IoPiece& p, int64_t result) {
    IoRequestState& r = *p.request;
    std::string error;
    bool retry = false;
    if (result == -EINTR || result == -EAGAIN) {
      retry = true;
    } else if (result < 0) {
      int err = static_cast<int>(-result);
      error = describe_piece(kind(), p, r) + " failed: " + std::strerror(err) + " (errno " + std::to_string(err) + ")";
      if (p.length != p.start_length) {
        error += " after " + std::to_string(p.start_length - p.length) + " bytes";
      }
    } else if (result == 0) {
      error = describe_piece(kind(), p, r) + " failed: " +
              (p.op == IoOp::read ? "the file ends at offset " + std::to_string(p.offset)
                                  : "the kernel wrote 0 bytes at offset " + std::to_string(p.offset));
    } else if (static_cast<size_t>(result) < p.length) {
      p.buffer += result;
      p.length -= static_cast<size_t>(result);
      p.offset += static_cast<uint64_t>(result);
      retry = true;
    }
    std::lock_guard lk(mu_);
    if (retry) {
      ++stats_.retries;
      pending_.push_front(&p);
      work_cv_.notify_one();
      return;
    }
    ++stats_.pieces;
    if (error.empty()) {
      (p.op == IoOp::read ? stats_.bytes_read : stats_.bytes_written) += p.start_length;
    } else if (r.error.empty() || p.start_offset < r.error_offset) {
      // Pieces finish in any order: report the first failing one by offset (a read past the end names where the
      // file ends, not the end of a later piece that also found nothing).
      r.error = std::move(error);
      r.error_offset = p.start_offset;
    }
    if (--r.pieces_left == 0) {
      r.done = true;
      live_.erase(&r);  // the ticket may hold the last reference, so nothing touches r after this
      done_cv_.notify_all();
    }
  }

  std::vector<std::unique_ptr<KernelQueue>> queues_;
  std::vector<std::thread> workers_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<IoPiece*> pending_;
  std::unordered_map<IoRequestState*, std::shared_ptr<IoRequestState>> live_;
  AioStats stats_;
  bool stop_ = false;
};

}  // namespace

std::unique_ptr<AioEngine> make_queued_engine(AioEngineKind kind, const AioConfig& config,
                                              std::vector<std::unique_ptr<KernelQueue>> queues) {
  return std::make_unique<QueuedEngine>(kind, config, std::move(queues));
}

}  // namespace detail

bool aio_engine_compiled(AioEngineKind kind) {
  switch (kind) {
    case AioEngineKind::io_uring:
      return ZERO3_HAVE_URING != 0;
    case AioEngineKind::libaio:
      return ZERO3_HAVE_LIBAIO != 0;
    case AioEngineKind::psync:
      return true;
  }
  return false;
}

namespace {

void validate(const AioConfig& c) {
  if (c.block_size <= 0 || c.block_size % static_cast<int64_t>(kDirectIoAlignment) != 0) {
    throw ConfigError("aio.block_size: " + std::to_string(c.block_size) + " is not a positive multiple of " +
                      std::to_string(kDirectIoAlignment) + " bytes (O_DIRECT needs aligned transfers)");
  }
  if (c.queue_depth < 1 || c.queue_depth > 4096) {
    throw ConfigError("aio.queue_depth: " + std::to_string(c.queue_depth) + " is outside 1..4096");
  }
  if (c.intra_op_parallelism < 1 || c.intra_op_parallelism > 256) {
    throw ConfigError("aio.intra_op_parallelism: " + std::to_string(c.intra_op_parallelism) + " is outside 1..256");
  }
}

std::unique_ptr<AioEngine> make_kind(const AioConfig& config, AioEngineKind kind) {
  if (!aio_engine_compiled(kind)) {
    throw Unsupported(std::string(aio_engine_name(kind)) +
                      " is not compiled into this build of zero3 (configure with ZERO3_AIO=ON and liburing-dev / "
                      "libaio-dev installed)");
  }
  std::vector<std::unique_ptr<detail::KernelQueue>> queues;
  auto depth = static_cast<unsigned>(config.queue_depth);
  for (int64_t i = 0; i < config.intra_op_parallelism; ++i) {
    switch (kind) {
      case AioEngineKind::io_uring:
#if ZERO3_HAVE_URING
        queues.push_back(detail::make_uring_queue(depth));
#endif
        break;
      case AioEngineKind::libaio:
#if ZERO3_HAVE_LIBAIO
        queues.push_back(detail::make_libaio_queue(depth));
#endif
        break;
      case AioEngineKind::psync:
        queues.push_back(detail::make_psync_queue());
        break;
    }
  }
  (void)depth;
  return detail::make_queued_engine(kind, config, std::move(queues));
}

}  // namespace

std::unique_ptr<AioEngine> make_aio_engine(const AioConfig& config, std::optional<AioEngineKind> kind) {
  validate(config);
  if (kind) return make_kind(config, *kind);
  for (AioEngineKind k : {AioEngineKind::io_uring, AioEngineKind::libaio}) {
    if (!aio_engine_compiled(k)) continue;
    try {
      return make_kind(config, k);
    } catch (const Error& e) {
      log::warn("NVMe I/O: ", aio_engine_name(k), " is unavailable, trying the next engine: ", e.what());
    }
  }
  return make_kind(config, AioEngineKind::psync);
}

std::vector<AioEngineKind> usable_aio_engines(const AioConfig& config) {
  validate(config);
  std::vector<AioEngineKind> out;
  for (AioEngineKind k : {AioEngineKind::io_uring, AioEngineKind::libaio, AioEngineKind::psync}) {
    if (!aio_engine_compiled(k)) continue;
    try {
      make_kind(config, k);
      out.push_back(k);
    } catch (const Error&) {
    }
  }
  return out;
}

}  // namespace zero3::io
