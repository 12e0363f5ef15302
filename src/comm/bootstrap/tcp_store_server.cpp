// The store's server: one thread, poll() over the listening socket, an eventfd for shutdown, and every
// client. All sockets are non-blocking; a client never makes the thread wait.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <exception>
#include <list>
#include <unordered_map>

#include "comm/bootstrap/store_protocol.hpp"
#include "comm/bootstrap/tcp_store.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::bootstrap {
namespace proto = protocol;

namespace {

constexpr auto kNever = Clock::time_point::max();
constexpr size_t kReadChunk = 64 * 1024;

bool is_numeric_host(const std::string& host) {
  in_addr a4;
  in6_addr a6;
  return inet_pton(AF_INET, host.c_str(), &a4) == 1 || inet_pton(AF_INET6, host.c_str(), &a6) == 1;
}

// Binds to `host` when it is a numeric address (127.0.0.1 keeps the store on loopback), otherwise to every
// interface: a name may resolve differently here than on the other nodes, or not at all yet (Kubernetes
// publishes a pod's DNS record only after it starts).
Fd bind_listen(const std::string& host, int port, int* bound_port) {
  std::vector<std::pair<std::string, int>> candidates;  // (address, family)
  if (is_numeric_host(host)) {
    candidates.push_back({host, host.find(':') == std::string::npos ? AF_INET : AF_INET6});
  } else {
    candidates.push_back({"::", AF_INET6});
    candidates.push_back({"0.0.0.0", AF_INET});
    if (host != "localhost") log::debug("store server: '", host, "' is a name; listening on every interface");
  }
  std::string last_error;
  for (const auto& [addr, family] : candidates) {
    Fd fd(::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) {
      last_error = std::strerror(errno);
      continue;
    }
    int one = 1, zero = 0;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_storage ss{};
    socklen_t len = 0;
    if (family == AF_INET6) {
      ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));  // also accept IPv4
      auto* sa = reinterpret_cast<sockaddr_in6*>(&ss);
      sa->sin6_family = AF_INET6;
      sa->sin6_port = htons(static_cast<uint16_t>(port));
      inet_pton(AF_INET6, addr.c_str(), &sa->sin6_addr);
      len = sizeof(sockaddr_in6);
    } else {
      auto* sa = reinterpret_cast<sockaddr_in*>(&ss);
      sa->sin_family = AF_INET;
      sa->sin_port = htons(static_cast<uint16_t>(port));
      inet_pton(AF_INET, addr.c_str(), &sa->sin_addr);
      len = sizeof(sockaddr_in);
    }
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
      int err = errno;
      last_error = "bind " + addr + ":" + std::to_string(port) + ": " + std::strerror(err);
      if (err == EADDRINUSE) break;  // another family will not help
      continue;
    }
    if (::listen(fd.get(), 1024) != 0) {
      last_error = std::string("listen: ") + std::strerror(errno);
      continue;
    }
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len);
    *bound_port = ntohs(family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    return fd;
  }
  throw CommError("zero3 store cannot listen on " + host + ":" + std::to_string(port) + ": " + last_error +
                  (last_error.find("in use") != std::string::npos
                       ? " (another job or torchrun's own store holds this port; set ZERO3_STORE_PORT)"
                       : ""));
}

struct Client {
  Fd fd;
  std::string peer;
  bool greeted = false;
  std::vector<uint8_t> in;
  size_t in_pos = 0;
  std::vector<uint8_t> out;
  size_t out_pos = 0;
  Clock::time_point read_deadline = kNever;  // greeting or a started frame must arrive by then
  bool waiting = false;                      // a get/wait is parked until its keys exist
  proto::Request pending;
  Clock::time_point wait_deadline = kNever;
  bool eof = false;
  bool dead = false;
  bool violation = false;  // dropped for breaking the protocol (counted, logged as a warning)
  std::string drop_reason;

  size_t buffered() const { return in.size() - in_pos; }
};

class Server {
 public:
  Server(const TcpStoreServerOptions& options, std::atomic<size_t>& dropped, std::atomic<size_t>& connected)
      : options_(options), dropped_(dropped), connected_(connected) {}

  void run(int listen_fd, int wake_fd, const std::atomic<bool>& stopping);

 private:
  void accept_all(int listen_fd);
  void read_from(Client& c);
  void process(Client& c);
  void handle(Client& c, proto::Request req);
  bool keys_present(const proto::Request& req, std::string* missing) const;
  void finish_wait(Client& c);
  void wake_waiters();
  void reply(Client& c, proto::Status status, const std::string& payload);
  void flush(Client& c);
  void drop(Client& c, std::string reason, bool violation);
  void reap();

