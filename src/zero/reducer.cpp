#include "zero/reducer.hpp"

#include <algorithm>

#include "core/check.hpp"
#include "device/device_kernels.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {
namespace {

std::string unit_names(const std::vector<std::string>& units) {
  std::string s;
  size_t shown = std::min<size_t>(units.size(), 4);
  for (size_t i = 0; i < shown; ++i) s += (i ? ", '" : "'") + units[i] + "'";
  if (units.size() > shown) s += log::concat(" and ", units.size() - shown, " more");
  return s;
}

}  // namespace

int reduce_buckets_in_flight(int64_t largest_numel, int64_t bucket_numel) {
  const int64_t b = std::max<int64_t>(1, bucket_numel);
  const int64_t n = (std::max<int64_t>(0, largest_numel) + b - 1) / b + 1;
  return static_cast<int>(std::clamp<int64_t>(n, 2, 1 << 20));
}

Reducer::Reducer(ReducerOptions options, Device& device, MemoryCounters& counters, Communicator& comm, CommQueue& queue)
    : opt_(options),
      device_(device),
      counters_(counters),
      comm_(comm),
      queue_(queue),
      compute_(device.default_stream()),
      world_(comm.size()) {
  int64_t per = opt_.mode == ReduceMode::reduce_scatter ? std::max<int64_t>(1, opt_.bucket_numel / world_)
                                                        : std::max<int64_t>(1, opt_.bucket_numel);
  chunk_ = std::max<int64_t>(1, std::min(per, opt_.max_useful_numel));
  const int64_t in_numel = opt_.mode == ReduceMode::reduce_scatter ? chunk_ * world_ : chunk_;
  buckets_.resize(static_cast<size_t>(reduce_buckets_in_flight(opt_.largest_unit_numel, in_numel)));
  if (opt_.quantized) {
    local_ = opt_.intra ? opt_.intra->size() : 1;
    nodes_ = opt_.inter ? opt_.inter->size() : 1;
    ZERO3_REQUIRE(opt_.mode == ReduceMode::reduce_scatter && local_ * nodes_ == world_, InvalidArgument,
                  "Reducer: qgZ's stages of ", local_, " and ", nodes_, " ranks do not make the group of ", world_);
  }
}

QgzLayout qgz_layout(int64_t fill, int local, int nodes, const QuantFormat& format) {
  QgzLayout q;
  q.m1 = quant_message_bytes(nodes * fill, format);
  q.m2 = quant_message_bytes(fill, format);
  q.recv1 = static_cast<size_t>(local * q.m1);
  q.partial = 2 * q.recv1;
  q.send2 = q.partial + static_cast<size_t>(nodes * fill) * 4;
  q.recv2 = q.send2 + static_cast<size_t>(nodes * q.m2);
  q.result = q.recv2 + static_cast<size_t>(nodes * q.m2);
  q.total = q.result + static_cast<size_t>(fill) * 4;
  return q;
}

Reducer::Bucket& Reducer::current() {
  Bucket& b = buckets_[active_];
  if (!b.in.allocated()) {
    int64_t in_numel = opt_.mode == ReduceMode::reduce_scatter ? chunk_ * world_ : chunk_;
    b.in = DeviceBuffer(device_, counters_, MemoryCategory::buffers, in_numel * dtype_size(opt_.comm_dtype));
    if (opt_.quantized) {
      b.out = DeviceBuffer(device_, counters_, MemoryCategory::buffers, quant_layout(chunk_).total);
    } else if (opt_.mode == ReduceMode::reduce_scatter) {
      b.out = DeviceBuffer(device_, counters_, MemoryCategory::buffers, chunk_ * dtype_size(opt_.comm_dtype));
    }
  }
  if (b.ticket && opt_.fill_in_task) {
    b.ticket = nullptr;  // the task that fills it again runs after the last one (queue and stream order)
  } else if (b.ticket) {
    // The bucket's previous collective must be done before its buffer is written again (with a reduce
    // stream: the compute stream waits for it; the host does not).
    queue_.wait(b.ticket);
    b.ticket = nullptr;
    if (opt_.stream != nullptr) b.reduced->wait_on(compute_);
  }
  return b;
}

void Reducer::note_unit(Bucket& b, const std::string& unit) {
  if (b.units.empty() || b.units.back() != unit) b.units.push_back(unit);
}

