#include "comm/nccl/nccl_communicator.hpp"

#include <strings.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>

#include "comm/collective_args.hpp"
#include "comm/fabric/network_negotiation.hpp"
#include "comm/nccl/nccl_check.hpp"
#include "comm/peer_transfers.hpp"
#include "device/cuda/cuda_check.hpp"
#include "device/cuda/cuda_device_guard.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::comm {
namespace {

ncclDataType_t nccl_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
  }
  throw InvalidArgument("nccl: unknown dtype " + std::to_string(static_cast<int>(t)));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
  }
  throw InvalidArgument("nccl: unknown reduce op " + std::to_string(static_cast<int>(op)));
}

std::string seconds(std::chrono::milliseconds ms) {
  std::string s = std::to_string(ms.count() / 1000.0);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

int pick_device(const CommOptions& options, const LaunchInfo& launch) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    throw CudaError("nccl backend on rank " + std::to_string(launch.rank) +
                    ": no CUDA device: " + detail::cuda_error_detail(e));
  }
  if (count == 0) throw CudaError("nccl backend on rank " + std::to_string(launch.rank) + ": no CUDA device");
  int device = options.device >= 0 ? options.device : launch.local_rank;
  if (device >= count) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    throw InvalidArgument(
        "nccl backend on rank " + std::to_string(launch.rank) + ": CUDA device " + std::to_string(device) + " (" +
        (options.device >= 0 ? "CommOptions::device" : "the launcher's local rank") +
        ") does not exist; this process sees " + std::to_string(count) + " device(s)" +
        (visible ? std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")" : std::string()) +
        ". Start at most that many ranks per node, or choose the device; several ranks on one GPU need NCCL 2.30 "
        "or later, or a distinct NCCL_HOSTID per rank");
  }
  return device;
}

// Every rank creates its communicators in the same order, so a process-wide counter names the same
// store keys on every rank.
std::string next_store_prefix() {
  static std::atomic<int> generation{0};
  return "zero3/nccl/" + std::to_string(generation.fetch_add(1));
}

}  // namespace

