// The Gloo communicator: CPU buffers, TCP between processes (Debian's libgloo).
//
// Each communicator owns one worker thread that runs its collectives one after another in issue order;
// the issuing thread only checks arguments and queues. A Work completes from the worker with success or
// the stored error. Once a collective fails (a peer died, a timeout) gloo has closed the connections, so the
// communicator is marked broken and every later call fails at once, naming the first error.
//
// Before its data moves, every collective is compared across ranks: each rank sends a 32-byte description of
// its call (operation, count, dtype, reduce op, root, sequence number) to every other rank. Gloo itself checks
// nothing: a message longer than the receiver posted fails an enforce on gloo's I/O thread, which no caller can
// catch, and the process aborts. A difference is a CollectiveMismatchError on every rank; since nothing else was
// sent, the communicator stays usable.
//
// Every collective is zero3's own code over gloo's unbound buffers (rings, and a pipeline for broadcast), and every
// wait goes through wait_recv/wait_send, so that a dead peer ends every pending operation at once. Gloo alone
// does not: when a connection breaks it fails the operations still waiting for the peer, but not a send already
// handed to the socket (queued behind a full buffer, or written into a connection the peer had just reset),
// whose wait only ends at the timeout. A watch thread per communicator (gloo_peer_watch.hpp) keeps a receive that
// never completes posted to every peer; gloo fails it when that peer's connection breaks, and the thread then
// names the dead rank(s) and aborts the wait the worker is in. A destroyed communicator says goodbye to its peers
// first, so that they see a departure, not a crash; and connecting ends only when every rank watches every peer
// (confirm_connected), so that a rank leaving at once cannot break a connection a slower rank has yet to watch.
//
// Point-to-point transfers (send_recv) run on the same worker, in issue order with the collectives, but are not
// compared across all ranks: the two sides of each transfer exchange descriptions instead, and the transfers of one
// call run side by side (run_transfers()).
//
// 16-bit reductions add in f32 and round every partial sum to the dtype before passing it on, as NCCL does, so
// what crosses the links is 2 bytes per element. reduce_scatter and all_reduce are rings ((N-1)/N of the input
// crosses each link for reduce_scatter, twice that for all_reduce, like NCCL's).
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "comm/collective_args.hpp"
#include "comm/gloo/gloo_peer_watch.hpp"
#include "comm/gloo/gloo_store.hpp"
#include "comm/peer_transfers.hpp"
#include "comm/registry.hpp"
#include "comm/work.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::comm {
namespace {

// Gloo's own collectives use slot prefixes 0x01..0x08.
constexpr uint8_t kReduceScatterSlotPrefix = 0x40;
constexpr uint8_t kAgreementSlotPrefix = 0x41;
constexpr uint8_t kAllGatherSlotPrefix = 0x43;
constexpr uint8_t kBroadcastSlotPrefix = 0x44;
constexpr uint8_t kAllToAllSlotPrefix = 0x45;
// Point-to-point: a send's description (sender to receiver), a receive's description (receiver to sender), the data.
constexpr uint8_t kSendDescriptionSlotPrefix = 0x46;
constexpr uint8_t kRecvDescriptionSlotPrefix = 0x47;
constexpr uint8_t kPeerDataSlotPrefix = 0x48;
// A transfer's description on the wire: 4 x uint64 (magic | direction | dtype, count, tag, sequence).
constexpr uint64_t kTransferMagic = 0x7a337074;  // "z3pt"
// A call's description on the wire: 4 x uint64 (magic, kind, dtype, op | count | root + 1 | sequence).
constexpr size_t kCallWords = 4;
constexpr size_t kCallBytes = kCallWords * sizeof(uint64_t);
// A call whose data per message is at most this travels with its description (agree()): the schedule's hashes,
// gradient norms, overflow flags, small broadcasts.
constexpr size_t kInlineBytes = 1024;
constexpr size_t kMessageBytes = kCallBytes + kInlineBytes;
constexpr uint64_t kCallMagic = 0x7a337063;  // "z3pc"

void encode_call(const CollectiveCall& call, uint64_t sequence, uint64_t* out) {
  out[0] = (kCallMagic << 32) | (uint64_t{static_cast<uint8_t>(call.kind)} << 16) |
           (uint64_t{static_cast<uint8_t>(call.dtype)} << 8) | static_cast<uint8_t>(call.op + 1);
  out[1] = call.count;
  out[2] = static_cast<uint64_t>(static_cast<int64_t>(call.root) + 1);
  out[3] = sequence;
}

CollectiveCall decode_call(const uint64_t* in) {
  CollectiveCall call;
  call.kind = static_cast<CollectiveKind>((in[0] >> 16) & 0xff);
  call.dtype = static_cast<DType>((in[0] >> 8) & 0xff);
  call.op = static_cast<int>(in[0] & 0xff) - 1;
  call.count = in[1];
  call.root = static_cast<int>(static_cast<int64_t>(in[2]) - 1);
  return call;
}

// 1 MiB of f32 per transfer in the reduce-scatter ring, like gloo's own segment size.
constexpr size_t kSegmentElements = size_t{1} << 18;

float load(const void* p, DType dtype, size_t i) {
  switch (dtype) {
    case DType::f32:
      return static_cast<const float*>(p)[i];
    case DType::bf16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::f16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
  return 0.0f;
}

void store(void* p, DType dtype, size_t i, float v) {
  switch (dtype) {
    case DType::f32:
      static_cast<float*>(p)[i] = v;
      return;
    case DType::bf16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
      return;
    case DType::f16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16(v);
      return;
  }
}

// dst[i] = dtype(f32(a[i]) + f32(b[i])) / divisor: one addition in f32, one rounding. dst may be a or b.
// With op max: dst[i] = max(a[i], b[i]).
void add_into(void* dst, const void* a, const void* b, DType dtype, size_t n, float divisor = 1.0f,
              ReduceOp op = ReduceOp::sum) {
  if (op == ReduceOp::max) {
    for (size_t i = 0; i < n; ++i) store(dst, dtype, i, std::max(load(a, dtype, i), load(b, dtype, i)));
    return;
  }
  if (dtype == DType::f32) {
    auto* d = static_cast<float*>(dst);
    auto* x = static_cast<const float*>(a);
    auto* y = static_cast<const float*>(b);
    if (divisor == 1.0f) {
      for (size_t i = 0; i < n; ++i) d[i] = x[i] + y[i];
    } else {
      for (size_t i = 0; i < n; ++i) d[i] = (x[i] + y[i]) / divisor;
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) store(dst, dtype, i, (load(a, dtype, i) + load(b, dtype, i)) / divisor);
}

std::string machine_hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

bool is_loopback(const std::string& host) { return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1"; }

// One TCP device (gloo's event loop thread) per process and address: communicators and their splits share it.
std::shared_ptr<::gloo::transport::Device> make_device(const LaunchInfo& launch) {
  ::gloo::transport::tcp::attr attr;
  std::string where;
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
    attr.iface = ifname;
    where = std::string("interface ") + ifname + " (GLOO_SOCKET_IFNAME)";
  } else if (is_loopback(launch.master_addr)) {
    // Every rank reaches the store on a loopback address, so every rank runs on this machine (one node, or
    // nodes simulated by `zero3 launch --simulate-nodes`).
    attr.hostname = "127.0.0.1";
    where = "127.0.0.1 (loopback master address: every rank on this machine)";
  } else {
    attr.hostname = machine_hostname();
    where = "host name " + attr.hostname + " (set GLOO_SOCKET_IFNAME to pick an interface)";
  }
  try {
    auto device = ::gloo::transport::tcp::CreateDevice(attr);
    log::debug("gloo: listening on ", where);
    return device;
  } catch (const std::exception& e) {
    throw CommError("gloo cannot open a TCP device on " + where + ": " + e.what());
  }
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<::gloo::transport::Device> device, std::shared_ptr<Store> store, std::string prefix,
                   int rank, int size, std::chrono::milliseconds timeout)
      : device_(std::move(device)),
        store_(std::move(store)),
        prefix_(std::move(prefix)),
        rank_(rank),
        size_(size),
        timeout_(timeout),
        watch_(rank, size, timeout) {
    const std::string who = "gloo connect of rank " + std::to_string(rank) + " of " + std::to_string(size) +
                            " (store prefix " + prefix_ + ")";
    try {
      context_ = std::make_shared<::gloo::rendezvous::Context>(rank, size);
      context_->setTimeout(timeout);
      GlooStore rendezvous(make_prefix_store(store_, prefix_));
      context_->connectFullMesh(rendezvous, device_);
    } catch (const TimeoutError& e) {
      throw TimeoutError(who + " timed out: " + e.what());
    } catch (const std::exception& e) {
      // gloo's own connect timeout is an IoException ("Connect timeout", "Timed out ...").
      const std::string msg = e.what();
      if (msg.find("Timed out") != std::string::npos || msg.find("Connect timeout") != std::string::npos) {
        throw TimeoutError(who + " timed out after " + std::to_string(timeout_.count()) + " ms: " + msg);
      }
      throw CommError(who + " failed: " + msg);
    } catch (...) {
      throw CommError(who + " failed with an exception that is not a std::exception");
    }
    if (size_ > 1) {
      try {
        watch_.start(*context_, who);
        watch_.confirm_connected(who);
      } catch (const CommError&) {
        close(false);
        throw;
      } catch (const std::exception& e) {
        close(false);
        throw CommError(who + " failed: " + e.what());
      } catch (...) {
        close(false);
        throw CommError(who + " failed with an exception that is not a std::exception");
      }
    }
    try {
      worker_ = std::thread([this] { work_loop(); });
    } catch (const std::exception& e) {  // std::system_error: no thread could be made; the watch must not outlive us
      close(false);
      throw CommError(who + " failed: its worker thread could not be started (" + e.what() + ")");
    }
  }

  ~GlooCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
    close(true);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "gloo"; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  bool checks_collectives() const override { return true; }

  WorkPtr all_gather_into(void* out, const void* in, size_t count, DType dtype, Stream) override {
    std::string what = "gloo " + describe_collective("all_gather_into", count, dtype, rank_, size_);
    require_buffer(out, "out", count, what);
    require_buffer(in, "in", count, what);
    size_t bytes = count * dtype_size(dtype);
    char* own = static_cast<char*>(out) + static_cast<size_t>(rank_) * bytes;
    bool in_place = in == own;
    require_no_partial_overlap(out, bytes * static_cast<size_t>(size_), in, bytes, own, what);
    if (count == 0) return completed_work();
    Small small;
    if (bytes <= kInlineBytes) {
      small.payload = [=](int) { return std::pair<const void*, size_t>(in, bytes); };
      small.finish = [=, this](const std::vector<const char*>& from) {
        for (int p = 0; p < size_; ++p) {
          char* dst = static_cast<char*>(out) + static_cast<size_t>(p) * bytes;
          if (from[static_cast<size_t>(p)] != dst) std::memcpy(dst, from[static_cast<size_t>(p)], bytes);
        }
      };
    }
    return enqueue(
        what, {CollectiveKind::all_gather_into, count, dtype},
        [=, this](uint32_t tag) {
          if (!in_place) std::memcpy(own, in, bytes);
          ring_all_gather(static_cast<char*>(out), Chunks::even(bytes, size_), tag);
        },
        std::move(small));
  }

  WorkPtr reduce_scatter(void* out, const void* in, size_t count, DType dtype, ReduceOp op, Stream) override {
    std::string what = "gloo " + describe_collective("reduce_scatter", count, dtype, rank_, size_, reduce_op_name(op));
    require_buffer(out, "out", count, what);
    require_buffer(in, "in", count, what);
    require_sum_or_avg(op, what);
    size_t bytes = count * dtype_size(dtype);
    const char* own = static_cast<const char*>(in) + static_cast<size_t>(rank_) * bytes;
    require_no_partial_overlap(in, bytes * static_cast<size_t>(size_), out, bytes, own, what);
    if (count == 0) return completed_work();
    Small small;
    if (bytes <= kInlineBytes) {
      small.payload = [=](int peer) {
        return std::pair<const void*, size_t>(static_cast<const char*>(in) + static_cast<size_t>(peer) * bytes, bytes);
      };
      small.finish = [=, this](const std::vector<const char*>& from) {
        reduce_in_rank_order(out, from, count, dtype, op);
      };
    }
    return enqueue(
        what, {CollectiveKind::reduce_scatter, count, dtype, static_cast<int>(op)},
        [=, this](uint32_t tag) { ring_reduce_scatter(out, in, Chunks::even(count, size_), dtype, op, tag); },
        std::move(small));
  }

  // A ring reduce-scatter over uneven chunks of buf, in place, then a ring all-gather of the reduced chunks.
  WorkPtr all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, Stream) override {
    std::string what = "gloo " + describe_collective("all_reduce", count, dtype, rank_, size_, reduce_op_name(op));
    require_buffer(buf, "buf", count, what);
    if (count == 0) return completed_work();
    const size_t bytes = count * dtype_size(dtype);
    Small small;
    if (bytes <= kInlineBytes) {
      small.payload = [=](int) { return std::pair<const void*, size_t>(buf, bytes); };
      small.finish = [=, this](const std::vector<const char*>& from) {
        reduce_in_rank_order(buf, from, count, dtype, op);
      };
    }
    return enqueue(
        what, {CollectiveKind::all_reduce, count, dtype, static_cast<int>(op)},
        [=, this](uint32_t tag) {
          const Chunks chunks = Chunks::split(count, size_);
          char* own = static_cast<char*>(buf) + chunks.offset[static_cast<size_t>(rank_)] * dtype_size(dtype);
          ring_reduce_scatter(own, buf, chunks, dtype, op, tag);
          ring_all_gather(static_cast<char*>(buf), chunks.scaled(dtype_size(dtype)), tag);
        },
        std::move(small));
  }

  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root, Stream) override {
    std::string what = "gloo " + describe_collective("broadcast", count, dtype, rank_, size_, nullptr, root);
    require_buffer(buf, "buf", count, what);
    require_root(root, size_, what);
    if (count == 0) return completed_work();
    size_t bytes = count * dtype_size(dtype);
    Small small;
    if (bytes <= kInlineBytes) {
      small.payload = [=, this](int) {
        return rank_ == root ? std::pair<const void*, size_t>(buf, bytes) : std::pair<const void*, size_t>(nullptr, 0);
      };
      small.finish = [=, this](const std::vector<const char*>& from) {
        if (rank_ != root) std::memcpy(buf, from[static_cast<size_t>(root)], bytes);
      };
    }
    return enqueue(
        what, {CollectiveKind::broadcast, count, dtype, -1, root},
        [=, this](uint32_t tag) { ring_broadcast(static_cast<char*>(buf), bytes, root, tag); }, std::move(small));
  }

