// A test Device that reports itself as cuda but keeps host memory and runs the cpu kernels, and that runs the
// work queued on a stream later, as a GPU does. The engine's cuda path (streams, events, device<->host copies
// of offload) then runs in CI, and a missing wait shows up as wrong numbers or a counted violation instead of a
// race only a GPU would hit.
//
// Streams: the compute stream (default_stream(), also what nullptr means, as CUDA's legacy default stream) and
// every stream from make_stream() are queues. copy/move/fill_zero and the kernels append their work to the
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
#include <set>
#include <string>
#include <vector>

#include "device/device_kernels.hpp"
#include "zero3/comm.hpp"
#include "zero3/device.hpp"

namespace zero3::testing {

// What the engine did that a GPU would punish; each count should stay 0 unless noted.
struct StreamPathUsage {
  int64_t waits_before_record = 0;     // a stream waited on an event never recorded (CUDA would not wait)
  int64_t syncs_before_record = 0;     // the host waited on an event never recorded (CUDA returns at once)
  int64_t null_stream_events = 0;      // an event recorded or waited on with a null stream
  int64_t frees_while_queued = 0;      // deallocate/deallocate_host of memory that queued work still uses
  int64_t pageable_async_copies = 0;   // a copy queued on a stream with pageable host memory on one side
  int64_t kernels_on_host_memory = 0;  // a kernel given memory that is not from allocate()
  int64_t wait_cycles = 0;             // two streams waiting on each other (a GPU would hang)
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

class StreamPathDevice final : public Device {
 public:
  explicit StreamPathDevice(StreamSchedule schedule = StreamSchedule::lazy);
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
  // Whether `stream` is the compute stream (nullptr included).
  bool is_compute(Stream stream) const { return stream == nullptr || stream == compute_; }
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
  struct Queue {
    std::deque<Op> ops;
    uint64_t enqueued = 0;  // ops ever queued
    uint64_t executed = 0;  // ops finished
    bool running = false;
  };
  enum class Memory { device, pinned, pageable };

  Queue& queue_of(Stream stream);
  Stream handle_of(Queue& q) const { return reinterpret_cast<Stream>(&q); }
  void enqueue(Stream stream, std::function<void()> run, std::vector<Range> ranges);
  void run_until(Queue& q, uint64_t mark);
  void run_all();
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
  std::deque<Queue> queues_;  // [0]: the compute stream; stable addresses serve as stream handles
  Stream compute_ = nullptr;
  std::map<const char*, size_t> device_blocks_;  // start -> bytes
  std::map<const char*, size_t> pinned_blocks_;
  std::vector<std::pair<void*, size_t>> kept_device_;  // freed while in use: released at the end
  std::vector<std::pair<void*, size_t>> kept_pinned_;
  int64_t device_bytes_ = 0;
  int64_t peak_device_bytes_ = 0;
  int64_t pinned_bytes_ = 0;
  int64_t peak_pinned_bytes_ = 0;
  StreamPathUsage usage_;
};

}  // namespace zero3::testing
