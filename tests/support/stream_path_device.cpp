#include "support/stream_path_device.hpp"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <stdexcept>

#include "zero3/dtype.hpp"

namespace zero3::testing {

HostSyncs HostSyncs::operator-(const HostSyncs& o) const {
  HostSyncs d;
  d.stream_synchronize = stream_synchronize - o.stream_synchronize;
  d.event_synchronize = event_synchronize - o.event_synchronize;
  d.device_synchronize = device_synchronize - o.device_synchronize;
  d.synchronous_copies = synchronous_copies - o.synchronous_copies;
  d.pageable_copies = pageable_copies - o.pageable_copies;
  d.blocking_kernels = blocking_kernels - o.blocking_kernels;
  d.collective_waits = collective_waits - o.collective_waits;
  return d;
}

std::ostream& operator<<(std::ostream& os, const HostSyncs& s) {
  return os << s.total() << " (stream synchronize " << s.stream_synchronize << ", event synchronize "
            << s.event_synchronize << ", device synchronize " << s.device_synchronize << ", synchronous copies "
            << s.synchronous_copies << ", pageable copies " << s.pageable_copies << ", blocking kernels "
            << s.blocking_kernels << ", collective waits " << s.collective_waits << ")";
}

// A stream handle: its queue's address.
class QueuedStream final : public DeviceStream {
 public:
  QueuedStream(StreamPathDevice& device, Stream s) : device_(device), s_(s) {}
  Stream get() const override { return s_; }
  void synchronize() override {
    std::lock_guard lock(device_.mu_);
    device_.usage_.host_syncs.stream_synchronize++;
    StreamPathDevice::Queue& q = device_.queue_of(s_);
    device_.host_wait(q, q.enqueued);
  }

 private:
  StreamPathDevice& device_;
  Stream s_;
};

class QueuedEvent final : public DeviceEvent {
 public:
  explicit QueuedEvent(StreamPathDevice& device) : device_(device) {}

  void record(Stream stream) override {
    std::lock_guard lock(device_.mu_);
    if (stream == nullptr) device_.usage_.null_stream_events++;
    queue_ = &device_.queue_of(stream);
    mark_ = queue_->enqueued;
    clock_ = queue_->after;
    StreamPathDevice::merge(clock_, device_.host_after_);
  }
  void wait_on(Stream stream) override {
    std::lock_guard lock(device_.mu_);
    if (stream == nullptr) device_.usage_.null_stream_events++;
    if (queue_ == nullptr) {
      device_.usage_.waits_before_record++;
      return;
    }
    if (device_.is_compute(stream)) device_.usage_.compute_waits++;
    StreamPathDevice::Queue* source = queue_;
    StreamPathDevice::Queue& target = device_.queue_of(stream);
    if (source == &target) return;  // a stream is ordered with itself
    StreamPathDevice::merge(target.after, clock_);
    StreamPathDevice::merge(target.after, {{source, mark_}});
    const uint64_t mark = mark_;
    StreamPathDevice* device = &device_;
    device_.enqueue(stream, [device, source, mark] { device->run_until(*source, mark); }, {});
  }
  void synchronize() override {
    std::lock_guard lock(device_.mu_);
    if (queue_ == nullptr) {
      device_.usage_.syncs_before_record++;
      return;
    }
    if (queue_->enqueued > mark_) device_.usage_.host_waits_with_work_behind++;
    device_.usage_.host_syncs.event_synchronize++;
    device_.host_wait(*queue_, mark_);
  }
  bool done() override {
    std::lock_guard lock(device_.mu_);
    return queue_ == nullptr || queue_->executed >= mark_;
  }