  const TcpStoreServerOptions& options_;
  std::atomic<size_t>& dropped_;
  std::atomic<size_t>& connected_;
  std::list<Client> clients_;
  std::unordered_map<std::string, std::string> table_;
  size_t table_bytes_ = 0;
  bool woke_waiters_ = false;
};

void Server::run(int listen_fd, int wake_fd, const std::atomic<bool>& stopping) {
  Clock::time_point linger_deadline = kNever;
  std::vector<pollfd> fds;
  std::vector<Client*> owners;
  while (true) {
    if (stopping.load()) {
      if (linger_deadline == kNever) linger_deadline = Clock::now() + options_.linger;
      size_t greeted = std::count_if(clients_.begin(), clients_.end(), [](const Client& c) { return c.greeted; });
      if (greeted == 0 || Clock::now() >= linger_deadline) {
        if (greeted) log::warn("store server: closing with ", greeted, " clients still connected");
        break;
      }
    }
    fds.clear();
    owners.clear();
    fds.push_back({wake_fd, POLLIN, 0});
    owners.push_back(nullptr);
    if (!stopping.load()) {
      fds.push_back({listen_fd, POLLIN, 0});
      owners.push_back(nullptr);
    }
    Clock::time_point next = linger_deadline;
    for (auto& c : clients_) {
      short events = POLLRDHUP;
      if (!c.waiting && !c.eof) events |= POLLIN;
      if (c.out_pos < c.out.size()) events |= POLLOUT;
      fds.push_back({c.fd.get(), events, 0});
      owners.push_back(&c);
      next = std::min({next, c.read_deadline, c.waiting ? c.wait_deadline : kNever});
    }
    int n = ::poll(fds.data(), fds.size(), next == kNever ? -1 : poll_timeout_ms(next));
    if (n < 0 && errno != EINTR) {
      log::error("store server: poll failed: ", std::strerror(errno), "; the store stops serving");
      break;
    }
    if (n > 0) {
      for (size_t i = 0; i < fds.size(); ++i) {
        if (!fds[i].revents) continue;
        if (fds[i].fd == wake_fd && !owners[i]) {
          uint64_t v;
          [[maybe_unused]] ssize_t r = ::read(wake_fd, &v, sizeof(v));
        } else if (fds[i].fd == listen_fd && !owners[i]) {
          accept_all(listen_fd);
        } else if (Client* c = owners[i]) {
          if (fds[i].revents & (POLLERR | POLLNVAL)) {
            drop(*c, "socket error", false);
            continue;
          }
          if (fds[i].revents & POLLOUT) flush(*c);
          if (fds[i].revents & POLLIN) read_from(*c);
          // The peer hung up while parked in a get/wait: it gave up (timeout) or died.
          if ((fds[i].revents & (POLLRDHUP | POLLHUP)) && c->waiting)
            drop(*c, "disconnected while waiting", false);
          else if ((fds[i].revents & (POLLRDHUP | POLLHUP)) && !(fds[i].revents & POLLIN))
            c->eof = true;
        }
      }
    }
    auto now = Clock::now();
    for (auto& c : clients_) {
      if (c.dead) continue;
      if (c.waiting && now >= c.wait_deadline) {
        std::string missing;
        keys_present(c.pending, &missing);
        c.waiting = false;
        c.wait_deadline = kNever;
        reply(c, proto::Status::timeout, missing);
      }
      if (now >= c.read_deadline) {
        drop(c,
             c.greeted
                 ? "started a frame and stopped sending for " + std::to_string(options_.frame_timeout.count()) + " ms"
                 : "sent no greeting within " + std::to_string(options_.handshake_timeout.count()) + " ms",
             true);
      }
    }
    // Process until quiet: a set may release parked clients, whose buffered requests may set more keys.
    do {
      woke_waiters_ = false;
      for (auto& c : clients_) process(c);
    } while (woke_waiters_);
    reap();
  }
  for (auto& c : clients_) c.fd.reset();
  clients_.clear();
  connected_.store(0);
}

void Server::accept_all(int listen_fd) {
  while (true) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) log::warn("store server: accept failed: ", std::strerror(errno));
      return;
    }
    Fd owned(fd);
    std::string peer = peer_name(fd);
    if (clients_.size() >= options_.max_clients) {
      log::warn("store server: refused ", peer, ": already ", clients_.size(), " connections");
      dropped_.fetch_add(1);
      continue;
    }
    Client& c = clients_.emplace_back();
    c.fd = std::move(owned);
    c.peer = peer;
    c.read_deadline = Clock::now() + options_.handshake_timeout;
    connected_.fetch_add(1);
    log::debug("store server: connection from ", peer);
  }
}