NcclCommunicator::NcclCommunicator(const CommOptions& options, const LaunchInfo& launch, std::shared_ptr<Store> store)
    : store_(store), state_(std::make_shared<NcclCommState>()) {
  ZERO3_REQUIRE(options.timeout.count() > 0, InvalidArgument, "nccl: timeout must be positive, got ",
                options.timeout.count(), " ms");
  ZERO3_REQUIRE(launch.world_size >= 1 && launch.rank >= 0 && launch.rank < launch.world_size, InvalidArgument,
                "nccl: rank ", launch.rank, " is not in a world of ", launch.world_size);
  ZERO3_REQUIRE(store || launch.world_size == 1, InvalidArgument, "nccl: a store is needed to join ", launch.world_size,
                " ranks");
  state_->rank = launch.rank;
  state_->size = launch.world_size;
  state_->timeout = options.timeout;
  state_->device = pick_device(options, launch);
  state_->name = "nccl communicator (rank " + std::to_string(launch.rank) + " of " + std::to_string(launch.world_size) +
                 ", device " + std::to_string(state_->device) + ")";
  register_buffers_ = options.register_buffers;
  detail::CudaDeviceGuard guard(state_->device);

  const auto mode = fabric::parse_network_mode(options.network);
  const std::string prefix = next_store_prefix();
  network_ = fabric::negotiate_network(mode, fabric::decide_network_here(mode), fabric::host_name(), store.get(),
                                       prefix, launch.rank, launch.world_size);
  if (network_.error) throw CommError(network_.message);
  if (network_.warn) {
    log::warn_rank0(network_.message);
  } else {
    log::info_rank0(network_.message);
  }
  if (!network_.set_plugin.empty() && !std::getenv("NCCL_NET_PLUGIN")) {
    // NCCL reads NCCL_NET_PLUGIN once, when its first communicator starts.
    setenv("NCCL_NET_PLUGIN", network_.set_plugin.c_str(), 0);
  }
  net_name_ = network_.net_name;
  if (const char* env_net = std::getenv("NCCL_NET");
      env_net && !net_name_.empty() && strcasecmp(env_net, net_name_.c_str()) != 0) {
    log::warn_rank0("NCCL_NET=", env_net, " is overridden: zero3.network = \"", fabric::network_mode_name(mode),
                    "\" pins NCCL's network to '", net_name_, "'");
  }

  ncclUniqueId id;
  const std::string id_key = prefix + "/unique_id";
  if (launch.rank == 0) {
    ZERO3_NCCL_CHECK(ncclGetUniqueId(&id));
    if (launch.world_size > 1) store->set(id_key, std::vector<uint8_t>(id.internal, id.internal + sizeof id.internal));
  } else {
    std::vector<uint8_t> bytes = store->get(id_key);
    if (bytes.size() != sizeof id.internal) {
      throw CommError("nccl: the unique id under store key '" + id_key + "' has " + std::to_string(bytes.size()) +
                      " bytes, expected " + std::to_string(sizeof id.internal));
    }
    std::memcpy(id.internal, bytes.data(), bytes.size());
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  if (!net_name_.empty()) config.netName = net_name_.c_str();
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    ncclComm_t comm = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&comm, launch.world_size, id, launch.rank, &config);
    state_->comm = comm;
    if (r == ncclSuccess || r == ncclInProgress) r = settle_locked(comm, ncclInProgress, "ncclCommInitRankConfig");
    if (r != ncclSuccess) {
      std::string reason =
          r == ncclInProgress
              ? "NCCL communicator init on " + state_->name + " did not finish within " + seconds(state_->timeout) +
                    " s: not every rank joined (are all " + std::to_string(launch.world_size) +
                    " ranks running and able to reach each other? NCCL_DEBUG=INFO shows where NCCL waits)"
              : "NCCL communicator init on " + state_->name + " failed: " + detail::nccl_error_detail(r, comm);
      if (comm) ncclCommAbort(comm);
      state_->comm = nullptr;
      if (r == ncclInProgress) throw TimeoutError(reason);
      throw CommError(reason);
    }
  }
  try {
    start();
  } catch (...) {
    teardown(false);  // the peers may never finalize with us
    throw;
  }
  log::info_rank0("nccl: ", launch.world_size, " ranks, NCCL ", nccl_runtime_version(), ", rank 0 on CUDA device ",
                  state_->device, ", collective timeout ", seconds(state_->timeout), " s",
                  register_buffers_ ? ", user-buffer registration on" : "");
}

NcclCommunicator::NcclCommunicator(Adopt, ncclComm_t comm, const NcclCommunicator& parent)
    : store_(parent.store_),
      state_(std::make_shared<NcclCommState>()),
      network_(parent.network_),
      net_name_(parent.net_name_),
      register_buffers_(parent.register_buffers_) {
  state_->comm = comm;
  state_->timeout = parent.state_->timeout;
  state_->device = parent.state_->device;
  try {
    ZERO3_NCCL_CHECK(ncclCommUserRank(comm, &state_->rank));
    ZERO3_NCCL_CHECK(ncclCommCount(comm, &state_->size));
    state_->name = "nccl communicator split from " + parent.state_->name + " (rank " + std::to_string(state_->rank) +
                   " of " + std::to_string(state_->size) + ")";
    detail::CudaDeviceGuard guard(state_->device);
    start();
  } catch (...) {
    teardown(false);  // the peers may never finalize with us
    throw;
  }
}

// While an exception unwinds, the peers may never arrive: finalizing would wait for them.
NcclCommunicator::~NcclCommunicator() { teardown(std::uncaught_exceptions() == 0); }

void NcclCommunicator::start() {
  detail::CudaDeviceGuard guard(state_->device);
  ZERO3_CUDA_CHECK(cudaStreamCreateWithFlags(&internal_stream_, cudaStreamNonBlocking));
  ZERO3_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&scratch_), sizeof(float)));
  watchdog_ = std::make_unique<NcclWatchdog>(state_);
}

