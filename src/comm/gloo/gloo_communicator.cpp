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
// 16-bit reductions add in f32 and round every partial sum to the dtype before passing it on, as NCCL does, so
// what crosses the links is 2 bytes per element. reduce_scatter is a ring over gloo's unbound buffers: (N-1)/N of
// the input crosses each link, like NCCL's; all_reduce is gloo's own (a ring) with a 16-bit reduce function.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "comm/collective_args.hpp"
#include "comm/gloo/gloo_store.hpp"
#include "comm/registry.hpp"
#include "comm/work.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::comm {
namespace {

// Gloo's own collectives use slot prefixes 0x01..0x08.
constexpr uint8_t kReduceScatterSlotPrefix = 0x40;
constexpr uint8_t kAgreementSlotPrefix = 0x41;
// A call's description on the wire: 4 x uint64 (magic, kind, dtype, op | count | root + 1 | sequence).
constexpr size_t kCallWords = 4;
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
void add_into(void* dst, const void* a, const void* b, DType dtype, size_t n, float divisor = 1.0f) {
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
        timeout_(timeout) {
    try {
      context_ = std::make_shared<::gloo::rendezvous::Context>(rank, size);
      context_->setTimeout(timeout);
      GlooStore rendezvous(make_prefix_store(store_, prefix_));
      context_->connectFullMesh(rendezvous, device_);
    } catch (const TimeoutError& e) {
      throw TimeoutError("gloo rendezvous of rank " + std::to_string(rank) + " of " + std::to_string(size) +
                         " (store prefix " + prefix_ + ") timed out: " + e.what());
    } catch (const std::exception& e) {
      throw CommError("gloo rendezvous of rank " + std::to_string(rank) + " of " + std::to_string(size) +
                      " (store prefix " + prefix_ + ") failed: " + e.what());
    } catch (...) {
      throw CommError("gloo rendezvous of rank " + std::to_string(rank) + " of " + std::to_string(size) +
                      " (store prefix " + prefix_ + ") failed with an exception that is not a std::exception");
    }
    worker_ = std::thread([this] { work_loop(); });
  }

  ~GlooCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
    try {
      agreement_.reset();
      context_.reset();  // closes the connections (gloo may throw from its teardown)
    } catch (const std::exception& e) {
      log::warn("gloo: closing the connections of rank ", rank_, " of ", size_, " failed: ", e.what());
    } catch (...) {
      log::warn("gloo: closing the connections of rank ", rank_, " of ", size_, " failed");
    }
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
    return enqueue(what, {CollectiveKind::all_gather_into, count, dtype}, [=, this](uint32_t tag) {
      if (size_ == 1) {
        if (!in_place) std::memcpy(out, in, bytes);
        return;
      }
      ::gloo::AllgatherOptions opts(context_);
      if (!in_place) opts.setInput(static_cast<char*>(const_cast<void*>(in)), bytes);
      opts.setOutput(static_cast<char*>(out), bytes * static_cast<size_t>(size_));
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      ::gloo::allgather(opts);
    });
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
    return enqueue(what, {CollectiveKind::reduce_scatter, count, dtype, static_cast<int>(op)},
                   [=, this](uint32_t tag) { ring_reduce_scatter(out, in, count, dtype, op, tag); });
  }