void Server::read_from(Client& c) {
  if (c.dead) return;
  // Never hold more than one largest frame plus one chunk: the header check below rejects anything larger.
  while (c.buffered() <= proto::kMaxFrameBytes + 4) {
    size_t old = c.in.size();
    c.in.resize(old + kReadChunk);
    ssize_t n = ::recv(c.fd.get(), c.in.data() + old, kReadChunk, 0);
    if (n > 0) {
      c.in.resize(old + static_cast<size_t>(n));
      continue;
    }
    c.in.resize(old);
    if (n == 0) {
      c.eof = true;
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    // A reset is an end of stream like any other: process() judges what was left half-sent.
    if (errno == ECONNRESET) {
      c.eof = true;
      return;
    }
    drop(c, std::string("receive failed: ") + std::strerror(errno), false);
    return;
  }
}

void Server::process(Client& c) {
  while (!c.dead && !c.waiting) {
    const uint8_t* p = c.in.data() + c.in_pos;
    size_t avail = c.buffered();
    if (!c.greeted) {
      if (avail < proto::kHandshakeBytes) break;
      if (!proto::is_handshake(p)) {
        drop(c, "bad greeting (not a zero3 store client)", true);
        return;
      }
      c.in_pos += proto::kHandshakeBytes;
      c.greeted = true;
      auto hello = proto::handshake(options_.generation);
      c.out.insert(c.out.end(), hello.begin(), hello.end());
      flush(c);
      continue;
    }
    if (avail < 4) break;
    uint32_t len = proto::get_u32(p);
    if (len < proto::kRequestHeaderBytes || len > proto::kMaxFrameBytes) {
      drop(c,
           "frame of " + std::to_string(len) + " bytes (allowed " + std::to_string(proto::kRequestHeaderBytes) + ".." +
               std::to_string(proto::kMaxFrameBytes) + ")",
           true);
      return;
    }
    if (avail < 4 + size_t{len}) break;
    std::string error;
    auto req = proto::parse_request(p + 4, len, &error);
    c.in_pos += 4 + size_t{len};
    if (!req) {
      drop(c, "malformed request: " + error, true);
      return;
    }
    handle(c, std::move(*req));
  }
  if (c.dead) return;
  // Compact the consumed prefix.
  if (c.in_pos > 0) {
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<ptrdiff_t>(c.in_pos));
    c.in_pos = 0;
  }
  if (!c.greeted) {
    // keeps the deadline set at accept
  } else if (c.waiting || c.in.empty()) {
    c.read_deadline = kNever;  // parked by us, or between frames: silence is legitimate
  } else if (c.read_deadline == kNever) {
    c.read_deadline = Clock::now() + options_.frame_timeout;
  }
  if (c.eof && !c.waiting) {
    if (c.in.empty() && c.greeted) {
      drop(c, "", false);  // an orderly goodbye
    } else {
      drop(c, c.greeted ? "disconnected in the middle of a frame" : "disconnected before greeting", true);
    }
  }
}

bool Server::keys_present(const proto::Request& req, std::string* missing) const {
  size_t keys = req.op == proto::Op::get ? 1 : req.fields.size();
  bool all = true;
  for (size_t i = 0; i < keys; ++i) {
    if (!table_.count(req.fields[i])) {
      all = false;
      if (missing) *missing += (missing->empty() ? "" : ", ") + req.fields[i];
    }
  }
  return all;
}

void Server::finish_wait(Client& c) {
  if (c.pending.op == proto::Op::get) {
    reply(c, proto::Status::ok, table_.at(c.pending.fields[0]));
  } else {
    reply(c, proto::Status::ok, "");
  }
}

void Server::wake_waiters() {
  for (auto& c : clients_) {
    if (c.dead || !c.waiting || !keys_present(c.pending, nullptr)) continue;
    c.waiting = false;
    c.wait_deadline = kNever;
    finish_wait(c);
    woke_waiters_ = true;
  }
}