ncclResult_t NcclCommunicator::settle_locked(ncclComm_t comm, ncclResult_t first, const std::string& what) {
  if (first != ncclInProgress) return first;
  const auto start = std::chrono::steady_clock::now();
  for (int spin = 0;; ++spin) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return r;
    if (state != ncclInProgress) return state;
    if (std::chrono::steady_clock::now() - start > state_->timeout) return ncclInProgress;
    // Enqueueing finishes in microseconds; init and split take milliseconds to seconds.
    if (spin < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

void NcclCommunicator::fail_locked(const std::string& what, ncclResult_t r) {
  std::string reason = r == ncclInProgress ? what + " was still being enqueued after " + seconds(state_->timeout) + " s"
                                           : what + " failed: " + detail::nccl_error_detail(r, state_->comm);
  if (watchdog_) {
    watchdog_->abort_locked(reason);
  } else if (state_->comm) {
    ncclCommAbort(state_->comm);
    state_->comm = nullptr;
    state_->aborted = true;
    state_->abort_reason = reason;
  }
  if (r == ncclInProgress) throw TimeoutError(reason + "; the communicator was aborted");
  throw CommError(reason + "; the communicator was aborted");
}

void NcclCommunicator::require_alive_locked(const std::string& what) {
  if (state_->aborted || !state_->comm) {
    throw CommError(what + ": the " + state_->name + " was aborted earlier because " + state_->abort_reason);
  }
}

bool NcclCommunicator::aborted() {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->aborted;
}

template <typename Issue>
WorkPtr NcclCommunicator::launch(const std::string& what, Stream stream, Issue issue) {
  std::lock_guard<std::mutex> lock(state_->mu);
  require_alive_locked(what);
  detail::CudaDeviceGuard guard(state_->device);
  auto s = reinterpret_cast<cudaStream_t>(stream);
  ncclResult_t r = settle_locked(state_->comm, issue(state_->comm, s), what);
  if (r != ncclSuccess) fail_locked(what, r);
  cudaEvent_t event = nullptr;
  ZERO3_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  auto work = std::make_shared<NcclWork>(what, event);
  ZERO3_CUDA_CHECK(cudaEventRecord(event, s));
  watchdog_->add_locked(work);
  return work;
}

WorkPtr NcclCommunicator::all_gather_into(void* out, const void* in, size_t count, DType dtype, Stream stream) {
  std::string what = "nccl " + describe_collective("all_gather_into", count, dtype, rank(), size());
  require_buffer(out, "out", count, what);
  require_buffer(in, "in", count, what);
  const size_t bytes = count * dtype_size(dtype);
  require_no_partial_overlap(out, bytes * size(), in, bytes, static_cast<char*>(out) + bytes * rank(), what);
  if (count == 0) return completed_work();
  return launch(what, stream,
                [&](ncclComm_t c, cudaStream_t s) { return ncclAllGather(in, out, count, nccl_dtype(dtype), c, s); });
}

WorkPtr NcclCommunicator::reduce_scatter(void* out, const void* in, size_t count, DType dtype, ReduceOp op,
                                         Stream stream) {
  std::string what = "nccl " + describe_collective("reduce_scatter", count, dtype, rank(), size(), reduce_op_name(op));
  require_buffer(out, "out", count, what);
  require_buffer(in, "in", count, what);
  require_sum_or_avg(op, what);
  const size_t bytes = count * dtype_size(dtype);
  require_no_partial_overlap(in, bytes * size(), out, bytes, static_cast<const char*>(in) + bytes * rank(), what);
  if (count == 0) return completed_work();
  return launch(what, stream, [&](ncclComm_t c, cudaStream_t s) {
    return ncclReduceScatter(in, out, count, nccl_dtype(dtype), nccl_op(op), c, s);
  });
}

WorkPtr NcclCommunicator::all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, Stream stream) {
  std::string what = "nccl " + describe_collective("all_reduce", count, dtype, rank(), size(), reduce_op_name(op));
  require_buffer(buf, "buf", count, what);
  if (count == 0) return completed_work();
  return launch(what, stream, [&](ncclComm_t c, cudaStream_t s) {
    return ncclAllReduce(buf, buf, count, nccl_dtype(dtype), nccl_op(op), c, s);
  });
}

WorkPtr NcclCommunicator::broadcast(void* buf, size_t count, DType dtype, int root, Stream stream) {
  std::string what = "nccl " + describe_collective("broadcast", count, dtype, rank(), size(), nullptr, root);
  require_buffer(buf, "buf", count, what);
  require_root(root, size(), what);
  if (count == 0) return completed_work();
  return launch(what, stream, [&](ncclComm_t c, cudaStream_t s) {
    return ncclBroadcast(buf, buf, count, nccl_dtype(dtype), root, c, s);
  });
}

WorkPtr NcclCommunicator::all_to_all(void* out, const void* in, size_t count, DType dtype, Stream stream) {
  std::string what = "nccl " + describe_collective("all_to_all", count, dtype, rank(), size());
  require_buffer(out, "out", count, what);
  require_buffer(in, "in", count, what);
  const size_t bytes = count * dtype_size(dtype);
  require_no_partial_overlap(out, bytes * size(), in, bytes * size(), nullptr, what);
  if (count == 0) return completed_work();
  return launch(what, stream, [&](ncclComm_t c, cudaStream_t s) {
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return r;
    for (int peer = 0; peer < size() && r == ncclSuccess; ++peer) {
      r = ncclSend(static_cast<const char*>(in) + bytes * peer, count, nccl_dtype(dtype), peer, c, s);
      if (r == ncclSuccess) r = ncclRecv(static_cast<char*>(out) + bytes * peer, count, nccl_dtype(dtype), peer, c, s);
    }
    const ncclResult_t end = ncclGroupEnd();
    return r != ncclSuccess ? r : end;
  });
}

WorkPtr NcclCommunicator::send_recv(const std::vector<PeerTransfer>& transfers, Stream stream) {
  const std::string what = describe_transfers("nccl", transfers, rank(), size());
  check_transfers(transfers, rank(), size(), what);  // NCCL sends to itself within the group
  bool moves = false;
  for (const PeerTransfer& t : transfers) moves = moves || t.count > 0;
  if (!moves) return completed_work();
  return launch(what, stream, [&](ncclComm_t c, cudaStream_t s) {
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return r;
    for (const PeerTransfer& t : transfers) {
      if (t.count == 0) continue;
      r = t.direction == PeerTransfer::Direction::send ? ncclSend(t.buf, t.count, nccl_dtype(t.dtype), t.peer, c, s)
                                                       : ncclRecv(t.buf, t.count, nccl_dtype(t.dtype), t.peer, c, s);
      if (r != ncclSuccess) break;
    }
    const ncclResult_t end = ncclGroupEnd();
    return r != ncclSuccess ? r : end;
  });
}

void NcclCommunicator::barrier() {
  std::string what = "nccl barrier on rank " + std::to_string(rank()) + " of " + std::to_string(size());
  launch(what, reinterpret_cast<Stream>(internal_stream_), [&](ncclComm_t c, cudaStream_t s) {
    return ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, c, s);
  })->wait();
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key) {
  std::string what = "nccl split(color=" + std::to_string(color) + ", key=" + std::to_string(key) + ") on rank " +
                     std::to_string(rank()) + " of " + std::to_string(size());
  ncclComm_t child = nullptr;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    require_alive_locked(what);
    detail::CudaDeviceGuard guard(state_->device);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    if (!net_name_.empty()) config.netName = net_name_.c_str();
    ncclResult_t r = ncclCommSplit(state_->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config);
    if (r == ncclSuccess || r == ncclInProgress) r = settle_locked(state_->comm, ncclInProgress, what);
    if (r == ncclSuccess && child) r = settle_locked(child, ncclInProgress, what);
    if (r != ncclSuccess) {
      if (child) ncclCommAbort(child);
      fail_locked(what, r);
    }
  }
  if (!child) return nullptr;
  return std::unique_ptr<Communicator>(new NcclCommunicator(Adopt{}, child, *this));
}

