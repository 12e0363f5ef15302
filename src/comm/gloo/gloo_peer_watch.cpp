#include "comm/gloo/gloo_peer_watch.hpp"

#include <gloo/rendezvous/context.h>
#include <gloo/types.h>

#include "zero3/error.hpp"

namespace zero3::comm {
namespace {

// A wait that must never time out (gloo closes every connection of the context when a wait times out).
constexpr std::chrono::milliseconds kForever = std::chrono::hours(24 * 365 * 100);

// "rank 1", "rank 1 and rank 3", "rank 0, rank 1 and rank 3".
std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) {
    s += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::string("rank ") + std::to_string(ranks[i]);
  }
  return s;
}

}  // namespace

void PeerWatch::wait(::gloo::transport::UnboundBuffer& buffer, bool recv, std::chrono::milliseconds timeout) {
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    if (!peer_failure_.empty()) throw CommError(peer_failure_);
    waiting_.push_back(&buffer);
  }
  bool done = false;
  try {
    done = recv ? buffer.waitRecv(timeout) : buffer.waitSend(timeout);
  } catch (...) {
    std::lock_guard<std::mutex> lock(watch_mu_);
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &buffer));
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &buffer));
  }
  if (done) return;
  // Aborted by the watch. The operation may have completed just before its peer closed the connection (the
  // peer's last message, then its exit): an abort wins over a completion in gloo, so look once more. A wait that
  // is not complete now fails (its timeout closes every connection, which are broken by now anyway).
  try {
    if (recv ? buffer.waitRecv(std::chrono::milliseconds(1)) : buffer.waitSend(std::chrono::milliseconds(1))) return;
  } catch (const std::exception&) {
  }
  std::lock_guard<std::mutex> lock(watch_mu_);
  throw CommError(peer_failure_);
}

// Posts, to every peer, two receives on slots no collective uses: one into a buffer of that peer's own, which
// no message completes (which peer broke), and one into a buffer shared by all, which only a peer's goodbye
// completes (stop(): it destroyed its communicator). Gloo fails them when their connection breaks; the
// watch thread waits on the shared buffer, so that a connection that breaks without a goodbye wakes it.
void PeerWatch::start(::gloo::rendezvous::Context& context, const std::string& who) {
  context_ = &context;
  const auto n = static_cast<size_t>(size_);
  watch_bytes_.assign(3 * n, 0);
  peer_watch_.resize(n);
  left_.assign(n, false);
  any_watch_ = context_->createUnboundBuffer(watch_bytes_.data(), n);
  goodbye_ = context_->createUnboundBuffer(&watch_bytes_[2 * n], 1);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    auto& mine = peer_watch_[static_cast<size_t>(p)];
    mine = context_->createUnboundBuffer(&watch_bytes_[n + static_cast<size_t>(p)], 1);
    try {
      mine->recv(p, ::gloo::Slot::build(kWatchSlotPrefix, 1), 0, 1);
      any_watch_->recv(p, ::gloo::Slot::build(kWatchSlotPrefix, 0), static_cast<size_t>(p), 1);
    } catch (const std::exception& e) {
      throw CommError(who + " failed: the connection to rank " + std::to_string(p) + " closed (" + e.what() +
                      ") before it confirmed the connect: it exited, crashed or timed out");
    }
  }
  watch_ = std::thread([this] { watch_loop(); });
}

// Every rank tells every peer that its watch is posted, and waits until every peer has said the same: no rank
// leaves connect (and may destroy the communicator or exit) before every peer watches it, so that a peer which
// leaves early is a goodbye or a broken watch on every other rank, never a receive that cannot be posted. The
// waits go through wait(), so a peer that dies meanwhile is named by the watch.
void PeerWatch::confirm_connected(const std::string& who) {
  const auto n = static_cast<size_t>(size_);
  const Deadline left{std::chrono::steady_clock::now() + timeout_};
  const auto slot = ::gloo::Slot::build(kWatchSlotPrefix, 2);
  std::vector<char> bytes(n + 1, 0);
  std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> from(n);
  std::unique_ptr<::gloo::transport::UnboundBuffer> to = context_->createUnboundBuffer(&bytes[n], 1);
  int peer = -1;  // the peer of the step that failed
  try {
    for (peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      from[static_cast<size_t>(peer)] = context_->createUnboundBuffer(&bytes[static_cast<size_t>(peer)], 1);
      from[static_cast<size_t>(peer)]->recv(peer, slot, 0, 1);
    }
    for (peer = 0; peer < size_; ++peer) {
      if (peer != rank_) to->send(peer, slot, 0, 1);
    }
    for (peer = 0; peer < size_; ++peer) {
      if (peer != rank_) wait(*from[static_cast<size_t>(peer)], true, left());
    }
    peer = -1;
    for (int p = 1; p < size_; ++p) wait(*to, false, left());
  } catch (const CommError& e) {  // the watch's verdict, naming the rank(s)
    throw CommError(who + " failed: " + e.what());
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    const std::string whom = peer >= 0 ? "rank " + std::to_string(peer) : "a peer";
    if (msg.find("Timed out") != std::string::npos) {
      throw TimeoutError(who + " timed out after " + std::to_string(timeout_.count()) + " ms waiting for " + whom +
                         " to confirm the connect (" + msg + ")");
    }
    throw CommError(who + " failed: " +
                    peer_failure_seen(msg, "the connection to " + whom + " closed (" + msg +
                                      ") before it confirmed the connect: it exited, crashed or timed out"));
  }
}

