// The gradient reducer: packs units' gradients into buckets of reduce_bucket_size elements, reduces each
// bucket with one collective and adds the result into the owners' gradient accumulators.
//
// reduce_scatter (stage 2 and 3): a unit's gradient buffer is W slices of S elements; rank r's slice must
// land in rank r's accumulator. A bucket holds W chunks of C = reduce_bucket_size / W elements; chunk r
// collects the pieces of rank r's slices of the units in the bucket, so one reduce_scatter delivers every
// rank its pieces:
//
//   unit a grads  [a0 | a1]        bucket in:  [a0 b0' | a1 b1']   (W = 2, b' = the first part of b's slices)
//   unit b grads  [b0 | b1]        rank r out: [ar br']  -> acc_a[...] += ar, acc_b[...] += br'
//
// all_reduce (stage 0 and 1): buckets are contiguous pieces of the full accumulators, reduced in place.
//
// The copy into the bucket applies the pre-scale and converts to communication_data_type; adding into the
// accumulator applies the post-scale and converts to grad_accum_dtype. The communicator is the group the
// gradients are reduced over: every rank, or MiCS's shard group (reduce-scatter) and replica group (all-reduce).
// The buckets form a ring of reduce_buckets_in_flight(...) buckets: one fills on the training thread while the others
// are reduced by the communication queue; a bucket is waited for only when the ring comes back to it.
//
// With a reduce stream (cuda), a bucket is filled on the device's default stream (the compute stream), the
// reduce stream waits for it through an event, runs the collective and the adds into the accumulators, and
// the compute stream waits for that bucket's reduction through a second event only before filling the same
// bucket again: backward keeps computing while up to `buckets` reductions are in flight, and the host never
// waits for a reduction. join() makes the compute stream wait for everything launched so far (before the
// accumulators are read).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/block_quantize.hpp"
#include "zero/comm_queue.hpp"
#include "zero/device_buffer.hpp"
#include "zero/topology.hpp"
#include "zero3/comm.hpp"
#include "zero3/device.hpp"

namespace zero3::detail {

enum class ReduceMode { reduce_scatter, all_reduce };

struct ReducerOptions {
  ReduceMode mode = ReduceMode::reduce_scatter;
  DType comm_dtype = DType::f32;
  DType acc_dtype = DType::f32;
  int64_t bucket_numel = 0;      // reduce_bucket_size: elements per collective, all ranks' chunks together
  int64_t max_useful_numel = 0;  // the most one bucket can ever hold (all units together): caps the buffers
  float pre_scale = 1.0f;        // applied before the collective
  float post_scale = 1.0f;       // applied after it
  Stream stream = nullptr;       // the reduce stream (cuda); null: each collective is waited for in its task
  int64_t largest_unit_numel = 0;  // the most one unit puts through the reducer: sizes the ring (below)
  // Where the collectives' bytes are counted (traffic_plan.hpp), seen from this rank's place in the group.
  GroupLink link;
  CollectiveTraffic* traffic = nullptr;
  std::string group;  // the group the collectives run over, for messages ("the MiCS replica group of ranks 1, 3")
  // ZeRO++ qgZ (reduce_scatter only; docs/quantization.md): instead of the reduce_scatter, the bucket's chunks are
  // laid out by destination (rank (n, l) of N nodes of L ranks at slot l*N + n) and reduced in two all-to-alls of
  // `format` messages, over `intra` (the group's L ranks on this node) and then `inter` (its N ranks with this
  // local rank), each stage summing the dequantized messages in fp32 (Device::kernels().dequantize_sum); the fp32
  // result is added into the accumulator. A null communicator is a stage of one rank, skipped.
  bool quantized = false;
  QuantFormat format;
  Communicator* intra = nullptr;
  Communicator* inter = nullptr;
  GroupLink intra_link, inter_link;
  // all_reduce only: the bucket is filled from the accumulators inside its task, after the tasks queued before it
  // (on the reduce stream with one), instead of on the training thread when the pieces are added. For accumulators
  // that reductions queued earlier still write: MiCS's all-reduce across the replicas, started while the shard
  // group's reduce-scatters of the same slices are in flight. The bucket is then not waited for before it is
  // refilled either: its next task runs after its last one.
  bool fill_in_task = false;
};

// The ring's length: enough buckets to hold the largest unit's reduction while the next bucket fills,
// max(2, ceil(largest_numel / bucket_numel) + 1), with largest_numel the elements the largest unit puts through the
// reducer (its gradient) and bucket_numel a bucket's input. The buckets in flight then hold at most one unit's
// gradient (in the communication dtype: no more bytes than the backward scope's buffer of that unit, which backward
// holds anyway) plus the bucket being filled. The memory plan counts the same ring.
int reduce_buckets_in_flight(int64_t largest_numel, int64_t bucket_numel);

// qgZ's byte offsets in a bucket's output buffer (Reducer::Bucket::out) for chunks of `fill` elements, over `local`
// ranks on the node and then `nodes` nodes: [stage 1 send | stage 1 receive | partial sum (fp32, nodes*fill) | stage
// 2 send | stage 2 receive | result (fp32, fill)]. The memory plan counts `total` per bucket.
struct QgzLayout {
  int64_t m1, m2;  // bytes of one message of each stage
  size_t recv1, partial, send2, recv2, result, total;
};
QgzLayout qgz_layout(int64_t fill, int local, int nodes, const QuantFormat& format);

class Reducer {
 public:
  Reducer(ReducerOptions options, Device& device, MemoryCounters& counters, Communicator& comm, CommQueue& queue);

