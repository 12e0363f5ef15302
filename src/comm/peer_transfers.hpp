// Argument checks, descriptions and self-matching for point-to-point calls (Communicator::send_recv), shared by
// every backend so that all of them reject the same calls with the same words.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "zero3/comm.hpp"

namespace zero3::comm {

// "<backend> send_recv on rank 0 of 4: send(count=8, dtype=f32, tag=3) to rank 1; recv(...) from rank 3".
std::string describe_transfers(const char* backend, const std::vector<PeerTransfer>& transfers, int rank, int size);

// The transfers of one call to this rank itself: pairs (index of a send, index of its receive), the k-th send to
// itself with the k-th receive from itself. Throws InvalidArgument (naming `what`) for a peer outside [0, size), a
// null buffer with a non-zero count, an unmatched transfer to itself, or a self pair whose count, dtype or tag
// differ.
std::vector<std::pair<size_t, size_t>> check_transfers(const std::vector<PeerTransfer>& transfers, int rank, int size,
                                                       const std::string& what);

// Copies each self pair's send buffer into its receive buffer.
void copy_self_transfers(const std::vector<PeerTransfer>& transfers,
                         const std::vector<std::pair<size_t, size_t>>& self);

}  // namespace zero3::comm
