#include "comm/bootstrap/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include "zero3/error.hpp"

namespace zero3::bootstrap {

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string peer_name(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), serv, sizeof(serv),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  return addr.ss_family == AF_INET6 ? "[" + std::string(host) + "]:" + serv : std::string(host) + ":" + serv;
}

void set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw CommError(std::string("fcntl(O_NONBLOCK) failed: ") + std::strerror(errno));
  }
}

int poll_timeout_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > INT_MAX ? INT_MAX : static_cast<int>(left);
}

Fd connect_once(const std::string& host, int port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  std::string port_text = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &list);
  if (rc != 0) throw CommError("cannot resolve store host '" + host + "': " + ::gai_strerror(rc));
  std::string last_error = "no address";
  for (addrinfo* ai = list; ai; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd) {
      last_error = std::strerror(errno);
      continue;
    }
    set_nonblocking(fd.get());
    if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last_error = std::strerror(errno);
        continue;
      }
      pollfd p{fd.get(), POLLOUT, 0};
      int n = ::poll(&p, 1, poll_timeout_ms(deadline));
      if (n <= 0) {
        last_error = n == 0 ? "connect timed out" : std::strerror(errno);
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        last_error = std::strerror(err);
        continue;
      }
    }
    int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ::freeaddrinfo(list);
    return fd;
  }
  ::freeaddrinfo(list);
  throw CommError("cannot connect to " + host + ":" + port_text + ": " + last_error);
}

void send_all(int fd, const void* data, size_t size, Clock::time_point deadline, const std::string& peer) {
  auto* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pf{fd, POLLOUT, 0};
      int r = ::poll(&pf, 1, poll_timeout_ms(deadline));
      if (r == 0) throw TimeoutError("sending to " + peer + " timed out");
      if (r < 0 && errno != EINTR) throw CommError("poll on " + peer + " failed: " + std::strerror(errno));
      continue;
    }
    throw CommError("sending to " + peer + " failed: " + std::strerror(errno));
  }
}

void recv_all(int fd, void* data, size_t size, Clock::time_point deadline, const std::string& peer) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    pollfd pf{fd, POLLIN, 0};
    int r = ::poll(&pf, 1, poll_timeout_ms(deadline));
    if (r == 0) throw TimeoutError("no answer from " + peer + " before the deadline");
    if (r < 0) {
      if (errno == EINTR) continue;
      throw CommError("poll on " + peer + " failed: " + std::strerror(errno));
    }
    ssize_t n = ::recv(fd, p, size, 0);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
    } else if (n == 0) {
      throw CommError("connection closed by " + peer);
    } else if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      throw CommError("receiving from " + peer + " failed: " + std::strerror(errno));
    }
  }
}

}  // namespace zero3::bootstrap
