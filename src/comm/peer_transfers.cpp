#include "comm/peer_transfers.hpp"

#include <cstring>

#include "zero3/error.hpp"

namespace zero3 {

std::string describe_transfer(const PeerTransfer& t) {
  const bool send = t.direction == PeerTransfer::Direction::send;
  return std::string(send ? "send" : "recv") + "(count=" + std::to_string(t.count) +
         ", dtype=" + std::string(dtype_name(t.dtype)) + ", tag=" + std::to_string(t.tag) + ") " +
         (send ? "to" : "from") + " rank " + std::to_string(t.peer);
}

WorkPtr Communicator::send_recv(const std::vector<PeerTransfer>&, Stream) {
  throw Unsupported(std::string(backend()) + " does not support send_recv (point-to-point transfers)");
}

}  // namespace zero3

namespace zero3::comm {

std::string describe_transfers(const char* backend, const std::vector<PeerTransfer>& transfers, int rank, int size) {
  std::string s = std::string(backend) + " send_recv on rank " + std::to_string(rank) + " of " + std::to_string(size);
  for (size_t i = 0; i < transfers.size(); ++i) s += (i ? "; " : ": ") + describe_transfer(transfers[i]);
  return s;
}

std::vector<std::pair<size_t, size_t>> check_transfers(const std::vector<PeerTransfer>& transfers, int rank, int size,
                                                       const std::string& what) {
  std::vector<size_t> self_sends, self_recvs;
  for (size_t i = 0; i < transfers.size(); ++i) {
    const PeerTransfer& t = transfers[i];
    if (t.peer < 0 || t.peer >= size) {
      throw InvalidArgument(what + ": " + describe_transfer(t) + " names a peer outside the communicator's ranks 0.." +
                            std::to_string(size - 1));
    }
    if (!t.buf && t.count > 0) {
      throw InvalidArgument(what + ": " + describe_transfer(t) + " has a null buffer for " + std::to_string(t.count) +
                            " elements");
    }
    if (t.peer == rank) (t.direction == PeerTransfer::Direction::send ? self_sends : self_recvs).push_back(i);
  }
  if (self_sends.size() != self_recvs.size()) {
    throw InvalidArgument(what + ": " + std::to_string(self_sends.size()) + " send(s) to this rank itself but " +
                          std::to_string(self_recvs.size()) +
                          " receive(s) from itself; a transfer to itself needs its send and its receive in one call");
  }
  std::vector<std::pair<size_t, size_t>> pairs;
  for (size_t k = 0; k < self_sends.size(); ++k) {
    const PeerTransfer& s = transfers[self_sends[k]];
    const PeerTransfer& r = transfers[self_recvs[k]];
    if (s.count != r.count || s.dtype != r.dtype || s.tag != r.tag) {
      throw InvalidArgument(what + ": " + describe_transfer(s) + " does not match its receive " + describe_transfer(r));
    }
    pairs.emplace_back(self_sends[k], self_recvs[k]);
  }
  return pairs;
}

void copy_self_transfers(const std::vector<PeerTransfer>& transfers,
                         const std::vector<std::pair<size_t, size_t>>& self) {
  for (const auto& [s, r] : self) {
    const size_t bytes = transfers[s].count * dtype_size(transfers[s].dtype);
    if (bytes && transfers[r].buf != transfers[s].buf) std::memmove(transfers[r].buf, transfers[s].buf, bytes);
  }
}

}  // namespace zero3::comm