 private:
  StreamPathDevice& device_;
  StreamPathDevice::Queue* queue_ = nullptr;
  uint64_t mark_ = 0;
  StreamPathDevice::Clock clock_;  // what the marked point runs after
};

// A collective queued on a stream: done when the stream has run it.
class QueuedWork final : public Work {
 public:
  QueuedWork(StreamPathDevice& device, StreamPathDevice::Queue& queue, uint64_t mark)
      : device_(device), queue_(queue), mark_(mark) {}
  void wait() override {
    std::lock_guard lock(device_.mu_);
    // A collective the host is already ordered after (it waited for a point of a stream that runs after it) is
    // complete on a GPU too: NCCL's wait finds its event done and returns. Only a wait that can block counts.
    if (!device_.host_ordered_after(queue_, mark_)) device_.usage_.host_syncs.collective_waits++;
    device_.host_wait(queue_, mark_);
  }
  bool wait_for(std::chrono::milliseconds) override {
    wait();
    return true;
  }
  bool is_completed() override {
    std::lock_guard lock(device_.mu_);
    return queue_.executed >= mark_;
  }

 private:
  StreamPathDevice& device_;
  StreamPathDevice::Queue& queue_;
  uint64_t mark_;
};

// The cpu kernels, queued on the stream they are given.
class QueuedKernels final : public detail::DeviceKernels {
 public:
  QueuedKernels(StreamPathDevice& device, detail::DeviceKernels& cpu) : device_(device), cpu_(cpu) {}

  void scale_copy(void* dst, DType dst_type, const void* src, DType src_type, float scale, int64_t n,
                  Stream stream) override {
    std::lock_guard lock(device_.mu_);
    device_.note_kernel_args({dst, src});
    device_.enqueue(
        stream,
        [this, dst, dst_type, src, src_type, scale, n] { cpu_.scale_copy(dst, dst_type, src, src_type, scale, n); },
        {range(dst, n, dst_type), range(src, n, src_type)});
  }
  void scale_add(void* dst, DType dst_type, const void* src, DType src_type, float scale, int64_t n,
                 Stream stream) override {
    std::lock_guard lock(device_.mu_);
    device_.note_kernel_args({dst, src});
    device_.enqueue(
        stream,
        [this, dst, dst_type, src, src_type, scale, n] { cpu_.scale_add(dst, dst_type, src, src_type, scale, n); },
        {range(dst, n, dst_type), range(src, n, src_type)});
  }
  detail::GradStats grad_stats(const void* x, DType type, int64_t n, Stream stream) override {
    std::lock_guard lock(device_.mu_);
    device_.note_kernel_args({x});
    device_.usage_.host_syncs.blocking_kernels++;
    StreamPathDevice::Queue& q = device_.queue_of(stream);
    device_.host_wait(q, q.enqueued);
    return cpu_.grad_stats(x, type, n);
  }
  void accumulate_grad_stats(const void* x, DType type, int64_t n, double* acc, Stream stream) override {
    std::lock_guard lock(device_.mu_);
    device_.note_kernel_args({x, acc});
    device_.enqueue(
        stream, [this, x, type, n, acc] { cpu_.accumulate_grad_stats(x, type, n, acc); },
        {range(x, n, type), {static_cast<const char*>(static_cast<const void*>(acc)), 2 * sizeof(double)}});
  }
  void grad_stats_to_f32(const double* acc, float* out, Stream stream) override {
    std::lock_guard lock(device_.mu_);
    device_.note_kernel_args({acc, out});
    device_.enqueue(
        stream, [this, acc, out] { cpu_.grad_stats_to_f32(acc, out); },
        {{static_cast<const char*>(static_cast<const void*>(acc)), 2 * sizeof(double)}, range(out, 2, DType::f32)});
  }
  void adam(float* p, const float* g, float* m, float* v, int64_t n, const AdamStepConsts& c, void* copy_out,
            DType copy_type, Stream stream) override {
    std::lock_guard lock(device_.mu_);
    device_.note_kernel_args({p, g, m, v, copy_out});
    std::vector<StreamPathDevice::Range> ranges = {range(p, n, DType::f32), range(g, n, DType::f32),
                                                   range(m, n, DType::f32), range(v, n, DType::f32)};
    if (copy_out != nullptr) ranges.push_back(range(copy_out, n, copy_type));
    device_.enqueue(
        stream, [this, p, g, m, v, n, c, copy_out, copy_type] { cpu_.adam(p, g, m, v, n, c, copy_out, copy_type); },
        std::move(ranges));
  }
  void init_fill(float* out, const FillSpec& spec, uint64_t seed, uint64_t param_stream, int64_t begin, int64_t end,
                 Stream stream) override {
    std::lock_guard lock(device_.mu_);
    device_.note_kernel_args({out});
    device_.enqueue(stream,
                    [this, out, spec, seed, param_stream, begin, end] {
                      cpu_.init_fill(out, spec, seed, param_stream, begin, end);
                    },
                    {range(out, end - begin, DType::f32)});
  }
  void quantize(void* dst, const void* src, DType src_type, int64_t chunk, int64_t chunks, const QuantFormat& f,
                Stream stream) override {
    std::lock_guard lock(device_.mu_);
    device_.note_kernel_args({dst, src});
    device_.enqueue(
        stream, [this, dst, src, src_type, chunk, chunks, f] { cpu_.quantize(dst, src, src_type, chunk, chunks, f); },
        {message_range(dst, chunk, chunks, f), range(src, chunk * chunks, src_type)});
  }
  void dequantize(void* dst, DType dst_type, const void* src, int64_t chunk, int64_t chunks, const QuantFormat& f,
                  Stream stream) override {
    std::lock_guard lock(device_.mu_);
    device_.note_kernel_args({dst, src});
    device_.enqueue(
        stream, [this, dst, dst_type, src, chunk, chunks, f] { cpu_.dequantize(dst, dst_type, src, chunk, chunks, f); },
        {range(dst, chunk * chunks, dst_type), message_range(src, chunk, chunks, f)});
  }
  void dequantize_sum(float* dst, const void* src, int64_t chunk, int64_t chunks, const QuantFormat& f,
                      Stream stream) override {
    std::lock_guard lock(device_.mu_);
    device_.note_kernel_args({dst, src});
    device_.enqueue(stream, [this, dst, src, chunk, chunks, f] { cpu_.dequantize_sum(dst, src, chunk, chunks, f); },
                    {range(dst, chunk, DType::f32), message_range(src, chunk, chunks, f)});
  }

