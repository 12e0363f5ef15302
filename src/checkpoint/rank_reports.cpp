#include "checkpoint/rank_reports.hpp"

#include <algorithm>
#include <cstring>

#include "zero3/comm.hpp"
#include "zero3/device.hpp"
#include "zero3/engine.hpp"
#include "zero3/error.hpp"

namespace zero3::ckpt {
namespace {

constexpr size_t kRecordBytes = 1024;  // ok, length (4 + 4 bytes), a, b, c, d (4 x 8 bytes), then the message
static_assert(kRecordBytes == 40 + kMessageBytes);

struct DeviceScratch {
  DeviceScratch(Device& d, size_t bytes) : device(d), size(bytes), ptr(d.allocate(bytes)) {}
  ~DeviceScratch() { device.deallocate(ptr, size); }
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  Device& device;
  size_t size;
  void* ptr;
};

// All-gathers `bytes` (a multiple of 4) from every rank of `comm` through a buffer on `device`; the bytes are
// carried as f32 words, which all_gather copies bit for bit.
std::vector<unsigned char> all_gather_bytes(Communicator& comm, Device& device, const unsigned char* mine, size_t bytes,
                                            const std::string& what) {
  std::vector<unsigned char> all(bytes * static_cast<size_t>(comm.size()));
  DeviceScratch scratch(device, std::max<size_t>(all.size(), 4));
  void* in = static_cast<unsigned char*>(scratch.ptr) + bytes * static_cast<size_t>(comm.rank());
  device.copy(in, mine, bytes);
  const std::string context =
      what + ": rank " + std::to_string(comm.rank()) + " could not hear from every rank (did one die?): ";
  try {
    comm.all_gather_into(scratch.ptr, in, bytes / 4, DType::f32, device.default_stream())->wait();
  } catch (const TimeoutError& e) {
    throw TimeoutError(context + e.what());
  } catch (const CommError& e) {
    throw CommError(context + e.what());
  }
  device.copy(all.data(), scratch.ptr, all.size());
  return all;
}

}  // namespace

std::vector<RankReport> exchange_reports(Engine& engine, const RankReport& mine, const std::string& what) {
  // communicator() returns once the collectives the engine queued there have run.
  return exchange_reports(engine.communicator(), engine.device(), mine, what);
}

std::vector<RankReport> exchange_reports(Communicator& comm, Device& device, const RankReport& mine,
                                         const std::string& what) {
  const int world = comm.size();
  std::vector<unsigned char> record(kRecordBytes, 0);
  const uint32_t ok = mine.ok ? 1 : 0;
  const uint32_t len = static_cast<uint32_t>(std::min(mine.message.size(), kMessageBytes));
  std::memcpy(record.data(), &ok, 4);
  std::memcpy(record.data() + 4, &len, 4);
  std::memcpy(record.data() + 8, &mine.a, 8);
  std::memcpy(record.data() + 16, &mine.b, 8);
  std::memcpy(record.data() + 24, &mine.c, 8);
  std::memcpy(record.data() + 32, &mine.d, 8);
  std::memcpy(record.data() + 40, mine.message.data(), len);

  const std::vector<unsigned char> all = all_gather_bytes(comm, device, record.data(), kRecordBytes, what);

  std::vector<RankReport> out(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    const unsigned char* p = all.data() + kRecordBytes * static_cast<size_t>(r);
    uint32_t rok = 0, rlen = 0;
    std::memcpy(&rok, p, 4);
    std::memcpy(&rlen, p + 4, 4);
    RankReport& rep = out[static_cast<size_t>(r)];
    rep.ok = rok != 0;
    std::memcpy(&rep.a, p + 8, 8);
    std::memcpy(&rep.b, p + 16, 8);
    std::memcpy(&rep.c, p + 24, 8);
    std::memcpy(&rep.d, p + 32, 8);
    rep.message.assign(reinterpret_cast<const char*>(p + 40), std::min<size_t>(rlen, kMessageBytes));
  }
  return out;
}

std::vector<std::string> exchange_texts(Communicator& comm, Device& device, const std::string& mine,
                                        const std::string& what) {
  RankReport length;
  length.a = mine.size();
  const std::vector<RankReport> lengths = exchange_reports(comm, device, length, what);
  size_t longest = 0;
  for (const RankReport& r : lengths) longest = std::max<size_t>(longest, r.a);
  const size_t padded = std::max<size_t>((longest + 3) / 4 * 4, 4);
  std::vector<unsigned char> record(padded, 0);
  std::memcpy(record.data(), mine.data(), mine.size());
  const std::vector<unsigned char> all = all_gather_bytes(comm, device, record.data(), padded, what);
  std::vector<std::string> out;
  for (size_t r = 0; r < lengths.size(); ++r) {
    out.emplace_back(reinterpret_cast<const char*>(all.data()) + padded * r, static_cast<size_t>(lengths[r].a));
  }
  return out;
}

void throw_if_any_failed(const std::vector<RankReport>& reports, const std::string& what) {
  std::string text;
  int failed = 0;
  for (size_t r = 0; r < reports.size(); ++r) {
    if (reports[r].ok) continue;
    ++failed;
    text += (failed == 1 ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " + reports[r].message;
  }
  if (failed > 0)
    throw CheckpointError(what + " failed on " + std::to_string(failed) + " of " + std::to_string(reports.size()) +
                          " ranks: " + text);
}

}  // namespace zero3::ckpt
