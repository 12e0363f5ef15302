// The Gloo communicator's watch over its peers (gloo_communicator.cpp says why it is needed): a receive that never
// completes, posted to every peer, which gloo fails when that peer's connection breaks; a thread that then names
// the dead rank(s) and aborts the wait the worker is in; and a goodbye from a communicator that is destroyed, so
// that its peers see a departure, not a crash. Every wait of a collective goes through wait().
#pragma once

#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace gloo::rendezvous {
class Context;
}

namespace zero3::comm {

// The watch's slot prefix (the communicator's collectives use 0x40, 0x41, 0x43..0x45, its point-to-point
// transfers 0x46..0x48; gloo's own 0x01..0x08).
constexpr uint8_t kWatchSlotPrefix = 0x42;

// What is left of one timeout shared by several waits, at least 1 ms.
struct Deadline {
  std::chrono::steady_clock::time_point at;
  std::chrono::milliseconds operator()() const {
    auto rest = std::chrono::duration_cast<std::chrono::milliseconds>(at - std::chrono::steady_clock::now());
    return std::max(rest, std::chrono::milliseconds(1));
  }
};

class PeerWatch {
 public:
  PeerWatch(int rank, int size, std::chrono::milliseconds timeout) : rank_(rank), size_(size), timeout_(timeout) {}

  // Starts the watch over every peer of `context` (which must outlive it, until release()), then confirms the
  // connect with every peer. `who` names the connect in errors (CommError, TimeoutError).
  void start(::gloo::rendezvous::Context& context, const std::string& who);
  void confirm_connected(const std::string& who);

  // Waits for one receive (send) of `buffer` to complete within `timeout`; a CommError naming the peer(s) when the
  // watch found a broken connection, before or during the wait. Several threads may wait at once, each on a buffer
  // of its own.
  void wait(::gloo::transport::UnboundBuffer& buffer, bool recv, std::chrono::milliseconds timeout);

  // The watch's verdict on a failure the worker saw first (gloo failed an operation of a closed connection with
  // `gloo_message`), else `otherwise`.
  std::string peer_failure_seen(const std::string& gloo_message, const std::string& otherwise);

  // stop() ends the watch thread (saying goodbye to every peer when `goodbye`); release() then drops the watch's
  // receives, after the communicator closed its connections. Neither throws (release() may, from gloo's teardown,
  // as the connections' own teardown does).
  void stop(bool goodbye);
  void release();

 private:
  void watch_loop();
  bool peer_failed(int p);

  ::gloo::rendezvous::Context* context_ = nullptr;  // not owned
  int rank_, size_;
  std::chrono::milliseconds timeout_;

  // The watch (start): its receives and what it found.
  std::vector<uint8_t> watch_bytes_;
  std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> peer_watch_;  // by rank; none for this rank
  std::unique_ptr<::gloo::transport::UnboundBuffer> any_watch_, goodbye_;
  std::vector<bool> left_;  // by rank: said goodbye (written by the watch thread under watch_mu_)
  std::thread watch_;
  std::atomic<bool> watch_stop_{false};
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  std::string peer_failure_;  // set once, by the watch thread
  // The buffers waited on (the worker's; several at once while the transfers of a send_recv call run side by side).
  std::vector<::gloo::transport::UnboundBuffer*> waiting_;
};

}  // namespace zero3::comm
