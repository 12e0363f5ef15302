#include "support/stream_path_device.hpp"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <stdexcept>

#include "zero3/dtype.hpp"

namespace zero3::testing {

// A stream handle: its queue's address.
class QueuedStream final : public DeviceStream {
 public:
  QueuedStream(StreamPathDevice& device, Stream s) : device_(device), s_(s) {}
  Stream get() const override { return s_; }
  void synchronize() override { device_.run_queued(s_); }

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
    if (source == &device_.queue_of(stream)) return;  // a stream is ordered with itself
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
    device_.run_until(*queue_, mark_);
  }
  bool done() override {
    std::lock_guard lock(device_.mu_);
    return queue_ == nullptr || queue_->executed >= mark_;
  }

 private:
  StreamPathDevice& device_;
  StreamPathDevice::Queue* queue_ = nullptr;
  uint64_t mark_ = 0;
};

// A collective queued on a stream: done when the stream has run it.
class QueuedWork final : public Work {
 public:
  QueuedWork(StreamPathDevice& device, StreamPathDevice::Queue& queue, uint64_t mark)
      : device_(device), queue_(queue), mark_(mark) {}
  void wait() override {
    std::lock_guard lock(device_.mu_);
    device_.run_until(queue_, mark_);
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
    device_.run_queued(stream);
    return cpu_.grad_stats(x, type, n);
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

StreamPathDevice::StreamPathDevice(StreamSchedule schedule) : schedule_(schedule) {
  kernels_ = std::make_unique<QueuedKernels>(*this, device_pool_->kernels());
  queues_.emplace_back();
  compute_ = handle_of(queues_.front());
}

StreamPathDevice::~StreamPathDevice() {
  std::lock_guard lock(mu_);
  run_all();
  for (auto [p, bytes] : kept_device_) device_pool_->deallocate(p, bytes);
  for (auto [p, bytes] : kept_pinned_) pinned_pool_->deallocate(p, bytes);
}

StreamPathDevice::Queue& StreamPathDevice::queue_of(Stream stream) {
  if (stream == nullptr) return queues_.front();
  for (Queue& q : queues_) {
    if (handle_of(q) == stream) return q;
  }
  throw std::logic_error("stream-path test device: a stream it did not make");
}

void StreamPathDevice::enqueue(Stream stream, std::function<void()> run, std::vector<Range> ranges) {
  Queue& q = queue_of(stream);
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

void StreamPathDevice::run_queued(Stream stream) {
  std::lock_guard lock(mu_);
  Queue& q = queue_of(stream);
  run_until(q, q.enqueued);
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
  for (auto* blocks : {&device_blocks_, &pinned_blocks_}) {
    auto it = blocks->upper_bound(c);
    if (it == blocks->begin()) continue;
    --it;
    if (c < it->first + it->second) return blocks == &device_blocks_ ? Memory::device : Memory::pinned;
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
  device_blocks_[static_cast<const char*>(p)] = bytes;
  device_bytes_ += static_cast<int64_t>(bytes);
  peak_device_bytes_ = std::max(peak_device_bytes_, device_bytes_);
  return p;
}

void StreamPathDevice::release(void* ptr, size_t bytes, Memory kind, std::optional<Stream> after) noexcept {
  if (ptr == nullptr) return;
  std::lock_guard lock(mu_);
  const bool pinned = kind == Memory::pinned;
  (pinned ? pinned_blocks_ : device_blocks_).erase(static_cast<const char*>(ptr));
  (pinned ? pinned_bytes_ : device_bytes_) -= static_cast<int64_t>(bytes);
  auto free_block = [this, ptr, bytes, pinned] {
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
    if (d == Memory::pageable || s == Memory::pageable) usage_.pageable_async_copies++;
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
  if (stream == nullptr) run_queued(nullptr);
}

void StreamPathDevice::move(void* dst, const void* src, size_t bytes, Stream stream) {
  std::lock_guard lock(mu_);
  if (bytes == 0 || dst == src) return;
  enqueue(stream, [dst, src, bytes] { std::memmove(dst, src, bytes); },
          {{static_cast<const char*>(dst), bytes}, {static_cast<const char*>(src), bytes}});
  if (stream == nullptr) run_queued(nullptr);
}

void StreamPathDevice::fill_zero(void* ptr, size_t bytes, Stream stream) {
  std::lock_guard lock(mu_);
  if (bytes == 0) return;
  enqueue(stream, [ptr, bytes] { std::memset(ptr, 0, bytes); }, {{static_cast<const char*>(ptr), bytes}});
  if (stream == nullptr) run_queued(nullptr);
}

void StreamPathDevice::synchronize() {
  std::lock_guard lock(mu_);
  run_all();
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