void* NcclCommunicator::register_buffer(void* ptr, size_t bytes) {
  if (!register_buffers_) return nullptr;
  std::string what = "ncclCommRegister(" + std::to_string(bytes) + " bytes) on " + state_->name;
  ZERO3_REQUIRE(ptr && bytes > 0, InvalidArgument, what, ": buffer is null or empty");
  std::lock_guard<std::mutex> lock(state_->mu);
  require_alive_locked(what);
  detail::CudaDeviceGuard guard(state_->device);
  void* handle = nullptr;
  ncclResult_t r = settle_locked(state_->comm, ncclCommRegister(state_->comm, ptr, bytes, &handle), what);
  if (r != ncclSuccess) throw CommError(what + " failed: " + detail::nccl_error_detail(r, state_->comm));
  registrations_.insert(handle);
  return handle;
}

void NcclCommunicator::deregister_buffer(void* handle) {
  if (!handle) return;
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!registrations_.erase(handle)) {
    throw InvalidArgument("nccl deregister_buffer: handle is not a registration of " + state_->name);
  }
  if (state_->aborted || !state_->comm) return;  // the abort released it
  detail::CudaDeviceGuard guard(state_->device);
  std::string what = "ncclCommDeregister on " + state_->name;
  ncclResult_t r = settle_locked(state_->comm, ncclCommDeregister(state_->comm, handle), what);
  if (r != ncclSuccess) throw CommError(what + " failed: " + detail::nccl_error_detail(r, state_->comm));
}

