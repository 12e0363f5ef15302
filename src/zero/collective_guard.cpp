#include "zero/collective_guard.hpp"

#include <vector>

#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {
namespace {

constexpr size_t kFloats = 4;                   // one call's description
constexpr uint64_t kPiece = uint64_t{1} << 24;  // floats hold integers below 2^24 exactly

void encode(const comm::CollectiveCall& call, float* out) {
  out[0] = static_cast<float>(static_cast<int>(call.kind) * 256 + static_cast<int>(call.dtype) * 16 + call.op + 1);
  out[1] = static_cast<float>(call.root + 1);
  out[2] = static_cast<float>(call.count % kPiece);
  out[3] = static_cast<float>(call.count / kPiece);
}

comm::CollectiveCall decode(const float* in) {
  const auto head = static_cast<int>(in[0]);
  comm::CollectiveCall call;
  call.kind = static_cast<comm::CollectiveKind>(head / 256);
  call.dtype = static_cast<DType>((head / 16) % 16);
  call.op = head % 16 - 1;
  call.root = static_cast<int>(in[1]) - 1;
  call.count = static_cast<uint64_t>(in[2]) + static_cast<uint64_t>(in[3]) * kPiece;
  return call;
}

}  // namespace

CollectiveGuard::CollectiveGuard(std::shared_ptr<Communicator> inner, Device& device)
    : inner_(std::move(inner)), device_(device), stream_(device_.make_stream()), allocated_(device_.make_event()) {}

void CollectiveGuard::agree(const comm::CollectiveCall& call) {
  const int world = inner_->size();
  if (world == 1 || !checking_) return;
  if (call.count >= kPiece * kPiece) {
    throw InvalidArgument(log::concat(inner_->backend(), " ", comm::describe_call(call),
                                      ": a count of 2^48 elements or more is not supported"));
  }
  ++calls_;
  // Every rank's description, then this rank's, in host memory the device copies to and from, and on the device.
  const size_t floats = (static_cast<size_t>(world) + 1) * kFloats;
  const size_t bytes = floats * sizeof(float);
  auto* host = static_cast<float*>(device_.allocate_host(bytes));
  float* dev = nullptr;
  try {
    dev = static_cast<float*>(device_.allocate(bytes));
  } catch (...) {
    device_.deallocate_host(host, bytes);
    throw;
  }
  std::vector<comm::CollectiveCall> by_rank;
  try {
    float* mine = host + static_cast<size_t>(world) * kFloats;
    float* dev_mine = dev + static_cast<size_t>(world) * kFloats;
    encode(call, mine);
    const Stream s = stream_->get();
    // allocate() ordered the memory on the compute stream: the guard's stream goes after it.
    allocated_->record(device_.default_stream());
    allocated_->wait_on(s);
    device_.copy(dev_mine, mine, kFloats * sizeof(float), s);
    WorkPtr work = inner_->all_gather_into(dev, dev_mine, kFloats, DType::f32, s);
    device_.copy(host, dev, static_cast<size_t>(world) * kFloats * sizeof(float), s);
    work->wait();
    stream_->synchronize();
    for (int r = 0; r < world; ++r) by_rank.push_back(decode(host + static_cast<size_t>(r) * kFloats));
  } catch (...) {
    // The stream may still hold the copies (a failed collective): free once it has passed them.
    device_.deallocate_after(dev, bytes, stream_->get());
    device_.deallocate_host_after(host, bytes, stream_->get());
    throw;
  }
  device_.deallocate(dev, bytes);
  device_.deallocate_host(host, bytes);
  for (const comm::CollectiveCall& other : by_rank) {
    if (other == call) continue;
    throw CollectiveMismatchError(comm::mismatch_message(
        log::concat(inner_->backend(), " ", comm::describe_call(call), " on rank ", inner_->rank(), " of ", world,
                    " (compared by the engine before calling ", inner_->backend(), ")"),
        calls_, by_rank));
  }
}

WorkPtr CollectiveGuard::all_gather_into(void* out, const void* in, size_t count, DType dtype, Stream stream) {
  if (count > 0) agree({comm::CollectiveKind::all_gather_into, count, dtype});
  return inner_->all_gather_into(out, in, count, dtype, stream);
}

WorkPtr CollectiveGuard::reduce_scatter(void* out, const void* in, size_t count, DType dtype, ReduceOp op,
                                        Stream stream) {
  if (count > 0) agree({comm::CollectiveKind::reduce_scatter, count, dtype, static_cast<int>(op)});
  return inner_->reduce_scatter(out, in, count, dtype, op, stream);
}

WorkPtr CollectiveGuard::all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, Stream stream) {
  if (count > 0) agree({comm::CollectiveKind::all_reduce, count, dtype, static_cast<int>(op)});
  return inner_->all_reduce(buf, count, dtype, op, stream);
}

WorkPtr CollectiveGuard::broadcast(void* buf, size_t count, DType dtype, int root, Stream stream) {
  if (count > 0) agree({comm::CollectiveKind::broadcast, count, dtype, -1, root});
  return inner_->broadcast(buf, count, dtype, root, stream);
}

WorkPtr CollectiveGuard::all_to_all(void* out, const void* in, size_t count, DType dtype, Stream stream) {
  if (count > 0) agree({comm::CollectiveKind::all_to_all, count, dtype});
  return inner_->all_to_all(out, in, count, dtype, stream);
}

void CollectiveGuard::barrier() {
  agree({comm::CollectiveKind::barrier});
  inner_->barrier();
}

}  // namespace zero3::detail
