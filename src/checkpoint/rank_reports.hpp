// How the ranks of a save or load agree: after each phase every rank reports whether it succeeded (with a few
// numbers and a message), every rank sees every report, and either all go on or all throw. No rank is left
// waiting in a collective that a failed rank will never join.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zero3 {
class Communicator;
class Device;
class Engine;
}  // namespace zero3

namespace zero3::ckpt {

struct RankReport {
  bool ok = true;
  uint64_t a = 0, b = 0, c = 0, d = 0;  // phase-specific numbers (file size, CRC, a hash, a nonce)
  std::string message;                  // the error, or phase-specific text; cut to kMessageBytes
};

inline constexpr size_t kMessageBytes = 984;

// Collective (one all-gather over `comm`, through a buffer on `device`, whose memory the communicator moves):
// every rank's report, indexed by rank. When the all-gather fails (a rank died), the CommError (or TimeoutError)
// is rethrown with `what` (the save or load and its phase) in front.
std::vector<RankReport> exchange_reports(Communicator& comm, Device& device, const RankReport& mine,
                                         const std::string& what);
// The same over the engine's communicator and device.
std::vector<RankReport> exchange_reports(Engine& engine, const RankReport& mine, const std::string& what);

// Collective over `comm`: every rank's text (any length; a pipelined save's description of each rank's part),
// indexed by rank. Two all-gathers: the lengths, then the texts padded to the longest.
std::vector<std::string> exchange_texts(Communicator& comm, Device& device, const std::string& mine,
                                        const std::string& what);

// Throws CheckpointError "<what> failed on rank R: <message>" (every failed rank listed) when any report is
// not ok; the same on every rank.
void throw_if_any_failed(const std::vector<RankReport>& reports, const std::string& what);

}  // namespace zero3::ckpt