void Reducer::add_scatter(const std::string& unit, const void* grad, int64_t slice_numel, void* acc) {
  auto& k = kernels_of(device_);
  const size_t es = dtype_size(opt_.comm_dtype);
  reduced_elements_ += slice_numel * world_;
  int64_t a = 0;
  while (a < slice_numel) {
    Bucket& b = current();
    int64_t take = std::min(slice_numel - a, chunk_ - b.fill);
    for (int r = 0; r < world_; ++r) {
      void* dst = static_cast<char*>(b.in.data()) + static_cast<size_t>(slot(r) * chunk_ + b.fill) * es;
      const void* src = element_ptr(grad, opt_.acc_dtype, static_cast<int64_t>(r) * slice_numel + a);
      k.scale_copy(dst, opt_.comm_dtype, src, opt_.acc_dtype, opt_.pre_scale, take, compute_);
    }
    b.pieces.push_back({acc, a, take, b.fill});
    note_unit(b, unit);
    b.fill += take;
    a += take;
    if (b.fill == chunk_) launch();
  }
}

void Reducer::add_all_reduce(const std::string& unit, void* acc, int64_t count) {
  auto& k = kernels_of(device_);
  const size_t es = dtype_size(opt_.comm_dtype);
  reduced_elements_ += count;
  int64_t a = 0;
  while (a < count) {
    Bucket& b = current();
    int64_t take = std::min(count - a, chunk_ - b.fill);
    if (!opt_.fill_in_task) {
      void* dst = static_cast<char*>(b.in.data()) + static_cast<size_t>(b.fill) * es;
      k.scale_copy(dst, opt_.comm_dtype, element_ptr(acc, opt_.acc_dtype, a), opt_.acc_dtype, opt_.pre_scale, take,
                   compute_);
    }
    b.pieces.push_back({acc, a, take, b.fill});
    note_unit(b, unit);
    b.fill += take;
    a += take;
    if (b.fill == chunk_) launch();
  }
}

void Reducer::flush() {
  if (buckets_[active_].fill > 0) launch();
}

void Reducer::join() {
  if (opt_.stream == nullptr) return;
  if (!joined_) joined_ = device_.make_event();
  joined_->record(opt_.stream);
  joined_->wait_on(compute_);
}

void Reducer::launch() {
  Bucket& b = buckets_[active_];
  const int64_t fill = b.fill;
  const size_t es = dtype_size(opt_.comm_dtype);
  if (opt_.mode == ReduceMode::reduce_scatter && fill < chunk_) {
    // Close the gaps so that chunk r starts at r * fill, as reduce_scatter expects.
    for (int r = 1; r < world_; ++r) {
      device_.move(static_cast<char*>(b.in.data()) + static_cast<size_t>(r * fill) * es,
                   static_cast<char*>(b.in.data()) + static_cast<size_t>(r * chunk_) * es,
                   static_cast<size_t>(fill) * es, compute_);
    }
  }
  const bool scatter = opt_.mode == ReduceMode::reduce_scatter;
  std::string what = log::concat(!scatter ? "all_reduce" : opt_.quantized ? "qgZ int4 all-to-all reduction" : "reduce_scatter",
                                 " of the gradients of unit", b.units.size() > 1 ? "s " : " ", unit_names(b.units), " (",
                                 scatter ? fill * world_ : fill, " elements, ", dtype_name(opt_.comm_dtype), ")",
                                 opt_.group.empty() ? "" : " over ", opt_.group);
  auto pieces = std::move(b.pieces);
  void* in = b.in.data();
  void* out = scatter ? b.out.data() : b.in.data();
  b.pieces.clear();
  b.units.clear();
  b.fill = 0;
  const Stream s = opt_.stream;
  DeviceEvent* reduced = nullptr;
  if (s != nullptr) {
    if (!b.filled) {
      b.filled = device_.make_event();
      b.reduced = device_.make_event();
    }
    b.filled->record(compute_);
    b.filled->wait_on(s);
    reduced = b.reduced.get();
  }
  if (opt_.quantized) {
    launch_quantized(b, what, std::move(pieces), in, fill, reduced);
  } else {
    if (opt_.traffic != nullptr) {
      count_collective(*opt_.traffic, opt_.link, scatter ? CollectiveKind::reduce_scatter : CollectiveKind::all_reduce,
                       fill, static_cast<int64_t>(es));
    }
    b.ticket = queue_.submit(what, [this, what, pieces = std::move(pieces), in, out, fill, scatter, s, reduced] {
      auto& k = kernels_of(device_);
      const size_t es = dtype_size(opt_.comm_dtype);
      if (opt_.fill_in_task) {
        for (const Piece& p : pieces) {
          k.scale_copy(static_cast<char*>(in) + static_cast<size_t>(p.bucket_offset) * es, opt_.comm_dtype,
                       element_ptr(p.acc, opt_.acc_dtype, p.acc_offset), opt_.acc_dtype, opt_.pre_scale, p.length, s);
        }
      }
      WorkPtr work;
      try {
        if (scatter) {
          work = comm_.reduce_scatter(out, in, static_cast<size_t>(fill), opt_.comm_dtype, ReduceOp::sum, s);
        } else {
          work = comm_.all_reduce(in, static_cast<size_t>(fill), opt_.comm_dtype, ReduceOp::sum, s);
        }
        if (s == nullptr) work->wait();
      } catch (const CommError&) {
        rethrow_comm_error(log::concat(what, " on rank ", comm_.rank(), " failed: "));
      }
      for (const Piece& p : pieces) {
        const void* src = static_cast<const char*>(out) + static_cast<size_t>(p.bucket_offset) * es;
        void* dst = element_ptr(p.acc, opt_.acc_dtype, p.acc_offset);
        if (scatter) {
          k.scale_add(dst, opt_.acc_dtype, src, opt_.comm_dtype, opt_.post_scale, p.length, s);
        } else {
          k.scale_copy(dst, opt_.acc_dtype, src, opt_.comm_dtype, opt_.post_scale, p.length, s);
        }
      }
      if (s != nullptr) {
        reduced->record(s);
        queue_.track(what + " on rank " + std::to_string(comm_.rank()), std::move(work));
      }
    });
  }
  active_ = (active_ + 1) % buckets_.size();
  ++launches_;
}

