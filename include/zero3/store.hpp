// A key-value store that the ranks of a job meet through (like c10d's Store): it rendezvouses Gloo and
// hands out the NCCL unique id.
//
// TcpStore: rank 0 serves it on MASTER_ADDR:port, every rank (rank 0 included) is a client. Values are
// byte strings. Every call has a timeout and throws TimeoutError (naming the key) or CommError (naming the
// peer) instead of blocking forever. The server bounds message sizes (keys 1..4096 bytes, values up to
// 1 MiB: larger ones throw InvalidArgument before sending) and drops a peer that sends garbage or nothing;
// it executes nothing a peer sends. After a failed call (lost connection, no answer) every later call on
// that store throws. A Store may be used from several threads; calls are serialised.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace zero3 {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // Waits (up to the store's timeout) until `key` exists, then returns its value.
  virtual std::vector<uint8_t> get(const std::string& key) = 0;
  // Atomically adds `delta` to the integer at `key` (0 if absent) and returns the new value. The value is
  // stored as decimal text (get() reads it); add on a key holding other bytes throws CommError.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Waits until every key exists, or throws TimeoutError naming the missing ones.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // True if every key exists. Never blocks beyond one round trip.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  virtual std::chrono::milliseconds timeout() const = 0;
};

// Opens a TCP store. is_server: this process also serves it (rank 0); port 0 then picks a free port (for a job
// of one, where nobody else needs to find it). Connecting retries refused connections until `timeout`, so
// the server may start after its clients. The server stops when the returned store is destroyed, after the
// other clients have disconnected (at most 10 s later); destroyed while an exception unwinds, at once.
std::shared_ptr<Store> make_tcp_store(const std::string& host, int port, bool is_server,
                                      std::chrono::milliseconds timeout);

// A view of `base` whose keys are prefixed with `prefix` + "/": one store, several independent users.
std::shared_ptr<Store> make_prefix_store(std::shared_ptr<Store> base, const std::string& prefix);

}  // namespace zero3