// Ends the watch, first saying goodbye to every peer when `goodbye` (the communicator is destroyed after a connect
// that succeeded; not waited for: a dead peer never takes it). Never throws.
void PeerWatch::stop(bool goodbye) {
  if (watch_.joinable()) {
    for (int p = 0; goodbye && p < size_; ++p) {
      if (p == rank_) continue;
      try {
        goodbye_->send(p, ::gloo::Slot::build(kWatchSlotPrefix, 0), 0, 1);
      } catch (const std::exception&) {
        // that connection is closed already
      }
    }
    watch_stop_ = true;
    any_watch_->abortWaitRecv();
    watch_.join();
  }
}

void PeerWatch::release() {
  any_watch_.reset();
  peer_watch_.clear();
  goodbye_.reset();
}

void PeerWatch::watch_loop() {
  std::string message;
  while (true) {
    try {
      int from = -1;
      if (!any_watch_->waitRecv(&from, kForever) || watch_stop_) return;
      if (from >= 0 && from < size_) {  // a goodbye
        std::lock_guard<std::mutex> lock(watch_mu_);
        left_[static_cast<size_t>(from)] = true;
      }
      continue;
    } catch (const std::exception& e) {
      message = e.what();
      break;
    }
  }
  // Gloo fails the broken connection's receives one after another (in no fixed order): give it a moment to
  // reach the peer's own buffer.
  std::vector<int> broken;
  for (int tries = 0; broken.empty() && tries < 200; ++tries) {
    if (tries > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (int p = 0; p < size_; ++p) {
      if (p != rank_ && !left_[static_cast<size_t>(p)] && peer_failed(p)) broken.push_back(p);
    }
  }
  std::string failure;
  if (message.find("Application timeout") != std::string::npos) {
    failure = "a wait on this rank timed out, which closed every connection of this communicator";
  } else if (broken.empty()) {
    failure = "a connection of this communicator failed (" + message + ")";
  } else {
    failure = "the connection" + std::string(broken.size() > 1 ? "s" : "") + " to " + rank_list(broken) +
              " closed (" + message + "): " + (broken.size() > 1 ? "they" : "it") + " exited, crashed or timed out";
  }
  std::lock_guard<std::mutex> lock(watch_mu_);
  peer_failure_ = failure;
  for (::gloo::transport::UnboundBuffer* waiting : waiting_) {
    waiting->abortWaitRecv();
    waiting->abortWaitSend();
  }
  watch_cv_.notify_all();
}

// Whether gloo failed peer p's watch receive. The wait is aborted before it starts, so it returns at once
// (throwing when the receive failed) and never times out.
bool PeerWatch::peer_failed(int p) {
  auto& buffer = *peer_watch_[static_cast<size_t>(p)];
  buffer.abortWaitRecv();
  try {
    buffer.waitRecv(kForever);
    return false;
  } catch (const std::exception&) {
    return true;
  }
}

// The watch's verdict on a failure the worker saw first (gloo failed an operation of a closed connection with
// `gloo_message`): waits briefly for the watch thread, which is woken by the same failure. Without one, a peer
// that said goodbye before its connection closed destroyed its communicator (which the watch does not report):
// named as such. Otherwise `otherwise`.
std::string PeerWatch::peer_failure_seen(const std::string& gloo_message, const std::string& otherwise) {
  std::unique_lock<std::mutex> lock(watch_mu_);
  watch_cv_.wait_for(lock, std::chrono::milliseconds(500), [&] { return !peer_failure_.empty(); });
  if (!peer_failure_.empty()) return peer_failure_;
  std::vector<int> departed;
  for (size_t p = 0; p < left_.size(); ++p) {
    if (left_[p]) departed.push_back(static_cast<int>(p));
  }
  if (departed.empty()) return otherwise;
  return rank_list(departed) + (departed.size() > 1 ? " have" : " has") +
         " destroyed this communicator, so no call on it can complete (" + gloo_message + ")";
}

}  // namespace zero3::comm