  // Equal splits: block p of `in` goes to rank p, block p of `out` comes from rank p. Every peer's block is sent
  // and received over unbound buffers, each wait through wait_recv/wait_send like the rings'.
  WorkPtr all_to_all(void* out, const void* in, size_t count, DType dtype, Stream) override {
    std::string what = "gloo " + describe_collective("all_to_all", count, dtype, rank_, size_);
    require_buffer(out, "out", count, what);
    require_buffer(in, "in", count, what);
    const size_t bytes = count * dtype_size(dtype) * static_cast<size_t>(size_);
    require_no_partial_overlap(out, bytes, in, bytes, nullptr, what);
    if (count == 0) return completed_work();
    return enqueue(what, {CollectiveKind::all_to_all, count, dtype},
                   [=, this](uint32_t tag) { exchange_blocks(static_cast<char*>(out), static_cast<const char*>(in),
                                                             count * dtype_size(dtype), tag); });
  }

  // Point-to-point transfers run on the worker like collectives (so issue order holds across both), but take no part
  // in the collectives' comparison: only the peers of a transfer see it. run_transfers() says how they meet.
  WorkPtr send_recv(const std::vector<PeerTransfer>& transfers, Stream) override {
    std::string what = describe_transfers("gloo", transfers, rank_, size_);
    auto self = check_transfers(transfers, rank_, size_, what);
    if (transfers.empty()) return completed_work();
    return enqueue_transfers(what, [=, this] {
      copy_self_transfers(transfers, self);
      run_transfers(transfers, what);
    });
  }

