// The NCCL communicator: collectives on GPU memory, ordered on CUDA streams.
//
// Start-up (collective over the job's ranks):
//   1. the CUDA device is CommOptions::device, or the launcher's local rank;
//   2. the ranks agree on NCCL's network through the store (src/comm/fabric: EFA probe, aws-ofi-nccl
//      plugin check, zero3.network = auto | efa | socket) and rank 0 logs the chosen transport; a required
//      EFA that cannot be used is a CommError before NCCL starts;
//   3. rank 0 creates the NCCL unique id and hands it out through the store;
//   4. ncclCommInitRankConfig with blocking = 0 (and netName when the network is pinned), polled with
//      ncclCommGetAsyncError until ready; not ready within the timeout: TimeoutError naming the rank.
//
// Collectives are enqueued on `stream` (nullptr: CUDA's legacy default stream) and return at once; the
// Work completes when the stream passes the collective. A watchdog thread (nccl_watchdog.hpp) turns a
// collective that does not finish within the timeout, or an asynchronous NCCL error, into an aborted
// communicator and a Work error naming the collective. After an abort every call throws CommError.
// The timeout counts from the call that enqueued the collective, so work queued before it on the same
// stream counts too.
//
// Numerics: NCCL reduces bf16 and f16 pairwise in float and rounds each partial result to the dtype, so
// with more than two ranks a bf16 sum may differ from an f32-accumulated one by the intermediate roundings;
// reduce gradients in f32 where that matters.
//
// User-buffer registration: with CommOptions::register_buffers, register_buffer() hands a buffer to
// ncclCommRegister so collectives on it can skip NCCL's internal staging copies (NVLS, CollNet, and network
// plugins that register memory). Register long-lived buffers (a unit's flat parameter and gradient buffers)
// once, deregister them before freeing them; the communicator deregisters what is left when destroyed.
// Without the option, register_buffer() returns nullptr and does nothing.
//
// Thread-safety: one thread issues operations at a time (comm.hpp); Works may be waited on from any thread.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "comm/fabric/efa_decision.hpp"
#include "comm/nccl/nccl_version.hpp"
#include "comm/nccl/nccl_watchdog.hpp"
#include "zero3/comm.hpp"
#include "zero3/store.hpp"

namespace zero3::comm {

class NcclCommunicator final : public Communicator {
 public:
  // Joins the job (collective over launch.world_size ranks). `store` may be null for a world of one.
  NcclCommunicator(const CommOptions& options, const LaunchInfo& launch, std::shared_ptr<Store> store);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return state_->rank; }
  int size() const override { return state_->size; }
  const char* backend() const override { return "nccl"; }
  std::chrono::milliseconds timeout() const override { return state_->timeout; }
  int cuda_device() const override { return state_->device; }

  WorkPtr all_gather_into(void* out, const void* in, size_t count, DType dtype, Stream stream = nullptr) override;
  WorkPtr reduce_scatter(void* out, const void* in, size_t count, DType dtype, ReduceOp op,
                         Stream stream = nullptr) override;
  WorkPtr all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, Stream stream = nullptr) override;
  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root, Stream stream = nullptr) override;
  // ncclSend/ncclRecv to and from every rank inside one ncclGroupStart/ncclGroupEnd.
  WorkPtr all_to_all(void* out, const void* in, size_t count, DType dtype, Stream stream = nullptr) override;
  // An all_reduce of one float on an internal stream, waited for on the host.
  void barrier() override;
  // ncclSend/ncclRecv of every transfer inside one ncclGroupStart/ncclGroupEnd on `stream`; no host wait. NCCL
  // matches transfers by order only (tags are not sent), so mismatched calls are not caught here (comm.hpp).
  WorkPtr send_recv(const std::vector<PeerTransfer>& transfers, Stream stream = nullptr) override;
  // ncclCommSplit; the child inherits the device, the timeout, the network and the registration option.
  std::unique_ptr<Communicator> split(int color, int key) override;

  // ncclCommRegister of [ptr, ptr + bytes) (device memory). Returns the handle for deregister_buffer, or
  // nullptr when registration is off. Local to this rank (not collective).
  void* register_buffer(void* ptr, size_t bytes);
  void deregister_buffer(void* handle);
  bool registers_buffers() const { return register_buffers_; }

  const fabric::NetworkDecision& network() const { return network_; }
  bool aborted();

 private:
  struct Adopt {};
  // A communicator around an initialised child of split().
  NcclCommunicator(Adopt, ncclComm_t comm, const NcclCommunicator& parent);

  void start();  // scratch buffer, internal stream, watchdog
  template <typename Issue>
  WorkPtr launch(const std::string& what, Stream stream, Issue issue);
  // With state_->mu held: waits while `comm` reports ncclInProgress, at most the timeout; returns the result.
  ncclResult_t settle_locked(ncclComm_t comm, ncclResult_t first, const std::string& what);
  [[noreturn]] void fail_locked(const std::string& what, ncclResult_t r);
  void require_alive_locked(const std::string& what);
  // graceful: finalize (waits for the peers, at most the timeout); else abort at once.
  void teardown(bool graceful) noexcept;

  std::shared_ptr<Store> store_;  // kept alive for the job's lifetime (comm.hpp's contract)
  std::shared_ptr<NcclCommState> state_;
  std::unique_ptr<NcclWatchdog> watchdog_;
  fabric::NetworkDecision network_;
  std::string net_name_;  // kept alive for ncclConfig_t.netName
  bool register_buffers_ = false;
  std::set<void*> registrations_;
  cudaStream_t internal_stream_ = nullptr;
  float* scratch_ = nullptr;  // one float on the device, for barrier()
};

}  // namespace zero3::comm