void Server::handle(Client& c, proto::Request req) {
  switch (req.op) {
    case proto::Op::set:
    case proto::Op::add: {
      const std::string& key = req.fields[0];
      auto it = table_.find(key);
      std::string value;
      int64_t sum = 0;
      if (req.op == proto::Op::add) {
        int64_t old = 0;
        if (it != table_.end()) {
          const std::string& text = it->second;
          auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), old);
          if (ec != std::errc() || ptr != text.data() + text.size()) {
            reply(c, proto::Status::error, "the value of key '" + key + "' is not a decimal integer");
            return;
          }
        }
        int64_t delta = proto::get_i64(reinterpret_cast<const uint8_t*>(req.fields[1].data()));
        if (__builtin_add_overflow(old, delta, &sum)) {
          reply(c, proto::Status::error, "add on key '" + key + "' overflows 64 bits");
          return;
        }
        value = std::to_string(sum);
      } else {
        value = std::move(req.fields[1]);
      }
      size_t old_bytes = it == table_.end() ? 0 : key.size() + it->second.size();
      size_t new_total = table_bytes_ - old_bytes + key.size() + value.size();
      if ((it == table_.end() && table_.size() >= options_.max_keys) || new_total > options_.max_total_bytes) {
        reply(c, proto::Status::error,
              "the store is full (" + std::to_string(table_.size()) + " keys, " + std::to_string(table_bytes_) +
                  " bytes)");
        return;
      }
      table_bytes_ = new_total;
      table_[key] = std::move(value);
      if (req.op == proto::Op::add) {
        std::vector<uint8_t> bytes;
        proto::put_i64(bytes, sum);
        reply(c, proto::Status::ok, std::string(bytes.begin(), bytes.end()));
      } else {
        reply(c, proto::Status::ok, "");
      }
      wake_waiters();
      return;
    }
    case proto::Op::get:
    case proto::Op::wait:
      c.pending = std::move(req);
      if (keys_present(c.pending, nullptr)) {
        finish_wait(c);
      } else {
        c.waiting = true;
        c.wait_deadline = Clock::now() + std::chrono::milliseconds(c.pending.timeout_ms);
      }
      return;
    case proto::Op::check:
      reply(c, proto::Status::ok, std::string(1, keys_present(req, nullptr) ? '\1' : '\0'));
      return;
  }
}

void Server::reply(Client& c, proto::Status status, const std::string& payload) {
  auto frame = proto::encode_reply(status, payload);
  c.out.insert(c.out.end(), frame.begin(), frame.end());
  flush(c);
  if (!c.dead && c.out.size() - c.out_pos > options_.max_unread_reply_bytes) {
    drop(c, "left " + std::to_string(c.out.size() - c.out_pos) + " bytes of replies unread", true);
  }
}

void Server::flush(Client& c) {
  while (!c.dead && c.out_pos < c.out.size()) {
    ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_pos, c.out.size() - c.out_pos, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out_pos += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;
    } else {
      drop(c, std::string("send failed: ") + std::strerror(errno), false);
      return;
    }
  }
  c.out.clear();
  c.out_pos = 0;
}

void Server::drop(Client& c, std::string reason, bool violation) {
  if (c.dead) return;
  c.dead = true;
  c.violation = violation;
  c.drop_reason = std::move(reason);
}

void Server::reap() {
  for (auto it = clients_.begin(); it != clients_.end();) {
    if (!it->dead) {
      ++it;
      continue;
    }
    if (it->violation) {
      dropped_.fetch_add(1);
      log::warn("store server: dropped ", it->peer, ": ", it->drop_reason);
    } else if (!it->drop_reason.empty()) {
      log::debug("store server: ", it->peer, " ", it->drop_reason);
    }
    it = clients_.erase(it);
    connected_.fetch_sub(1);
  }
}

}  // namespace

TcpStoreServer::TcpStoreServer(const std::string& host, int port, TcpStoreServerOptions options) : options_(options) {
  if (port < 0 || port > 65535) throw InvalidArgument("store port " + std::to_string(port) + " is not a TCP port");
  listen_fd_ = bind_listen(host, port, &port_);
  wake_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake_fd_) throw CommError(std::string("store server: eventfd failed: ") + std::strerror(errno));
  thread_ = std::thread([this] {
    try {
      Server server(options_, dropped_, connected_);
      server.run(listen_fd_.get(), wake_fd_.get(), stopping_);
    } catch (const std::exception& e) {
      // Only allocation failure can get here; the clients will see their connections close.
      log::error("store server stopped: ", e.what());
    }
  });
  log::debug("store server listening on ", host, ":", port_);
}

TcpStoreServer::~TcpStoreServer() {
  // Destroyed while an exception unwinds (the job failed: a timeout, a lost peer): a rank that hangs, the usual
  // cause of a timeout, would otherwise keep this process, and its error, for the whole linger.
  if (std::uncaught_exceptions() > 0) options_.linger = std::chrono::milliseconds(0);
  stopping_.store(true);
  uint64_t one = 1;
  [[maybe_unused]] ssize_t r = ::write(wake_fd_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
}

}  // namespace zero3::bootstrap
