// zero3's TCP store: a server thread in rank 0 and one client connection per process (see store.hpp for the
// contract and store_protocol.hpp for the wire format).
//
// The server trusts nothing a peer sends: frames are bounded (store_protocol.hpp), a peer must greet within
// `handshake_timeout` and finish a started frame within `frame_timeout`, replies a peer does not read are
// bounded, and the table's size is bounded. Offending peers are dropped with a log line; the server and the
// process go on. It stores bytes and answers; it never interprets a value beyond add's decimal integer.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/bootstrap/socket.hpp"
#include "zero3/store.hpp"

namespace zero3::bootstrap {

struct TcpStoreServerOptions {
  std::chrono::milliseconds handshake_timeout = std::chrono::seconds(30);
  std::chrono::milliseconds frame_timeout = std::chrono::seconds(30);
  // On destruction, keep serving until every greeted client has disconnected, at most this long: ranks that
  // are still reading the store when rank 0 finishes are not cut off. Not while an exception unwinds (the job
  // failed): then the server stops at once.
  std::chrono::milliseconds linger = std::chrono::seconds(10);
  size_t max_clients = 4096;
  // Sent in the handshake: a client of another non-zero generation retries until a server of its own answers
  // (TcpStore).
  uint32_t generation = 0;
  size_t max_keys = size_t{1} << 20;
  size_t max_total_bytes = size_t{1} << 30;
  size_t max_unread_reply_bytes = size_t{64} << 20;
};

class TcpStoreServer {
 public:
  // Listens on `host`:`port` (port 0: any free port, see port()). A host that is not an address of this
  // machine falls back to all interfaces, with a log line. Throws CommError when the port cannot be bound.
  TcpStoreServer(const std::string& host, int port, TcpStoreServerOptions options = {});
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }
  // Peers dropped for breaking the protocol or the bounds so far (for tests).
  size_t dropped_peers() const { return dropped_.load(); }
  size_t connected_clients() const { return connected_.load(); }

 private:
  void serve();

  TcpStoreServerOptions options_;
  Fd listen_fd_;
  Fd wake_fd_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<size_t> dropped_{0};
  std::atomic<size_t> connected_{0};
  std::thread thread_;
};

class TcpStoreClient final : public Store {
 public:
  // Connects to host:port, retrying refused or unresolved connections until `timeout`. Rank 0 may start late,
  // or may have died before it served: the wait cannot tell the two apart, so it is not silent. After
  // `first_note` without a connection it logs a warning naming the address, the last error and the time left,
  // then again every 3 x `first_note`.
  // A server answering with another non-zero `generation` than this client's is not the one it looks for: the
  // client retries as if nobody listened (TcpStore).
  TcpStoreClient(const std::string& host, int port, std::chrono::milliseconds timeout,
                 std::chrono::milliseconds first_note = std::chrono::seconds(10), uint32_t generation = 0);

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  std::chrono::milliseconds timeout() const override { return timeout_; }

  const std::string& address() const { return address_; }

 private:
  struct Reply;
  Reply request(int op, std::chrono::milliseconds server_wait, std::vector<std::string> fields);

  std::string address_;  // host:port, for messages
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  Fd fd_;
  std::string broken_;  // non-empty once the connection failed: every later call reports it
};

// What make_tcp_store returns: the client, plus the server when this process serves.
class TcpStore final : public Store {
 public:
  // `generation` (0: any) tells apart the stores one address serves in turn: a program that connects, tears
  // down and connects again (the same number of times on every rank) numbers its connects 1, 2, ...; a rank that
  // is already at connect k+1 while rank 0 still serves connect k's store must not join that old store (it
  // would wait there for keys rank 0 writes into the new one), so it retries until rank 0's store k+1 answers.
  TcpStore(const std::string& host, int port, bool is_server, std::chrono::milliseconds timeout,
           TcpStoreServerOptions server_options = {}, uint32_t generation = 0);
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override { client_->set(key, value); }
  std::vector<uint8_t> get(const std::string& key) override { return client_->get(key); }
  int64_t add(const std::string& key, int64_t delta) override { return client_->add(key, delta); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    client_->wait(keys, timeout);
  }
  bool check(const std::vector<std::string>& keys) override { return client_->check(keys); }
  std::chrono::milliseconds timeout() const override { return client_->timeout(); }

  // The port actually served or connected to (differs from the requested one when that was 0).
  int port() const { return port_; }

 private:
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<TcpStoreClient> client_;
  int port_;
};

}  // namespace zero3::bootstrap
