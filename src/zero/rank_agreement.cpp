#include "zero/rank_agreement.hpp"

#include <algorithm>
#include <functional>

#include "core/check.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {
namespace {

// Runs `fn` (a collective over `comm`, every rank) on the queue and waits; a CommError names `what` and the group.
void run_over(CommQueue& queue, Communicator& comm, const std::string& what, const std::function<void()>& fn) {
  queue.wait(queue.submit(what, [&] {
    try {
      fn();
    } catch (const CommError&) {
      rethrow_comm_error(log::concat(what, " over all ", comm.size(), " ranks on rank ", comm.rank(), " failed: "));
    }
  }));
}

}  // namespace

std::vector<float> hash_to_floats(uint64_t hash) {
  constexpr uint64_t kMask = (uint64_t{1} << 22) - 1;
  return {static_cast<float>(hash & kMask), static_cast<float>((hash >> 22) & kMask),
          static_cast<float>((hash >> 44) & kMask)};
}

uint64_t fnv1a(const void* data, size_t bytes, uint64_t h) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

DeviceMirror::DeviceMirror(Device* device, float* host, size_t count)
    : device_(device != nullptr && device->type() != DeviceType::cpu ? device : nullptr),
      host_(host),
      bytes_(count * sizeof(float)),
      ptr_(host) {
  if (device_ == nullptr) return;
  ptr_ = static_cast<float*>(device_->allocate(bytes_));
  try {
    device_->copy(ptr_, host_, bytes_);
  } catch (...) {
    device_->deallocate(ptr_, bytes_);
    throw;
  }
}

DeviceMirror::~DeviceMirror() {
  if (device_ != nullptr) device_->deallocate(ptr_, bytes_);
}

void DeviceMirror::copy_back() {
  if (device_ != nullptr) device_->copy(host_, ptr_, bytes_);
}

bool ranks_agree(CommQueue& queue, Communicator& comm, const std::vector<float>& values, const std::string& what,
                 Device* device) {
  if (comm.size() == 1) return true;
  // max over ranks of v and of -v: every rank holds v exactly when max(v) == -max(-v).
  size_t n = values.size();
  std::vector<float> buf(2 * n);
  for (size_t i = 0; i < n; ++i) {
    buf[i] = values[i];
    buf[n + i] = -values[i];
  }
  DeviceMirror dbuf(device, buf.data(), buf.size());
  run_over(queue, comm, what,
           [&] { comm.all_reduce(dbuf.get(), buf.size(), DType::f32, ReduceOp::max, dbuf.stream())->wait(); });
  dbuf.copy_back();
  for (size_t i = 0; i < n; ++i) {
    if (buf[i] != -buf[n + i]) return false;
  }
  return true;
}

std::vector<std::vector<int64_t>> gather_from_ranks(CommQueue& queue, Communicator& comm,
                                                    const std::vector<int64_t>& values, const std::string& what,
                                                    Device* device) {
  const int world = comm.size();
  for (int64_t v : values) {
    if (v < 0 || v >= kMaxExactFloatInt) {
      throw Error(log::concat(what, ": value ", v, " does not fit the exchange (0 <= v < 2^24)"));
    }
  }
  std::vector<float> lengths(static_cast<size_t>(world));
  float mine = static_cast<float>(values.size());
  {
    DeviceMirror dlengths(device, lengths.data(), lengths.size());
    DeviceMirror dmine(device, &mine, 1);
    run_over(queue, comm, what + " (lengths)",
             [&] { comm.all_gather_into(dlengths.get(), dmine.get(), 1, DType::f32, dmine.stream())->wait(); });
    dlengths.copy_back();
  }
  size_t longest = 0;
  for (float l : lengths) longest = std::max(longest, static_cast<size_t>(l));
  std::vector<float> padded(std::max<size_t>(longest, 1), 0.0f);
  for (size_t i = 0; i < values.size(); ++i) padded[i] = static_cast<float>(values[i]);
  std::vector<float> all(padded.size() * static_cast<size_t>(world));
  {
    DeviceMirror dall(device, all.data(), all.size());
    DeviceMirror dpadded(device, padded.data(), padded.size());
    run_over(queue, comm, what + " (values)", [&] {
      comm.all_gather_into(dall.get(), dpadded.get(), padded.size(), DType::f32, dpadded.stream())->wait();
    });
    dall.copy_back();
  }
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    auto len = static_cast<size_t>(lengths[static_cast<size_t>(r)]);
    for (size_t i = 0; i < len; ++i)
      out[static_cast<size_t>(r)].push_back(static_cast<int64_t>(all[r * padded.size() + i]));
  }
  return out;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace zero3::detail