 private:
  static StreamPathDevice::Range range(const void* p, int64_t n, DType t) {
    return {static_cast<const char*>(p), n > 0 ? static_cast<size_t>(n) * dtype_size(t) : 0};
  }
  static StreamPathDevice::Range message_range(const void* p, int64_t chunk, int64_t chunks, const QuantFormat& f) {
    int64_t bytes = chunk > 0 && chunks > 0 && f.block > 0 ? chunks * quant_message_bytes(chunk, f) : 0;
    return {static_cast<const char*>(p), static_cast<size_t>(bytes)};
  }

  StreamPathDevice& device_;
  detail::DeviceKernels& cpu_;
};

StreamPathDevice::StreamPathDevice(StreamSchedule schedule, ComputeStream compute) : schedule_(schedule) {
  kernels_ = std::make_unique<QueuedKernels>(*this, detail::kernels_of(*device_pool_));
  queues_.emplace_back();
  if (compute == ComputeStream::callers) queues_.emplace_back();
  compute_ = handle_of(queues_.back());
}

StreamPathDevice::~StreamPathDevice() {
  std::lock_guard lock(mu_);
  run_all();
  for (auto [p, bytes] : kept_device_) device_pool_->deallocate(p, bytes);
  for (auto [p, bytes] : kept_pinned_) pinned_pool_->deallocate(p, bytes);
}

StreamPathDevice::Queue& StreamPathDevice::queue_of(Stream stream) {
  if (stream == nullptr) stream = compute_;
  for (Queue& q : queues_) {
    if (handle_of(q) == stream) return q;
  }
  throw std::logic_error("stream-path test device: a stream it did not make");
}

bool StreamPathDevice::host_ordered_after(const Queue& q, uint64_t mark) const {
  auto it = host_after_.find(&q);
  return it != host_after_.end() && it->second >= mark;
}

void StreamPathDevice::note_side_reduction(Stream stream) {
  std::lock_guard lock(mu_);
  if (is_compute(stream)) return;
  const Queue& q = queue_of(stream);
  side_reductions_.emplace_back(&q, q.enqueued);
}

void StreamPathDevice::count_reductions_in_flight(const Queue& compute) {
  // Reductions the compute stream is not ordered after (by an event wait or through the host) are still in flight
  // while it goes on.
  std::erase_if(side_reductions_, [&](const std::pair<const Queue*, uint64_t>& r) {
    auto a = compute.after.find(r.first);
    return (a != compute.after.end() && a->second >= r.second) || host_ordered_after(*r.first, r.second);
  });
  usage_.max_reductions_in_flight =
      std::max(usage_.max_reductions_in_flight, static_cast<int64_t>(side_reductions_.size()));
}

void StreamPathDevice::enqueue(Stream stream, std::function<void()> run, std::vector<Range> ranges) {
  Queue& q = queue_of(stream);
  note_allocation_order(q, ranges);
  if (handle_of(q) == compute_) {
    usage_.compute_stream_ops++;
    count_reductions_in_flight(q);
  }
  if (&q == &queues_.front() && computes_on_callers_stream()) usage_.legacy_stream_ops++;
  q.ops.push_back({std::move(run), std::move(ranges)});
  q.enqueued++;
  if (schedule_ == StreamSchedule::eager_side_streams && !is_compute(stream) && !q.running) run_until(q, q.enqueued);
}

void StreamPathDevice::run_until(Queue& q, uint64_t mark) {
  if (q.executed >= mark) return;
  if (q.running) {
    usage_.wait_cycles++;
    return;
  }
  q.running = true;
  while (q.executed < mark && !q.ops.empty()) {
    Op op = std::move(q.ops.front());
    q.ops.pop_front();
    op.run();
    q.executed++;
  }
  q.running = false;
}

void StreamPathDevice::host_wait(Queue& q, uint64_t mark) {
  run_until(q, mark);
  merge(host_after_, {{&q, mark}});
  merge(host_after_, q.after);
}

void StreamPathDevice::merge(Clock& into, const Clock& from) {
  for (const auto& [queue, mark] : from) {
    uint64_t& m = into[queue];
    if (mark > m) m = mark;
  }
}

void StreamPathDevice::note_allocation_order(const Queue& q, const std::vector<Range>& ranges) {
  for (const Range& r : ranges) {
    if (r.bytes == 0) continue;
    auto it = device_blocks_.upper_bound(r.begin);
    if (it == device_blocks_.begin()) continue;
    --it;
    const Block& b = it->second;
    if (r.begin >= it->first + b.bytes || b.queue == &q) continue;
    uint64_t ordered = 0;
    if (auto a = q.after.find(b.queue); a != q.after.end()) ordered = a->second;
    if (auto h = host_after_.find(b.queue); h != host_after_.end()) ordered = std::max(ordered, h->second);
    if (ordered < b.mark) usage_.uses_before_allocation++;
  }
}

void StreamPathDevice::run_queued(Stream stream) {
  std::lock_guard lock(mu_);
  Queue& q = queue_of(stream);
  host_wait(q, q.enqueued);
}

WorkPtr StreamPathDevice::enqueue_collective(Stream stream, std::function<void()> run, const void* a, size_t a_bytes,
                                             const void* b, size_t b_bytes) {
  std::lock_guard lock(mu_);
  enqueue(stream, std::move(run), {{static_cast<const char*>(a), a_bytes}, {static_cast<const char*>(b), b_bytes}});
  Queue& q = queue_of(stream);
  return std::make_shared<QueuedWork>(*this, q, q.enqueued);
}

void StreamPathDevice::run_all() {
  bool any = true;
  while (any) {
    any = false;
    for (Queue& q : queues_) {
      if (q.ops.empty()) continue;
      any = true;
      run_until(q, q.enqueued);
    }
  }
}

StreamPathDevice::Memory StreamPathDevice::memory_of(const void* p) const {
  const char* c = static_cast<const char*>(p);
  if (auto it = device_blocks_.upper_bound(c); it != device_blocks_.begin()) {
    --it;
    if (c < it->first + it->second.bytes) return Memory::device;
  }
  if (auto it = pinned_blocks_.upper_bound(c); it != pinned_blocks_.begin()) {
    --it;
    if (c < it->first + it->second) return Memory::pinned;
  }
  return Memory::pageable;
}

bool StreamPathDevice::is_device_memory(const void* p) const {
  std::lock_guard lock(mu_);
  return memory_of(p) == Memory::device;
}

bool StreamPathDevice::queued_work_uses(const void* p, size_t bytes) const {
  const char* b = static_cast<const char*>(p);
  for (const Queue& q : queues_) {
    for (const Op& op : q.ops) {
      for (const Range& r : op.ranges) {
        if (r.bytes != 0 && r.begin < b + bytes && b < r.begin + r.bytes) return true;
      }
    }
  }
  return false;
}

void StreamPathDevice::note_kernel_args(std::initializer_list<const void*> args) {
  for (const void* p : args) {
    if (p != nullptr && memory_of(p) != Memory::device) usage_.kernels_on_host_memory++;
  }
}

void* StreamPathDevice::allocate(size_t bytes) {
  std::lock_guard lock(mu_);
  void* p = device_pool_->allocate(bytes);
  if (p == nullptr) return p;
  // The allocation is a point of the compute stream (cudaMallocAsync): work there after it may use the memory.
  enqueue(compute_, [] {}, {});
  Queue& compute = queue_of(compute_);
  device_blocks_[static_cast<const char*>(p)] = Block{bytes, &compute, compute.enqueued};
  device_bytes_ += static_cast<int64_t>(bytes);
  peak_device_bytes_ = std::max(peak_device_bytes_, device_bytes_);
  usage_.allocations++;
  if (device_bytes_ + device_pending_ > device_reserved_) {
    device_reserved_ = device_bytes_ + device_pending_;
    usage_.device_allocations++;
  }
  return p;
}

void StreamPathDevice::release(void* ptr, size_t bytes, Memory kind, std::optional<Stream> after) noexcept {
  if (ptr == nullptr) return;
  std::lock_guard lock(mu_);
  const bool pinned = kind == Memory::pinned;
  if (pinned) {
    pinned_blocks_.erase(static_cast<const char*>(ptr));
  } else {
    device_blocks_.erase(static_cast<const char*>(ptr));
  }
  (pinned ? pinned_bytes_ : device_bytes_) -= static_cast<int64_t>(bytes);
  // Not reusable until the free has run: pinned memory freed on any stream (the host writes it, so the cache
  // waits for an event), device memory freed on another stream than the compute stream, where the pool
  // allocates.
  int64_t* pending = nullptr;
  if (after) pending = pinned ? &pinned_pending_ : (is_compute(*after) ? nullptr : &device_pending_);
  if (pending != nullptr) *pending += static_cast<int64_t>(bytes);
  auto free_block = [this, ptr, bytes, pinned, pending] {
    if (pending != nullptr) *pending -= static_cast<int64_t>(bytes);
    if (queued_work_uses(ptr, bytes)) {
      usage_.frees_while_queued++;
      (pinned ? kept_pinned_ : kept_device_).emplace_back(ptr, bytes);
      return;
    }
    (pinned ? pinned_pool_ : device_pool_)->deallocate(ptr, bytes);
  };
  if (!after) return free_block();
  try {
    // Freed once the stream gets there; work queued on other streams must not use it any more by then.
    enqueue(*after, free_block, {});
  } catch (...) {
    if (pending != nullptr) *pending -= static_cast<int64_t>(bytes);
    (pinned ? kept_pinned_ : kept_device_).emplace_back(ptr, bytes);
  }
}

void StreamPathDevice::deallocate(void* ptr, size_t bytes) noexcept { release(ptr, bytes, Memory::device, {}); }

void StreamPathDevice::deallocate_after(void* ptr, size_t bytes, Stream stream) noexcept {
  release(ptr, bytes, Memory::device, stream);
}

void* StreamPathDevice::allocate_host(size_t bytes) {
  std::lock_guard lock(mu_);
  void* p = pinned_pool_->allocate(bytes);
  if (p == nullptr) return p;
  pinned_blocks_[static_cast<const char*>(p)] = bytes;
  pinned_bytes_ += static_cast<int64_t>(bytes);
  peak_pinned_bytes_ = std::max(peak_pinned_bytes_, pinned_bytes_);
  if (pinned_bytes_ + pinned_pending_ > pinned_reserved_) {
    pinned_reserved_ = pinned_bytes_ + pinned_pending_;
    usage_.host_allocations++;
  }
  return p;
}

void StreamPathDevice::deallocate_host(void* ptr, size_t bytes) noexcept { release(ptr, bytes, Memory::pinned, {}); }

void StreamPathDevice::deallocate_host_after(void* ptr, size_t bytes, Stream stream) noexcept {
  release(ptr, bytes, Memory::pinned, stream);
}

std::unique_ptr<DeviceStream> StreamPathDevice::make_stream() {
  std::lock_guard lock(mu_);
  usage_.streams_made++;
  queues_.emplace_back();
  return std::make_unique<QueuedStream>(*this, handle_of(queues_.back()));
}

std::unique_ptr<DeviceEvent> StreamPathDevice::make_event() { return std::make_unique<QueuedEvent>(*this); }

void StreamPathDevice::copy(void* dst, const void* src, size_t bytes, Stream stream) {
  std::lock_guard lock(mu_);
  if (bytes == 0 || dst == src) return;
  if (stream != nullptr) {
    const Memory d = memory_of(dst), s = memory_of(src);
    if (d == Memory::pageable || s == Memory::pageable) {
      usage_.pageable_async_copies++;
      usage_.host_syncs.pageable_copies++;
    }
    if (!is_compute(stream)) {
      if (s == Memory::device && d == Memory::pinned) {
        usage_.d2h_copies_on_side_streams++;
        usage_.d2h_streams.insert(stream);
      }
      if (s == Memory::pinned && d == Memory::device) {
        usage_.h2d_copies_on_side_streams++;
        usage_.h2d_streams.insert(stream);
      }
    }
  }
  enqueue(stream, [dst, src, bytes] { std::memcpy(dst, src, bytes); },
          {{static_cast<const char*>(dst), bytes}, {static_cast<const char*>(src), bytes}});
  if (stream == nullptr) wait_synchronous_call();
}

void StreamPathDevice::move(void* dst, const void* src, size_t bytes, Stream stream) {
  std::lock_guard lock(mu_);
  if (bytes == 0 || dst == src) return;
  enqueue(stream, [dst, src, bytes] { std::memmove(dst, src, bytes); },
          {{static_cast<const char*>(dst), bytes}, {static_cast<const char*>(src), bytes}});
  if (stream == nullptr) wait_synchronous_call();
}

void StreamPathDevice::fill_zero(void* ptr, size_t bytes, Stream stream) {
  std::lock_guard lock(mu_);
  if (bytes == 0) return;
  enqueue(stream, [ptr, bytes] { std::memset(ptr, 0, bytes); }, {{static_cast<const char*>(ptr), bytes}});
  if (stream == nullptr) wait_synchronous_call();
}

void StreamPathDevice::wait_synchronous_call() {
  usage_.host_syncs.synchronous_copies++;
  Queue& q = queue_of(compute_);
  host_wait(q, q.enqueued);
}

void StreamPathDevice::synchronize() {
  std::lock_guard lock(mu_);
  usage_.host_syncs.device_synchronize++;
  run_all();
  for (Queue& q : queues_) merge(host_after_, {{&q, q.enqueued}});
}

int64_t StreamPathDevice::bytes_in_use() const {
  std::lock_guard lock(mu_);
  return device_bytes_;
}

int64_t StreamPathDevice::peak_bytes_in_use() const {
  std::lock_guard lock(mu_);
  return peak_device_bytes_;
}

int64_t StreamPathDevice::host_bytes_in_use() const {
  std::lock_guard lock(mu_);
  return pinned_bytes_;
}

int64_t StreamPathDevice::peak_host_bytes_in_use() const {
  std::lock_guard lock(mu_);
  return peak_pinned_bytes_;
}

StreamPathUsage StreamPathDevice::usage() const {
  std::lock_guard lock(mu_);
  return usage_;
}

}  // namespace zero3::testing
