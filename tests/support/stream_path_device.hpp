// A test Device that reports itself as cuda but keeps host memory and runs the cpu kernels, and that runs the
// work queued on a stream later, as a GPU does. The engine's cuda path (streams, events, device<->host copies
// of offload) then runs in CI, and a missing wait shows up as wrong numbers or a counted violation instead of a
// race only a GPU would hit.
//
// Streams: the compute stream (default_stream(), also what nullptr means to the device, as to the cuda device)
// and every stream from make_stream() are queues. The compute stream is CUDA's legacy default stream, or, with
// ComputeStream::callers, a stream of the caller's (as make_device("cuda", stream) gives); then the legacy
// default stream is a queue of its own (legacy_stream()), where the communicator's nullptr collectives land, as
// NCCL's do, unordered with the caller's stream. copy/move/fill_zero and the kernels append their work to the
// queue of the stream they are given and return; so do the collectives of StreamPathComm. Queued work runs
// when something waits for it (and, with StreamSchedule::eager_side_streams, side streams' work at once):
//   - DeviceEvent::synchronize() and DeviceStream::synchronize(): that stream's work up to the mark;
//   - DeviceEvent::wait_on(s): s runs the marked work before any of its own later work;
//   - copy/move/fill_zero with stream nullptr (synchronous on cuda): the compute stream's work, then the call;
//   - grad_stats (blocking): its stream's work; Device::synchronize() and the destructor: everything;
//   - a queued collective's Work::wait(): its stream's work up to the collective;
//   - run_queued(s).
// Memory: allocate() hands out "device" memory and allocate_host() "pinned host" memory (both host memory in
// truth, from separate pools); anything else is pageable host memory. The device tells them apart and counts
// what the engine does with them in StreamPathUsage.
//
// Counting what a GPU charges for (StreamPathUsage): every call that makes the host wait for the device
// (HostSyncs), and the growth of a stream-ordered pool as CUDA's cudaMallocAsync pool would see it (fragmentation
// aside): device memory in use plus memory freed on a stream other than the compute stream whose free has not
// run yet (a free on the compute stream is reused by the next allocation at once, since allocate() is ordered
// there); an allocation that lifts that sum above its high-water mark is a device allocation. Memory from
// allocate() is ordered on the compute stream: work on another stream that touches it before being ordered after
// that point of the compute stream (an event, or a host wait) is counted in uses_before_allocation.
//
// Threads: every call takes one lock, so calls from several threads are serialized.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "device/device_kernels.hpp"
#include "zero3/comm.hpp"
#include "zero3/device.hpp"