  // reduce_scatter: `grad` holds W * slice_numel elements (acc dtype); rank r's reduced slice is added
  // into `acc` (slice_numel elements). The caller may reuse `grad` as soon as this returns.
  // all_reduce: `acc` holds `count` elements, replaced by the (scaled) sum over ranks once reduced; `grad`
  // is ignored. `acc` must stay untouched until flush() and the queue drained.
  void add_scatter(const std::string& unit, const void* grad, int64_t slice_numel, void* acc);
  void add_all_reduce(const std::string& unit, void* acc, int64_t count);

  // Launches the partly filled bucket. The results are in the accumulators once the queue is drained (and,
  // with a reduce stream, for work queued on the compute stream after join()).
  void flush();
  // With a reduce stream: work queued on the compute stream from now on runs after every reduction launched
  // so far. No effect without one.
  void join();

  int64_t reduced_elements() const { return reduced_elements_; }
  // Collectives launched so far (each bucket's, flush() included), and whether a bucket is partly filled (its
  // pieces go with the next launch).
  int64_t launches() const { return launches_; }
  bool filling() const { return buckets_[active_].fill > 0; }
  // The ring's length: the most reductions in flight.
  int buckets() const { return static_cast<int>(buckets_.size()); }

 private:
  struct Piece {
    void* acc;
    int64_t acc_offset;
    int64_t length;
    int64_t bucket_offset;
  };
  struct Bucket {
    DeviceBuffer in;
    DeviceBuffer out;  // qgZ: the messages of both stages, the fp32 partial sum and the fp32 result
    std::vector<Piece> pieces;
    std::vector<std::string> units;
    int64_t fill = 0;
    CommQueue::Ticket ticket;
    std::unique_ptr<DeviceEvent> filled;   // recorded on the compute stream when the bucket is launched
    std::unique_ptr<DeviceEvent> reduced;  // recorded on the reduce stream when the bucket may be refilled
  };

  Bucket& current();
  void note_unit(Bucket& b, const std::string& unit);
  void launch();
  // The bucket slot of rank r's chunk: r, or with qgZ the by-destination order above.
  int64_t slot(int r) const { return opt_.quantized ? (r % local_) * nodes_ + r / local_ : r; }
  QgzLayout quant_layout(int64_t fill) const { return qgz_layout(fill, local_, nodes_, opt_.format); }
  void launch_quantized(Bucket& b, const std::string& what, std::vector<Piece> pieces, void* in, int64_t fill,
                        DeviceEvent* reduced);

  ReducerOptions opt_;
  Device& device_;
  MemoryCounters& counters_;
  Communicator& comm_;
  CommQueue& queue_;
  Stream compute_;  // the device's default stream
  std::unique_ptr<DeviceEvent> joined_;
  int world_;
  int64_t chunk_;  // C: elements per rank per bucket (all_reduce: elements per bucket)
  int local_ = 1, nodes_ = 1;  // qgZ: L and N
  std::vector<Bucket> buckets_;  // the ring (each allocated on first use)
  size_t active_ = 0;
  int64_t reduced_elements_ = 0;
  int64_t launches_ = 0;
};

}  // namespace zero3::detail