  WorkPtr all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, Stream) override {
    std::string what = "gloo " + describe_collective("all_reduce", count, dtype, rank_, size_, reduce_op_name(op));
    require_buffer(buf, "buf", count, what);
    if (count == 0) return completed_work();
    return enqueue(what, {CollectiveKind::all_reduce, count, dtype, static_cast<int>(op)}, [=, this](uint32_t tag) {
      if (size_ == 1) return;
      ::gloo::AllreduceOptions opts(context_);
      if (dtype == DType::f32) {
        opts.setOutput(static_cast<float*>(buf), count);
        if (op == ReduceOp::max) {
          opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&::gloo::max<float>));
        } else {
          opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&::gloo::sum<float>));
        }
      } else {
        // 16-bit on the wire: each partial result of gloo's ring is computed in f32 and rounded to the dtype.
        opts.setOutput(static_cast<uint16_t*>(buf), count);
        opts.setReduceFunction([dtype, op](void* c, const void* a, const void* b, size_t n) {
          if (op == ReduceOp::max) {
            for (size_t i = 0; i < n; ++i) store(c, dtype, i, std::max(load(a, dtype, i), load(b, dtype, i)));
          } else {
            add_into(c, a, b, dtype, n);
          }
        });
      }
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      ::gloo::allreduce(opts);
      if (op == ReduceOp::avg) {
        for (size_t i = 0; i < count; ++i) store(buf, dtype, i, load(buf, dtype, i) / static_cast<float>(size_));
      }
    });
  }

  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root, Stream) override {
    std::string what = "gloo " + describe_collective("broadcast", count, dtype, rank_, size_, nullptr, root);
    require_buffer(buf, "buf", count, what);
    require_root(root, size_, what);
    if (count == 0) return completed_work();
    size_t bytes = count * dtype_size(dtype);
    return enqueue(what, {CollectiveKind::broadcast, count, dtype, -1, root}, [=, this](uint32_t tag) {
      if (size_ == 1) return;
      ::gloo::BroadcastOptions opts(context_);
      opts.setOutput(static_cast<char*>(buf), bytes);
      opts.setRoot(root);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      ::gloo::broadcast(opts);
    });
  }

  WorkPtr all_to_all(void* out, const void* in, size_t count, DType dtype, Stream) override {
    std::string what = "gloo " + describe_collective("all_to_all", count, dtype, rank_, size_);
    require_buffer(out, "out", count, what);
    require_buffer(in, "in", count, what);
    const size_t bytes = count * dtype_size(dtype) * static_cast<size_t>(size_);
    require_no_partial_overlap(out, bytes, in, bytes, nullptr, what);
    if (count == 0) return completed_work();
    return enqueue(what, {CollectiveKind::all_to_all, count, dtype}, [=, this](uint32_t tag) {
      if (size_ == 1) {
        std::memcpy(out, in, bytes);
        return;
      }
      ::gloo::AlltoallOptions opts(context_);
      opts.setInput(static_cast<char*>(const_cast<void*>(in)), bytes);
      opts.setOutput(static_cast<char*>(out), bytes);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      ::gloo::alltoall(opts);
    });
  }

  void barrier() override {
    std::string what = "gloo barrier on rank " + std::to_string(rank_) + " of " + std::to_string(size_);
    enqueue(what, {CollectiveKind::barrier}, [this](uint32_t tag) {
      if (size_ == 1) return;
      ::gloo::BarrierOptions opts(context_);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      ::gloo::barrier(opts);
    })->wait();
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
  struct Task {
    CollectiveCall call;
    std::function<void(uint32_t)> body;
    std::shared_ptr<AsyncWork> work;
  };

  WorkPtr enqueue(const std::string& what, CollectiveCall call, std::function<void(uint32_t)> body) {
    auto work = std::make_shared<AsyncWork>(what, timeout_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({call, std::move(body), work});
    }
    cv_.notify_one();
    return work;
  }

  // Every rank's description of its call number `tag`, exchanged with every peer on a slot of its own; throws
  // CollectiveMismatchError when they differ. Fixed-size messages, so this exchange itself cannot mismatch. The
  // whole exchange has one timeout. The receives for the next call are posted as soon as this one is done, so
  // that a peer's description goes out the moment it is sent, without a ready-to-receive round trip first.
  void agree(const CollectiveCall& call, uint32_t tag, const std::string& what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    auto left = [&] {
      auto rest = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      return std::max(rest, std::chrono::milliseconds(1));
    };
    constexpr size_t kBytes = kCallWords * sizeof(uint64_t);
    if (!agreement_) {
      agreement_words_.assign(kCallWords * static_cast<size_t>(size_), 0);
      agreement_ = context_->createUnboundBuffer(agreement_words_.data(), agreement_words_.size() * sizeof(uint64_t));
      post_agreement_receives(tag);
    }
    uint64_t* words = agreement_words_.data();
    encode_call(call, tag, &words[kCallWords * static_cast<size_t>(rank_)]);
    const auto slot = ::gloo::Slot::build(kAgreementSlotPrefix, tag);
    for (int p = 0; p < size_; ++p) {
      if (p != rank_) agreement_->send(p, slot, static_cast<size_t>(rank_) * kBytes, kBytes);
    }
    for (int i = 1; i < size_; ++i) agreement_->waitRecv(left());
    for (int i = 1; i < size_; ++i) agreement_->waitSend(left());
    std::vector<CollectiveCall> calls;
    bool same = true;
    for (int p = 0; p < size_; ++p) {
      const uint64_t* w = &words[kCallWords * static_cast<size_t>(p)];
      if ((w[0] >> 32) != kCallMagic || w[3] != tag) {
        throw CommError(what + ": rank " + std::to_string(p) + " sent a call description this rank cannot read " +
                        "(another zero3 version, or a corrupted connection)");
      }
      calls.push_back(decode_call(w));
      same = same && calls.back() == call;
    }
    post_agreement_receives(tag + 1);
    if (!same) throw CollectiveMismatchError(mismatch_message(what, tag, calls));
  }

  void post_agreement_receives(uint32_t tag) {
    constexpr size_t kBytes = kCallWords * sizeof(uint64_t);
    const auto slot = ::gloo::Slot::build(kAgreementSlotPrefix, tag);
    for (int p = 0; p < size_; ++p) {
      if (p != rank_) agreement_->recv(p, slot, static_cast<size_t>(p) * kBytes, kBytes);
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
        ++tag;
        if (size_ > 1) agree(task.call, tag, what);
        task.body(tag);
        task.work->complete();
      } catch (const CollectiveMismatchError&) {
        // Every rank found the same difference before sending anything: the connections are in step.
        task.work->fail(std::current_exception());
      } catch (const std::exception& e) {
        std::string msg = e.what();
        // gloo reports its own timeouts as IoException "Timed out waiting ...".
        bool timed_out = dynamic_cast<const TimeoutError*>(&e) || msg.find("Timed out") != std::string::npos ||
                         msg.find("timed out") != std::string::npos;
        broken_ = msg;
        if (timed_out) {
          task.work->fail(std::make_exception_ptr(
              TimeoutError(what + " timed out after " + std::to_string(timeout_.count()) + " ms (" + msg +
                           "); a rank may have stopped, died, or issued collectives in a different order")));
        } else {
          task.work->fail(std::make_exception_ptr(
              CommError(what + " failed: " + msg + "; a peer rank may have exited or crashed")));
        }
      } catch (...) {
        broken_ = "an exception that is not a std::exception";
        task.work->fail(std::make_exception_ptr(CommError(what + " failed with " + broken_)));
      }
    }
  }

  // Ring reduce-scatter. At step s rank r sends the partial sum of chunk (r-s-1) to its right neighbour and
  // receives the partial sum of chunk (r-s-2) from its left one, adding its own input; after size-1 steps it
  // holds chunk r summed over all ranks. Partial sums travel in the input's dtype (added in f32, rounded once per
  // step, as NCCL does); two chunk-sized buffers alternate between sending and receiving, and the first step sends
  // straight from the input. Each step moves its chunk in segments, so adding one segment overlaps receiving the
  // next; the last step writes the output.
  void ring_reduce_scatter(void* out, const void* in, size_t count, DType dtype, ReduceOp op, uint32_t tag) {
    const int n = size_, r = rank_;
    const size_t esize = dtype_size(dtype);
    auto chunk = [&](int c) { return static_cast<const char*>(in) + static_cast<size_t>(c) * count * esize; };
    if (n == 1) {  // sum and avg of one rank
      if (out != in) std::memmove(out, in, count * esize);
      return;
    }
    const float divisor = op == ReduceOp::avg ? static_cast<float>(n) : 1.0f;
    // Scratch kept across calls: fresh multi-megabyte buffers would cost a page fault per 4 KiB every time.
    for (auto& b : scratch_) {
      if (b.size() < count * esize) b.resize(count * esize);
    }
    char* buf[2] = {scratch_[0].data(), scratch_[1].data()};
    std::unique_ptr<::gloo::transport::UnboundBuffer> ub[2] = {context_->createUnboundBuffer(buf[0], count * esize),
                                                               context_->createUnboundBuffer(buf[1], count * esize)};
    // gloo only reads a buffer it sends from.
    std::unique_ptr<::gloo::transport::UnboundBuffer> input =
        context_->createUnboundBuffer(const_cast<char*>(chunk((r - 1 + n) % n)), count * esize);
    ::gloo::transport::UnboundBuffer* sending = input.get();
    const auto slot = ::gloo::Slot::build(kReduceScatterSlotPrefix, tag);
    const int right = (r + 1) % n, left = (r - 1 + n) % n;
    const size_t seg = kSegmentElements, segments = (count + seg - 1) / seg;
    int receiving = 0;
    for (int s = 0; s < n - 1; ++s) {
      const bool last = s == n - 2;
      // Transfers on one pair and slot complete in the order they were posted.
      for (size_t k = 0; k < segments; ++k) {
        size_t len = std::min(seg, count - k * seg);
        ub[receiving]->recv(left, slot, k * seg * esize, len * esize);
        sending->send(right, slot, k * seg * esize, len * esize);
      }
      const char* mine = chunk((r - s - 2 + 2 * n) % n);
      char* acc = buf[receiving];
      for (size_t k = 0; k < segments; ++k) {
        const size_t off = k * seg * esize, len = std::min(seg, count - k * seg);
        ub[receiving]->waitRecv(timeout_);
        // The last step writes the output, which may be `mine` itself (in place).
        add_into(last ? static_cast<char*>(out) + off : acc + off, acc + off, mine + off, dtype, len,
                 last ? divisor : 1.0f);
      }
      for (size_t k = 0; k < segments; ++k) sending->waitSend(timeout_);
      sending = ub[receiving].get();
      receiving = 1 - receiving;
    }
  }

  std::shared_ptr<::gloo::transport::Device> device_;
  std::shared_ptr<Store> store_;  // the job's store, unprefixed by this communicator
  std::string prefix_;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<::gloo::rendezvous::Context> context_;
  int splits_ = 0;                 // issuing thread only
  std::vector<char> scratch_[2];  // worker thread only
  // The call descriptions of every rank (worker thread only), received into agreement_, whose receives for the
  // next call are always posted.
  std::vector<uint64_t> agreement_words_;
  std::unique_ptr<::gloo::transport::UnboundBuffer> agreement_;

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
