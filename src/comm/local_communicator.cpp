// The world of one process. Every collective reduces to a copy (or nothing), done synchronously on the
// calling thread, so every Work it returns is already complete. Host memory only: device buffers go to
// nccl, which "auto" picks whenever a GPU is usable.
#include <cstring>
#include <memory>

#include "comm/collective_args.hpp"
#include "comm/peer_transfers.hpp"
#include "comm/registry.hpp"
#include "zero3/error.hpp"

namespace zero3::comm {
namespace {

class LocalCommunicator final : public Communicator {
 public:
  explicit LocalCommunicator(std::chrono::milliseconds timeout) : timeout_(timeout) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "local"; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  bool checks_collectives() const override { return true; }  // nobody to disagree with

  WorkPtr all_gather_into(void* out, const void* in, size_t count, DType dtype, Stream) override {
    std::string what = "local " + describe_collective("all_gather_into", count, dtype, 0, 1);
    require_buffer(out, "out", count, what);
    require_buffer(in, "in", count, what);
    copy(out, in, count * dtype_size(dtype), what);
    return completed_work();
  }

  WorkPtr reduce_scatter(void* out, const void* in, size_t count, DType dtype, ReduceOp op, Stream) override {
    std::string what = "local " + describe_collective("reduce_scatter", count, dtype, 0, 1, reduce_op_name(op));
    require_buffer(out, "out", count, what);
    require_buffer(in, "in", count, what);
    require_sum_or_avg(op, what);
    // sum and avg over one rank are the identity.
    copy(out, in, count * dtype_size(dtype), what);
    return completed_work();
  }

  WorkPtr all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, Stream) override {
    require_buffer(buf, "buf", count,
                   "local " + describe_collective("all_reduce", count, dtype, 0, 1, reduce_op_name(op)));
    return completed_work();
  }

  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root, Stream) override {
    std::string what = "local " + describe_collective("broadcast", count, dtype, 0, 1, nullptr, root);
    require_buffer(buf, "buf", count, what);
    require_root(root, 1, what);
    return completed_work();
  }

  WorkPtr all_to_all(void* out, const void* in, size_t count, DType dtype, Stream) override {
    std::string what = "local " + describe_collective("all_to_all", count, dtype, 0, 1);
    require_buffer(out, "out", count, what);
    require_buffer(in, "in", count, what);
    require_no_partial_overlap(out, count * dtype_size(dtype), in, count * dtype_size(dtype), nullptr, what);
    copy(out, in, count * dtype_size(dtype), what);
    return completed_work();
  }

  void barrier() override {}

  // Every peer is this rank: each send is copied into its receive in the same call.
  WorkPtr send_recv(const std::vector<PeerTransfer>& transfers, Stream) override {
    const std::string what = describe_transfers("local", transfers, 0, 1);
    copy_self_transfers(transfers, check_transfers(transfers, 0, 1, what));
    return completed_work();
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    if (color < 0) return nullptr;
    return std::make_unique<LocalCommunicator>(timeout_);
  }

 private:
  static void copy(void* out, const void* in, size_t bytes, const std::string& what) {
    if (out == in || bytes == 0) return;
    require_no_partial_overlap(out, bytes, in, bytes, out, what);
    std::memcpy(out, in, bytes);
  }

  std::chrono::milliseconds timeout_;
};

std::unique_ptr<Communicator> make_local(const CommOptions& options, const LaunchInfo& launch, std::shared_ptr<Store>) {
  if (launch.world_size != 1) {
    throw CommError("backend \"local\" serves a world of one process, but the launcher reports world size " +
                    std::to_string(launch.world_size) + " (" + launch.launcher +
                    "); use backend gloo or nccl for several ranks");
  }
  return std::make_unique<LocalCommunicator>(options.timeout);
}

const BackendRegistrar kLocalBackend("local", &make_local);

}  // namespace
}  // namespace zero3::comm