  // The call comparison every rank takes part in is itself the barrier: no rank gets past it before every
  // other rank has sent its description of this call.
  void barrier() override {
    std::string what = "gloo barrier on rank " + std::to_string(rank_) + " of " + std::to_string(size_);
    Small nothing;
    nothing.payload = [](int) { return std::pair<const void*, size_t>(nullptr, 0); };
    nothing.finish = [](const std::vector<const char*>&) {};
    enqueue(
        what, {CollectiveKind::barrier}, [](uint32_t) {}, std::move(nothing))
        ->wait();
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    int n = ++splits_;
    // Everyone's (color, key), in rank order, through an all-gather on this communicator.
    std::vector<int32_t> all(2 * static_cast<size_t>(size_));
    int32_t mine[2] = {color, key};
    all_gather_into(all.data(), mine, 2, DType::f32, nullptr)->wait();  // 8 bytes per rank; the type is moot
    if (color < 0) return nullptr;
    std::vector<std::pair<int, int>> members;  // (key, rank)
    for (int r = 0; r < size_; ++r) {
      if (all[2 * static_cast<size_t>(r)] == color) members.push_back({all[2 * static_cast<size_t>(r) + 1], r});
    }
    std::sort(members.begin(), members.end());
    int new_rank =
        static_cast<int>(std::find(members.begin(), members.end(), std::make_pair(key, rank_)) - members.begin());
    std::string prefix = prefix_ + "/split" + std::to_string(n) + "/color" + std::to_string(color);
    log::debug("gloo split ", n, ": color ", color, " has ", members.size(), " ranks, this is rank ", new_rank);
    return std::make_unique<GlooCommunicator>(device_, store_, prefix, new_rank, static_cast<int>(members.size()),
                                              timeout_);
  }

