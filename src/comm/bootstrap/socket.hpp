// Small POSIX TCP helpers for the store: an owning descriptor, and connect/send/recv bounded by a deadline.
// Failures throw CommError naming the peer; a passed deadline throws TimeoutError.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace zero3::bootstrap {

using Clock = std::chrono::steady_clock;

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// "host:port" of the socket's peer (or "?" when unknown).
std::string peer_name(int fd);

void set_nonblocking(int fd);

// Connects to host:port (name or address, IPv4 or IPv6) before `deadline`, trying each resolved address once.
// Throws CommError with the last error (refused, unreachable, unknown host).
Fd connect_once(const std::string& host, int port, Clock::time_point deadline);

// Writes all bytes, or throws (peer closed, error, deadline). Works on blocking and non-blocking sockets.
void send_all(int fd, const void* data, size_t size, Clock::time_point deadline, const std::string& peer);

// Reads exactly `size` bytes, or throws CommError (peer closed: "connection closed by <peer>") or
// TimeoutError at the deadline.
void recv_all(int fd, void* data, size_t size, Clock::time_point deadline, const std::string& peer);

// Milliseconds from now until `deadline`, clamped to [0, INT_MAX] for poll().
int poll_timeout_ms(Clock::time_point deadline);

}  // namespace zero3::bootstrap