void Reducer::launch_quantized(Bucket& b, const std::string& what, std::vector<Piece> pieces, void* in, int64_t fill,
                               DeviceEvent* reduced) {
  const QgzLayout q = quant_layout(fill);
  char* work_area = static_cast<char*>(b.out.data());
  if (opt_.traffic != nullptr) {
    if (local_ > 1) count_collective(*opt_.traffic, opt_.intra_link, CollectiveKind::all_to_all, q.m1 / 4, 4);
    if (nodes_ > 1) count_collective(*opt_.traffic, opt_.inter_link, CollectiveKind::all_to_all, q.m2 / 4, 4);
  }
  const Stream s = opt_.stream;
  b.ticket = queue_.submit(what, [this, what, pieces = std::move(pieces), in, work_area, q, fill, s, reduced] {
    auto& k = kernels_of(device_);
    std::vector<WorkPtr> works;
    auto exchange = [&](Communicator* c, void* out, const void* send, int64_t bytes) {
      try {
        WorkPtr work = c->all_to_all(out, send, static_cast<size_t>(bytes / 4), DType::f32, s);
        if (s == nullptr) {
          work->wait();
        } else {
          works.push_back(std::move(work));
        }
      } catch (const CommError&) {
        rethrow_comm_error(log::concat(what, " on rank ", comm_.rank(), " failed: "));
      }
    };
    // The rows this rank reduces, summed over the node (stage 1) and then over the nodes (stage 2), in fp32.
    const void* sum = in;
    DType sum_type = opt_.comm_dtype;
    if (local_ > 1) {
      k.quantize(work_area, in, opt_.comm_dtype, nodes_ * fill, local_, opt_.format, s);
      exchange(opt_.intra, work_area + q.recv1, work_area, q.m1);
      k.dequantize_sum(reinterpret_cast<float*>(work_area + q.partial), work_area + q.recv1, nodes_ * fill, local_,
                       opt_.format, s);
      sum = work_area + q.partial;
      sum_type = DType::f32;
    }
    if (nodes_ > 1) {
      k.quantize(work_area + q.send2, sum, sum_type, fill, nodes_, opt_.format, s);
      exchange(opt_.inter, work_area + q.recv2, work_area + q.send2, q.m2);
      k.dequantize_sum(reinterpret_cast<float*>(work_area + q.result), work_area + q.recv2, fill, nodes_, opt_.format,
                       s);
      sum = work_area + q.result;
      sum_type = DType::f32;
    }
    for (const Piece& p : pieces) {
      k.scale_add(element_ptr(p.acc, opt_.acc_dtype, p.acc_offset), opt_.acc_dtype,
                  element_ptr(sum, sum_type, p.bucket_offset), sum_type, opt_.post_scale, p.length, s);
    }
    if (s != nullptr) {
      reduced->record(s);
      for (WorkPtr& w : works) queue_.track(what + " on rank " + std::to_string(comm_.rank()), std::move(w));
    }
  });
}

}  // namespace zero3::detail