 private:
  // A call whose data rides on the call comparison's messages (agree()).
  struct Small {
    // The bytes (at most kInlineBytes) this rank sends to `peer`, or to itself (its own part of the result).
    std::function<std::pair<const void*, size_t>(int peer)> payload;
    // Finishes the call from every rank's payload to this rank (by rank).
    std::function<void(const std::vector<const char*>& from)> finish;
    explicit operator bool() const { return static_cast<bool>(finish); }
  };

  struct Task {
    CollectiveCall call;
    std::function<void(uint32_t)> body;
    std::shared_ptr<AsyncWork> work;
    Small small;
    bool point_to_point = false;  // send_recv: no comparison, no collective sequence number
  };

  WorkPtr enqueue(const std::string& what, CollectiveCall call, std::function<void(uint32_t)> body, Small small = {}) {
    auto work = std::make_shared<AsyncWork>(what, timeout_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({call, std::move(body), work, std::move(small)});
    }
    cv_.notify_one();
    return work;
  }

  WorkPtr enqueue_transfers(const std::string& what, std::function<void()> body) {
    auto work = std::make_shared<AsyncWork>(what, timeout_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({{}, [body = std::move(body)](uint32_t) { body(); }, work, {}, true});
    }
    cv_.notify_one();
    return work;
  }

  // The transfers to other ranks of one send_recv call, each on a thread of its own, so that each completes as soon
  // as its peer posts its side, whatever the other transfers of the call wait for (as NCCL's grouped send/recv do).
  // The k-th send from a to b meets b's k-th receive from a: each side counts its sends to and receives from every
  // peer (worker thread only), and that number is the slot tag of the pair's messages. Both sides first exchange a
  // 32-byte description (count, dtype, tag; the sender's on one slot prefix, the receiver's on another, the receive
  // posted before the send); the data moves only when the two agree, and the receive is posted at exactly the
  // agreed size, so no message can exceed what its receiver posted (gloo would abort the process). A transfer whose
  // sides differ moves nothing; the call then throws CollectiveMismatchError on both sides, after its other transfers
  // completed. Every wait goes through the watch, with the call's one deadline.
  void run_transfers(const std::vector<PeerTransfer>& transfers, const std::string& what) {
    const Deadline left{std::chrono::steady_clock::now() + timeout_};
    struct Remote {
      const PeerTransfer* transfer;
      uint32_t sequence;
      std::string mismatch;
      std::exception_ptr error;
    };
    std::vector<Remote> remote;
    remote.reserve(transfers.size());
    for (const PeerTransfer& t : transfers) {
      if (t.peer == rank_) continue;
      auto& counter = t.direction == PeerTransfer::Direction::send ? sent_to_ : received_from_;
      if (counter.empty()) counter.assign(static_cast<size_t>(size_), 0);
      remote.push_back({&t, counter[static_cast<size_t>(t.peer)]++, {}, nullptr});
    }
    if (remote.size() == 1) {
      run_transfer(*remote[0].transfer, remote[0].sequence, left, remote[0].mismatch);
    } else {
      std::vector<std::thread> threads;
      for (Remote& x : remote) {
        try {
          threads.emplace_back([&x, &left, this] {
            try {
              run_transfer(*x.transfer, x.sequence, left, x.mismatch);
            } catch (...) {
              x.error = std::current_exception();
            }
          });
        } catch (const std::exception& e) {  // no thread: the transfers already started end at the timeout
          x.error = std::make_exception_ptr(CommError(std::string("no thread for the transfer: ") + e.what()));
        }
      }
      for (std::thread& t : threads) t.join();
      for (const Remote& x : remote) {
        if (x.error) std::rethrow_exception(x.error);
      }
    }
    std::string mismatches;
    for (const Remote& x : remote) {
      if (!x.mismatch.empty()) mismatches += (mismatches.empty() ? "" : "; ") + x.mismatch;
    }
    if (!mismatches.empty()) {
      throw CollectiveMismatchError(what + ": the two sides of a transfer differ: " + mismatches +
                                    "; those transfers moved nothing, the others completed");
    }
  }