namespace zero3::testing {

// Calls that block the host until the device has reached a point of a stream. Each call counts once, whether
// or not the work was done already (on a GPU that depends on timing; the count is what the code asks for), except as
// said for collective waits. Event and Work queries (DeviceEvent::done, Work::is_completed) never block and are not
// counted.
struct HostSyncs {
  int64_t stream_synchronize = 0;  // DeviceStream::synchronize
  int64_t event_synchronize = 0;   // DeviceEvent::synchronize of a recorded event
  int64_t device_synchronize = 0;  // Device::synchronize (the whole device)
  int64_t synchronous_copies = 0;  // copy/move/fill_zero with stream nullptr (they return when done)
  int64_t pageable_copies = 0;     // a copy on a stream with pageable host memory on one side (CUDA blocks)
  int64_t blocking_kernels = 0;    // grad_stats, which returns its numbers to the host
  // Work::wait / wait_for of a collective queued on a stream (NCCL: polls its event), unless the host already waited
  // for a point that runs after the collective (then it is complete on a GPU too, and NCCL's wait returns at once).
  int64_t collective_waits = 0;
  int64_t total() const {
    return stream_synchronize + event_synchronize + device_synchronize + synchronous_copies + pageable_copies +
           blocking_kernels + collective_waits;
  }
  HostSyncs operator-(const HostSyncs& o) const;
};
std::ostream& operator<<(std::ostream& os, const HostSyncs& s);

// What the engine did that a GPU would punish; each count should stay 0 unless noted.
struct StreamPathUsage {
  int64_t waits_before_record = 0;     // a stream waited on an event never recorded (CUDA would not wait)
  int64_t syncs_before_record = 0;     // the host waited on an event never recorded (CUDA returns at once)
  int64_t null_stream_events = 0;      // an event recorded or waited on with a null stream
  int64_t frees_while_queued = 0;      // deallocate/deallocate_host of memory that queued work still uses
  int64_t pageable_async_copies = 0;   // a copy queued on a stream with pageable host memory on one side
  int64_t kernels_on_host_memory = 0;  // a kernel given memory that is not from allocate()
  int64_t wait_cycles = 0;             // two streams waiting on each other (a GPU would hang)
  int64_t uses_before_allocation = 0;  // work on a stream used device memory not yet ordered after its allocation
  // Counted costs (the tests bound them).
  HostSyncs host_syncs;
  int64_t allocations = 0;         // allocate() calls that returned memory (served by the pool)
  int64_t device_allocations = 0;  // of which grew the pool (see above)
  int64_t host_allocations = 0;    // allocate_host() calls that grew the pinned cache (in use + pending frees)
  // The most reductions (reduce-scatters and all-reduces on a stream other than the compute stream) that the compute
  // stream was not ordered after when work was queued on it: reductions in flight while the compute goes on.
  int64_t max_reductions_in_flight = 0;
  int64_t legacy_stream_ops = 0;   // work queued on the legacy default stream while the caller's stream computes
  int64_t compute_stream_ops = 0;  // work queued on the compute stream
  // Informative counts.
  int64_t streams_made = 0;
  int64_t compute_waits = 0;                // wait_on(the compute stream)
  int64_t d2h_copies_on_side_streams = 0;   // device -> pinned host copies queued on a stream other than compute
  int64_t h2d_copies_on_side_streams = 0;   // pinned host -> device, likewise
  int64_t host_waits_with_work_behind = 0;  // event synchronize() with later work already queued on its stream
  std::set<Stream> d2h_streams;
  std::set<Stream> h2d_streams;
};

// When stream work runs. lazy: only when something waits for it (the latest a GPU could run it: a missing
// wait of the compute stream for a side stream shows). eager_side_streams: work on a stream other than the
// compute stream runs as soon as it is queued, pulling the compute work it waits for (the earliest a GPU could
// run it: a missing wait of a side stream for the compute stream shows). Tests run both.
enum class StreamSchedule { lazy, eager_side_streams };

// What the device computes on: CUDA's legacy default stream (make_device("cuda")), or a stream of the caller's
// (make_device("cuda", stream)).
enum class ComputeStream { legacy, callers };

class StreamPathDevice final : public detail::DeviceBackend {
 public:
  explicit StreamPathDevice(StreamSchedule schedule = StreamSchedule::lazy,
                            ComputeStream compute = ComputeStream::legacy);
  ~StreamPathDevice() override;

  DeviceType type() const override { return DeviceType::cuda; }
  int index() const override { return 0; }
  std::string name() const override { return "stream-path test device"; }

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) noexcept override;
  void deallocate_after(void* ptr, size_t bytes, Stream stream) noexcept override;
  void* allocate_host(size_t bytes) override;
  void deallocate_host(void* ptr, size_t bytes) noexcept override;
  void deallocate_host_after(void* ptr, size_t bytes, Stream stream) noexcept override;
  Stream default_stream() const override { return compute_; }
  std::unique_ptr<DeviceStream> make_stream() override;
  std::unique_ptr<DeviceEvent> make_event() override;
  void copy(void* dst, const void* src, size_t bytes, Stream stream) override;
  void move(void* dst, const void* src, size_t bytes, Stream stream) override;
  void fill_zero(void* ptr, size_t bytes, Stream stream) override;
  void synchronize() override;
  int64_t bytes_in_use() const override;
  int64_t peak_bytes_in_use() const override;
  detail::DeviceKernels& kernels() override { return *kernels_; }

  // Pinned host memory (allocate_host) in use, and the most there ever was.
  int64_t host_bytes_in_use() const;
  int64_t peak_host_bytes_in_use() const;
  // Runs the work queued on `stream` (nullptr: the compute stream) so far.
  void run_queued(Stream stream);
  // Queues `run` (a collective) on `stream`, touching [a, a + a_bytes) and [b, b + b_bytes); the Work it
  // returns is complete once the stream has run it, and wait() runs the stream up to it.
  WorkPtr enqueue_collective(Stream stream, std::function<void()> run, const void* a, size_t a_bytes, const void* b,
                             size_t b_bytes);
  // Called by the communicator after it queued a reduction on `stream` (counted in max_reductions_in_flight when
  // `stream` is not the compute stream).
  void note_side_reduction(Stream stream);
  // Whether `stream` is the compute stream (nullptr included).
  bool is_compute(Stream stream) const { return stream == nullptr || stream == compute_; }
  // CUDA's legacy default stream: the compute stream, or with ComputeStream::callers a queue of its own.
  Stream legacy_stream() const { return handle_of(queues_.front()); }
  bool computes_on_callers_stream() const { return compute_ != legacy_stream(); }
  // Whether `p` is in memory from allocate() (not pinned or pageable host memory).
  bool is_device_memory(const void* p) const;
  StreamPathUsage usage() const;