void NcclCommunicator::teardown(bool graceful) noexcept {
  try {
    if (watchdog_) watchdog_->stop();
    std::vector<std::shared_ptr<NcclWork>> pending;
    if (watchdog_) pending = watchdog_->take_pending();
    // Collectives still running get what is left of their timeout (the watchdog no longer watches them); one
    // that does not finish in it is stuck, and finalizing would wait another whole timeout for it: abort.
    for (auto& w : pending) {
      if (!graceful) break;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          state_->timeout - (std::chrono::steady_clock::now() - w->issued()));
      bool finished = true;
      try {
        finished = w->wait_for(std::max(left, std::chrono::milliseconds(0)));
      } catch (const std::exception&) {
        // failed: it no longer runs
      }
      if (!finished) {
        log::warn(state_->name, ": ", w->description(), " still runs at teardown; aborting the communicator");
        graceful = false;
      }
    }
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (!state_->aborted && state_->comm) {
        detail::CudaDeviceGuard guard(state_->device);
        for (void* handle : registrations_) {
          ncclResult_t r = settle_locked(state_->comm, ncclCommDeregister(state_->comm, handle), "deregister");
          if (r != ncclSuccess) log::warn("ncclCommDeregister on ", state_->name, ": ", ncclGetErrorString(r));
        }
        ncclResult_t r = ncclInProgress;
        if (graceful) {
          r = ncclCommFinalize(state_->comm);
          if (r == ncclSuccess || r == ncclInProgress) r = settle_locked(state_->comm, ncclInProgress, "finalize");
        }
        if (r == ncclSuccess) {
          r = ncclCommDestroy(state_->comm);
          if (r != ncclSuccess) log::warn("ncclCommDestroy on ", state_->name, ": ", ncclGetErrorString(r));
        } else {
          if (graceful) log::warn("ncclCommFinalize on ", state_->name, " did not finish: ", ncclGetErrorString(r));
          ncclCommAbort(state_->comm);
        }
        state_->comm = nullptr;
      }
      registrations_.clear();
    }
    for (auto& w : pending) {
      if (w->poll() == NcclWork::State::running) {
        w->fail(std::make_exception_ptr(
            CommError(w->description() + ": the communicator was destroyed before it completed")));
      }
    }
    if (scratch_ || internal_stream_) {
      detail::CudaDeviceGuard guard(state_->device);
      if (scratch_) cudaFree(scratch_);
      if (internal_stream_) cudaStreamDestroy(internal_stream_);
    }
    scratch_ = nullptr;
    internal_stream_ = nullptr;
  } catch (const std::exception& e) {
    log::error("destroying ", state_->name, ": ", e.what());
  }
}

}  // namespace zero3::comm