  // One transfer of run_transfers(); sets `mismatch` (and moves nothing) when the two sides' descriptions differ.
  void run_transfer(const PeerTransfer& t, uint32_t sequence, const Deadline& left, std::string& mismatch) {
    const bool send = t.direction == PeerTransfer::Direction::send;
    uint64_t mine[kCallWords] = {(kTransferMagic << 32) | (uint64_t{static_cast<uint8_t>(t.direction)} << 8) |
                                     static_cast<uint8_t>(t.dtype),
                                 t.count, t.tag, sequence};
    uint64_t theirs[kCallWords] = {};
    auto mine_buffer = context_->createUnboundBuffer(mine, kCallBytes);
    auto theirs_buffer = context_->createUnboundBuffer(theirs, kCallBytes);
    theirs_buffer->recv(t.peer, ::gloo::Slot::build(send ? kRecvDescriptionSlotPrefix : kSendDescriptionSlotPrefix,
                                                    sequence),
                        0, kCallBytes);
    mine_buffer->send(t.peer, ::gloo::Slot::build(send ? kSendDescriptionSlotPrefix : kRecvDescriptionSlotPrefix,
                                                  sequence),
                      0, kCallBytes);
    watch_.wait(*theirs_buffer, true, left());
    watch_.wait(*mine_buffer, false, left());
    if ((theirs[0] >> 32) != kTransferMagic || theirs[3] != sequence) {
      throw CommError(describe_transfer(t) + ": rank " + std::to_string(t.peer) +
                      " sent a transfer description this rank cannot read (another zero3 version, or a corrupted "
                      "connection)");
    }
    PeerTransfer other = t;
    other.direction = send ? PeerTransfer::Direction::recv : PeerTransfer::Direction::send;
    other.peer = rank_;
    other.dtype = static_cast<DType>(theirs[0] & 0xff);
    other.count = theirs[1];
    other.tag = static_cast<uint32_t>(theirs[2]);
    if (other.count != t.count || other.dtype != t.dtype || other.tag != t.tag) {
      mismatch = "this rank's " + describe_transfer(t) + " (its transfer #" + std::to_string(sequence) +
                 " in that direction) met rank " + std::to_string(t.peer) + "'s " + describe_transfer(other);
      return;
    }
    if (t.count == 0) return;
    auto data = context_->createUnboundBuffer(t.buf, t.count * dtype_size(t.dtype));
    const auto slot = ::gloo::Slot::build(kPeerDataSlotPrefix, sequence);
    if (send) {
      data->send(t.peer, slot, 0, data->size);
      watch_.wait(*data, false, left());
    } else {
      data->recv(t.peer, slot, 0, data->size);
      watch_.wait(*data, true, left());
    }
  }