 private:
  friend class QueuedKernels;
  friend class QueuedEvent;
  friend class QueuedStream;
  friend class QueuedWork;

  struct Range {
    const char* begin;
    size_t bytes;
  };
  struct Op {
    std::function<void()> run;
    std::vector<Range> ranges;  // memory the work touches
  };
  // For each queue, the mark (ops enqueued) up to which a stream's later work is ordered after it.
  using Clock = std::map<const void*, uint64_t>;
  struct Queue {
    std::deque<Op> ops;
    uint64_t enqueued = 0;  // ops ever queued
    uint64_t executed = 0;  // ops finished
    bool running = false;
    Clock after;  // what this stream's next work runs after (through event waits)
  };
  struct Block {
    size_t bytes;
    const Queue* queue;  // allocated in the order of this stream
    uint64_t mark;       // at this point of it
  };
  enum class Memory { device, pinned, pageable };

  Queue& queue_of(Stream stream);
  Stream handle_of(const Queue& q) const { return reinterpret_cast<Stream>(const_cast<Queue*>(&q)); }
  void enqueue(Stream stream, std::function<void()> run, std::vector<Range> ranges);
  void run_until(Queue& q, uint64_t mark);
  // The host waits for `q` up to `mark`: runs it and orders everything queued from now on after it.
  void host_wait(Queue& q, uint64_t mark);
  // copy/move/fill_zero with stream nullptr: the host waits for the compute stream (counted).
  void wait_synchronous_call();
  void run_all();
  // Whether the host has waited for a point of some stream that runs after point `mark` of `q`.
  bool host_ordered_after(const Queue& q, uint64_t mark) const;
  void count_reductions_in_flight(const Queue& compute);
  static void merge(Clock& into, const Clock& from);
  // Counts work on `q` touching device memory it is not ordered after the allocation of.
  void note_allocation_order(const Queue& q, const std::vector<Range>& ranges);
  Memory memory_of(const void* p) const;
  // Takes a device or pinned block off the books and returns it to its pool, at once (no `after`) or when
  // `after` gets there; a block that queued work still uses is kept and counted in frees_while_queued.
  void release(void* ptr, size_t bytes, Memory kind, std::optional<Stream> after) noexcept;
  bool queued_work_uses(const void* p, size_t bytes) const;
  void note_kernel_args(std::initializer_list<const void*> args);

  const StreamSchedule schedule_;
  mutable std::recursive_mutex mu_;
  std::unique_ptr<Device> device_pool_ = make_cpu_device();
  std::unique_ptr<Device> pinned_pool_ = make_cpu_device();
  std::unique_ptr<detail::DeviceKernels> kernels_;
  // [0]: the legacy default stream, [1] with ComputeStream::callers: the caller's; stable addresses serve as
  // stream handles.
  std::deque<Queue> queues_;
  Stream compute_ = nullptr;
  Clock host_after_;  // what the host has waited for: all work queued from now on runs after it
  std::map<const char*, Block> device_blocks_;  // start -> block
  std::map<const char*, size_t> pinned_blocks_;
  // The stream-ordered pool model: bytes freed on another stream than the compute stream whose free has not
  // run yet, and the high-water mark of in use + those.
  std::vector<std::pair<const Queue*, uint64_t>> side_reductions_;  // (queue, mark) of reductions maybe in flight
  int64_t device_pending_ = 0;
  int64_t device_reserved_ = 0;
  int64_t pinned_pending_ = 0;
  int64_t pinned_reserved_ = 0;
  std::vector<std::pair<void*, size_t>> kept_device_;  // freed while in use: released at the end
  std::vector<std::pair<void*, size_t>> kept_pinned_;
  int64_t device_bytes_ = 0;
  int64_t peak_device_bytes_ = 0;
  int64_t pinned_bytes_ = 0;
  int64_t peak_pinned_bytes_ = 0;
  StreamPathUsage usage_;
};

}  // namespace zero3::testing