  // Every rank's description of its call number `tag`, sent to every peer on a slot of its own; throws
  // CollectiveMismatchError when they differ. The receives are posted ahead, at a fixed size (a description and
  // up to kInlineBytes), so that a peer's description goes out the moment it is sent and no message of this
  // exchange can exceed what its receiver posted. A small call (task.small) carries its data in the same message:
  // once every rank's description matched, every rank has every peer's data and finishes the call from them,
  // with no other message; returns true then. The whole exchange has one timeout.
  bool agree(const Task& task, uint32_t tag, const std::string& what) {
    const Deadline left{std::chrono::steady_clock::now() + timeout_};
    const auto n = static_cast<size_t>(size_);
    if (!agreement_) {
      // Every peer's message, then this rank's message to every peer.
      agreement_bytes_.assign(2 * n * kMessageBytes, 0);
      agreement_ = context_->createUnboundBuffer(agreement_bytes_.data(), agreement_bytes_.size());
      posted_.assign(n, 0);
    }
    post_agreement_receives(tag, false);
    char* received = agreement_bytes_.data();
    char* sending = received + n * kMessageBytes;
    const CollectiveCall& call = task.call;
    const auto slot = ::gloo::Slot::build(kAgreementSlotPrefix, tag);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      char* message = sending + static_cast<size_t>(p) * kMessageBytes;
      encode_call(call, tag, reinterpret_cast<uint64_t*>(message));
      size_t bytes = kCallBytes;
      if (task.small) {
        const auto [data, length] = task.small.payload(p);
        if (length) std::memcpy(message + kCallBytes, data, length);
        bytes += length;
      }
      agreement_->send(p, slot, static_cast<size_t>(p) * kMessageBytes + n * kMessageBytes, bytes);
    }
    for (int i = 1; i < size_; ++i) watch_.wait(*agreement_, true, left());
    for (int i = 1; i < size_; ++i) watch_.wait(*agreement_, false, left());
    std::vector<CollectiveCall> calls;
    bool same = true;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) {
        calls.push_back(call);
        continue;
      }
      uint64_t w[kCallWords];
      std::memcpy(w, received + static_cast<size_t>(p) * kMessageBytes, kCallBytes);
      if ((w[0] >> 32) != kCallMagic || w[3] != tag) {
        throw CommError(what + ": rank " + std::to_string(p) + " sent a call description this rank cannot read " +
                        "(another zero3 version, or a corrupted connection)");
      }
      calls.push_back(decode_call(w));
      same = same && calls.back() == call;
    }
    if (!same) {
      post_agreement_receives(tag + 1, true);
      throw CollectiveMismatchError(mismatch_message(what, tag, calls));
    }
    if (!task.small) {
      post_agreement_receives(tag + 1, true);
      return false;
    }
    std::vector<const char*> from(n);
    for (size_t p = 0; p < n; ++p) {
      from[p] = static_cast<int>(p) == rank_ ? static_cast<const char*>(task.small.payload(rank_).first)
                                             : received + p * kMessageBytes + kCallBytes;
    }
    task.small.finish(from);
    // Only now: the next call's messages land where this one's were read.
    post_agreement_receives(tag + 1, true);
    return true;
  }

  // Posts the receives of call `tag` not posted yet. Ahead of a call (`ahead`), a peer whose connection is closed
  // already (it finished its last call and left) is no error of the call just done: its receive is posted again
  // when call `tag` runs, and fails that call.
  void post_agreement_receives(uint32_t tag, bool ahead) {
    const auto slot = ::gloo::Slot::build(kAgreementSlotPrefix, tag);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || posted_[static_cast<size_t>(p)] == tag) continue;
      try {
        agreement_->recv(p, slot, static_cast<size_t>(p) * kMessageBytes, kMessageBytes);
        posted_[static_cast<size_t>(p)] = tag;
      } catch (const std::exception&) {
        if (!ahead) throw;
      }
    }
  }

  void work_loop() {
    uint32_t tag = 0;
    while (true) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and nothing left
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      const std::string& what = task.work->description();
      if (!broken_.empty()) {
        task.work->fail(std::make_exception_ptr(
            CommError(what + ": this communicator failed earlier and cannot be used again (" + broken_ + ")")));
        continue;
      }
      try {
        if (task.point_to_point) {
          task.body(0);
        } else {
          ++tag;
          if (size_ == 1 || !agree(task, tag, what)) task.body(tag);
        }
        task.work->complete();
      } catch (const CollectiveMismatchError&) {
        // Every rank found the same difference before sending anything: the connections are in step.
        task.work->fail(std::current_exception());
      } catch (const std::exception& e) {
        std::string msg = e.what();
        // gloo reports its own timeouts as IoException "Timed out waiting ...". Of zero3's own CommErrors (the
        // watch's verdicts) only "a wait on this rank timed out" is one; a dead peer's ("... it exited, crashed or
        // timed out") is not a timeout of this rank.
        const bool ours = dynamic_cast<const CommError*>(&e) != nullptr;
        const bool timed_out =
            dynamic_cast<const TimeoutError*>(&e) ||
            (ours ? msg.find("a wait on this rank timed out") != std::string::npos
                  : msg.find("Timed out") != std::string::npos || msg.find("timed out") != std::string::npos);
        broken_ = msg;
        if (timed_out) {
          task.work->fail(std::make_exception_ptr(
              TimeoutError(what + " timed out after " + std::to_string(timeout_.count()) + " ms (" + msg +
                           "); a rank may have stopped, died, or issued collectives in a different order")));
        } else if (dynamic_cast<const CommError*>(&e)) {
          task.work->fail(std::make_exception_ptr(CommError(what + " failed: " + msg)));
        } else {
          // gloo failed the operation itself (its connection broke); the watch names the rank.
          broken_ = watch_.peer_failure_seen(msg, msg + "; a peer rank may have exited, crashed or timed out");
          task.work->fail(std::make_exception_ptr(CommError(what + " failed: " + broken_)));
        }
      } catch (...) {
        broken_ = "an exception that is not a std::exception";
        task.work->fail(std::make_exception_ptr(CommError(what + " failed with " + broken_)));
      }
    }
  }

  // How a buffer is cut into one chunk per rank: chunk c is [offset[c], offset[c] + length[c]) (elements or bytes).
  struct Chunks {
    std::vector<size_t> offset, length;
    static Chunks even(size_t each, int n) {
      Chunks c;
      for (int i = 0; i < n; ++i) {
        c.offset.push_back(static_cast<size_t>(i) * each);
        c.length.push_back(each);
      }
      return c;
    }
    // `count` cut as evenly as possible (the first count % n chunks one longer).
    static Chunks split(size_t count, int n) {
      Chunks c;
      const size_t base = count / static_cast<size_t>(n), extra = count % static_cast<size_t>(n);
      size_t at = 0;
      for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
        c.offset.push_back(at);
        c.length.push_back(base + (i < extra ? 1 : 0));
        at += c.length.back();
      }
      return c;
    }
    Chunks scaled(size_t factor) const {
      Chunks c = *this;
      for (auto& o : c.offset) o *= factor;
      for (auto& l : c.length) l *= factor;
      return c;
    }
    size_t largest() const { return *std::max_element(length.begin(), length.end()); }
  };

  // Ring reduce-scatter of `chunks` (elements) of `in` into `out` (this rank's chunk). At step s rank r sends the
  // partial result of chunk (r-s-1) to its right neighbour and receives the partial result of chunk (r-s-2) from
  // its left one, combining its own input; after size-1 steps it holds chunk r reduced over all ranks. Partial
  // sums travel in the input's dtype (added in f32, rounded once per step, as NCCL does); two chunk-sized buffers
  // alternate between sending and receiving, and the first step sends straight from the input. Each step moves
  // its chunk in segments, so combining one segment overlaps receiving the next; the last step writes the output
  // (which may be this rank's chunk of `in` itself).
  void ring_reduce_scatter(void* out, const void* in, const Chunks& chunks, DType dtype, ReduceOp op, uint32_t tag) {
    const int n = size_, r = rank_;
    const size_t esize = dtype_size(dtype);
    auto at = [&](int c) { return static_cast<const char*>(in) + chunks.offset[static_cast<size_t>(c)] * esize; };
    auto len = [&](int c) { return chunks.length[static_cast<size_t>(c)]; };
    if (n == 1) {  // sum, avg and max of one rank
      if (out != in) std::memmove(out, in, len(0) * esize);
      return;
    }
    const float divisor = op == ReduceOp::avg ? static_cast<float>(n) : 1.0f;
    const size_t largest = chunks.largest() * esize;
    if (largest == 0) return;
    // Scratch kept across calls: fresh multi-megabyte buffers would cost a page fault per 4 KiB every time.
    for (auto& b : scratch_) {
      if (b.size() < largest) b.resize(largest);
    }
    char* buf[2] = {scratch_[0].data(), scratch_[1].data()};
    std::unique_ptr<::gloo::transport::UnboundBuffer> ub[2] = {context_->createUnboundBuffer(buf[0], largest),
                                                               context_->createUnboundBuffer(buf[1], largest)};
    const int first = (r - 1 + n) % n;
    // gloo only reads a buffer it sends from.
    std::unique_ptr<::gloo::transport::UnboundBuffer> input =
        context_->createUnboundBuffer(const_cast<char*>(at(first)), std::max<size_t>(len(first) * esize, 1));
    ::gloo::transport::UnboundBuffer* sending = input.get();
    const auto slot = ::gloo::Slot::build(kReduceScatterSlotPrefix, tag);
    const int right = (r + 1) % n, left = (r - 1 + n) % n;
    int receiving = 0;
    for (int s = 0; s < n - 1; ++s) {
      const bool last = s == n - 2;
      const int sent = (r - s - 1 + 2 * n) % n, received = (r - s - 2 + 2 * n) % n;
      // Transfers on one pair and slot complete in the order they were posted.
      const size_t recv_segments = segments(len(received)), send_segments = segments(len(sent));
      for (size_t k = 0; k < recv_segments; ++k) {
        ub[receiving]->recv(left, slot, k * kSegmentElements * esize, segment(len(received), k) * esize);
      }
      for (size_t k = 0; k < send_segments; ++k) {
        sending->send(right, slot, k * kSegmentElements * esize, segment(len(sent), k) * esize);
      }
      const char* mine = at(received);
      char* acc = buf[receiving];
      for (size_t k = 0; k < recv_segments; ++k) {
        const size_t off = k * kSegmentElements * esize;
        wait_recv(*ub[receiving]);
        add_into(last ? static_cast<char*>(out) + off : acc + off, acc + off, mine + off, dtype,
                 segment(len(received), k), last ? divisor : 1.0f, op);
      }
      for (size_t k = 0; k < send_segments; ++k) wait_send(*sending);
      sending = ub[receiving].get();
      receiving = 1 - receiving;
    }
  }

  // Ring all-gather in place: `buf` holds every rank's chunk (bytes) and this rank's is in place. At step s rank r
  // sends chunk (r-s) to its right neighbour and receives chunk (r-s-1) from its left one.
  void ring_all_gather(char* buf, const Chunks& chunks, uint32_t tag) {
    const int n = size_, r = rank_;
    if (n == 1) return;
    const size_t total = chunks.offset.back() + chunks.length.back();
    if (total == 0) return;
    std::unique_ptr<::gloo::transport::UnboundBuffer> ub = context_->createUnboundBuffer(buf, total);
    const auto slot = ::gloo::Slot::build(kAllGatherSlotPrefix, tag);
    const int right = (r + 1) % n, left = (r - 1 + n) % n;
    constexpr size_t kSegmentBytes = kSegmentElements * sizeof(float);
    for (int s = 0; s < n - 1; ++s) {
      const size_t sent = static_cast<size_t>((r - s + n) % n), received = static_cast<size_t>((r - s - 1 + n) % n);
      size_t recvs = 0, sends = 0;
      for (size_t off = 0; off < chunks.length[received]; off += kSegmentBytes, ++recvs) {
        ub->recv(left, slot, chunks.offset[received] + off, std::min(kSegmentBytes, chunks.length[received] - off));
      }
      for (size_t off = 0; off < chunks.length[sent]; off += kSegmentBytes, ++sends) {
        ub->send(right, slot, chunks.offset[sent] + off, std::min(kSegmentBytes, chunks.length[sent] - off));
      }
      for (size_t k = 0; k < recvs; ++k) wait_recv(*ub);
      for (size_t k = 0; k < sends; ++k) wait_send(*ub);
    }
  }

  // All-to-all of `block` bytes per rank: this rank's own block is copied; every other one is received from its
  // rank while this rank's block for it is sent (in place is allowed: `in` is staged first when it is `out`).
  void exchange_blocks(char* out, const char* in, size_t block, uint32_t tag) {
    const size_t bytes = block * static_cast<size_t>(size_);
    std::vector<char> staged;
    if (in == out) {
      staged.assign(in, in + bytes);
      in = staged.data();
    }
    std::memcpy(out + static_cast<size_t>(rank_) * block, in + static_cast<size_t>(rank_) * block, block);
    if (size_ == 1) return;
    std::unique_ptr<::gloo::transport::UnboundBuffer> rx = context_->createUnboundBuffer(out, bytes);
    std::unique_ptr<::gloo::transport::UnboundBuffer> tx =
        context_->createUnboundBuffer(const_cast<char*>(in), bytes);
    const auto slot = ::gloo::Slot::build(kAllToAllSlotPrefix, tag);
    for (int p = 0; p < size_; ++p) {
      if (p != rank_) rx->recv(p, slot, static_cast<size_t>(p) * block, block);
    }
    for (int p = 0; p < size_; ++p) {
      if (p != rank_) tx->send(p, slot, static_cast<size_t>(p) * block, block);
    }
    for (int p = 1; p < size_; ++p) wait_recv(*rx);
    for (int p = 1; p < size_; ++p) wait_send(*tx);
  }

  // Broadcast as a pipeline along the ring from the root: each rank but the root receives every segment from its
  // left neighbour and, unless it is the last, passes it on to its right one as soon as it arrived.
  void ring_broadcast(char* buf, size_t bytes, int root, uint32_t tag) {
    const int n = size_, r = rank_;
    if (n == 1) return;
    std::unique_ptr<::gloo::transport::UnboundBuffer> ub = context_->createUnboundBuffer(buf, bytes);
    const auto slot = ::gloo::Slot::build(kBroadcastSlotPrefix, tag);
    const int right = (r + 1) % n, left = (r - 1 + n) % n;
    const bool receives = r != root, sends = right != root;
    constexpr size_t kSegmentBytes = kSegmentElements * sizeof(float);
    const size_t count = (bytes + kSegmentBytes - 1) / kSegmentBytes;
    auto length = [&](size_t k) { return std::min(kSegmentBytes, bytes - k * kSegmentBytes); };
    if (receives) {
      for (size_t k = 0; k < count; ++k) ub->recv(left, slot, k * kSegmentBytes, length(k));
    }
    for (size_t k = 0; k < count; ++k) {
      if (receives) wait_recv(*ub);
      if (sends) ub->send(right, slot, k * kSegmentBytes, length(k));
    }
    if (sends) {
      for (size_t k = 0; k < count; ++k) wait_send(*ub);
    }
  }

  // out = op over ranks of from[0..size) (count elements each), combined in rank order, so every rank computes the
  // same bits; each partial result is rounded to the dtype (NCCL's rule). `out` may be one of them.
  void reduce_in_rank_order(void* out, const std::vector<const char*>& from, size_t count, DType dtype, ReduceOp op) {
    const size_t bytes = count * dtype_size(dtype);
    std::vector<char> acc(from[0], from[0] + bytes);
    const float divisor = op == ReduceOp::avg ? static_cast<float>(size_) : 1.0f;
    for (size_t p = 1; p < from.size(); ++p) {
      add_into(acc.data(), acc.data(), from[p], dtype, count, p + 1 == from.size() ? divisor : 1.0f, op);
    }
    std::memcpy(out, acc.data(), bytes);
  }

  static size_t segments(size_t elements) { return (elements + kSegmentElements - 1) / kSegmentElements; }
  static size_t segment(size_t elements, size_t k) {
    return std::min(kSegmentElements, elements - k * kSegmentElements);
  }

  // Waits for one receive (send) of `buffer` to complete. Every wait of a collective goes through these, so that
  // the watch thread can end it the moment a peer's connection breaks. A wait past the timeout makes gloo close
  // every connection and throw "Timed out waiting ...".
  void wait_recv(::gloo::transport::UnboundBuffer& buffer) { watch_.wait(buffer, true, timeout_); }
  void wait_send(::gloo::transport::UnboundBuffer& buffer) { watch_.wait(buffer, false, timeout_); }

  // Ends the watch, first saying goodbye to every peer when `goodbye` (this communicator is destroyed after a
  // connect that succeeded; not waited for: a dead peer never takes it), and closes the connections. Never throws.
  void close(bool goodbye) {
    watch_.stop(goodbye);
    try {
      agreement_.reset();
      context_.reset();  // closes the connections (gloo may throw from its teardown)
      watch_.release();
    } catch (const std::exception& e) {
      log::warn("gloo: closing the connections of rank ", rank_, " of ", size_, " failed: ", e.what());
    } catch (...) {
      log::warn("gloo: closing the connections of rank ", rank_, " of ", size_, " failed");
    }
  }

  std::shared_ptr<::gloo::transport::Device> device_;
  std::shared_ptr<Store> store_;  // the job's store, unprefixed by this communicator
  std::string prefix_;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<::gloo::rendezvous::Context> context_;
  int splits_ = 0;                // issuing thread only
  std::vector<char> scratch_[2];  // worker thread only
  // The messages of the call comparison (worker thread only): every peer's, received into agreement_, whose
  // receives for the next call are always posted, then this rank's to every peer.
  std::vector<char> agreement_bytes_;
  std::unique_ptr<::gloo::transport::UnboundBuffer> agreement_;
  std::vector<uint32_t> posted_;  // by rank: the call whose receive from that rank is posted
  // By rank: the point-to-point sends to and receives from that rank so far (worker thread only).
  std::vector<uint32_t> sent_to_, received_from_;

  PeerWatch watch_;  // after context_: its receives go first (release())

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stop_ = false;
  std::string broken_;  // worker thread only
  std::thread worker_;
};

std::unique_ptr<Communicator> make_gloo(const CommOptions& options, const LaunchInfo& launch,
                                        std::shared_ptr<Store> store) {
  if (!store) {
    throw CommError("backend gloo needs a store to rendezvous (rank " + std::to_string(launch.rank) + " of " +
                    std::to_string(launch.world_size) + "); use connect() or pass make_tcp_store(...)");
  }
  // Every communicator built on this store gets its own key space. Each rank counts its own constructions,
  // and all ranks construct in the same order, so the counts agree without talking.
  int64_t instance = store->add("gloo/instances/" + std::to_string(launch.rank), 1);
  std::string prefix = "gloo/" + std::to_string(instance);
  auto device = make_device(launch);
  return std::make_unique<GlooCommunicator>(std::move(device), std::move(store), prefix, launch.rank, launch.world_size,
                                            options.timeout);
}

const BackendRegistrar kGlooBackend("gloo", &make_gloo);

}  // namespace
}  // namespace zero3::comm
