// The gather path (stage 3): a unit's all-gather (plain, MiCS's hierarchical gather, hpZ's secondary partition,
// qwZ's int8 messages), the wait for it and its release, the live cap's evictions, and the schedule the scopes
// follow: prefetch after each entry, what stays gathered when a unit closes, and the micro-step boundary.
#include <algorithm>

#include "device/device_kernels.hpp"
#include "plan/gather_simulation.hpp"
#include "zero/engine_impl.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {

// One unit's all-gather: over the partition's group (every rank, or the MiCS shard group), in two stages for MiCS's
// hierarchical gather (between the nodes into gather_scratch, then within each node), or under hpZ from the
// secondary partition within the hpZ group once the first gather after the optimizer step has filled it.
void EngineImpl::issue_gather(UnitState& u, bool prefetch) {
  const DType ct = u.info.dtype;
  const size_t es = dtype_size(ct);
  const int64_t S = u.info.slice_numel, P = u.info.padded_numel;
  const bool from_secondary = u.has_secondary() && u.secondary_valid;
  const void* swapped_slice = !from_secondary && slice_swapped(u) ? claim_param_slice(u) : nullptr;
  u.full = DeviceBuffer(device_, counters_, MemoryCategory::params, P * es);
  gathered_bytes_ += static_cast<int64_t>(u.full.bytes());
  peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes_);
  if (!u.info.persistent) {
    stats_.live_numel += u.info.numel;
    stats_.peak_live_numel = std::max(stats_.peak_live_numel, stats_.live_numel);
  } else {
    stats_.persistent_numel += u.info.numel;
  }
  stats_.all_gathers++;
  stats_.gathered_elements += P;
  stats_.gather_order.push_back(u.info.id);
  if (prefetch) {
    stats_.prefetches++;
    u.prefetched_unused = true;
    ahead_numel_ += u.info.numel;
  }
  const void* in = master_is_param(u) ? static_cast<const void*>(u.master) : u.compute_slice.data();
  if (swapped_slice != nullptr) in = swapped_slice;
  void* out = u.full.data();
  const char* source = from_secondary ? ", hpZ secondary partition" : layout_.hierarchical ? ", hierarchical" : "";
  const std::string over = from_secondary         ? groups_.hpz.label
                           : layout_.hierarchical ? groups_.shard_inter_node.label + ", then " +
                                                        groups_.shard_intra_node.label
                                                  : groups_.shard.label;
  const int pieces = from_secondary ? layout_.hpz_size : partition_size();
  const bool quantized = gathers_quantized(u) && pieces > 1;
  std::string what = log::concat("all_gather of unit '", u.info.name, "' (", P, " elements, ", dtype_name(ct),
                                 quantized ? " as int8" : "", source, prefetch ? ", prefetch" : "", ") over ", over);
  int rank = rank_;
  // qwZ (non-persistent units, as DeepSpeed's coordinator fetches them): every rank's piece travels as an int8
  // message of `words` fp32 words (docs/quantization.md). This rank's piece is quantized into `send`, the
  // collectives below move messages instead of elements into `recv`, and `recv` is dequantized into `full` in
  // rank order; the hpZ secondary chunk is then copied from the dequantized weights. The scratch (messages, and
  // MiCS's hierarchical inter-node stage) is allocated on the compute stream before the gather stream is ordered
  // after it.
  const QuantFormat fmt{8, config_.zero3.qwz_block_size};
  const int64_t piece = from_secondary ? P / layout_.hpz_size : S;  // elements per rank
  const int64_t words = quantized ? quant_message_bytes(piece, fmt) / 4 : piece;
  const DType wire = quantized ? DType::f32 : ct;
  const size_t ws = dtype_size(wire);
  const int nodes = layout_.hierarchical ? static_cast<int>(groups_.shard_inter_node.ranks.size()) : 0;
  const int64_t message_words = quantized ? words * (1 + pieces) : 0;
  if (quantized || layout_.hierarchical) {
    u.gather_scratch =
        DeviceBuffer(device_, counters_, MemoryCategory::buffers,
                     static_cast<size_t>(gather_scratch_bytes(piece, pieces, nodes, quantized, fmt,
                                                              static_cast<int64_t>(es))));
  }
  Stream s = nullptr;
  DeviceEvent* gathered = nullptr;
  CommQueue* queue = queue_.get();
  if (gather_stream_) {
    // The gather stream starts after the compute stream's work so far: the optimizer's writes of the input
    // slice, and the last use of the memory `full` recycles.
    if (!u.gather_ready) {
      u.gather_ready = device_.make_event();
      u.gathered = device_.make_event();
    }
    s = gather_stream_->get();
    u.gather_ready->record(compute_);
    u.gather_ready->wait_on(s);
    gathered = u.gathered.get();
    if (slices_on_host_ && !from_secondary) {
      // Parameter offload: the slice comes up into the rank's own place in `full`; the all-gather runs in place.
      void* own = element_ptr(out, ct, static_cast<int64_t>(layout_.shard_rank(rank_)) * S);
      const void* host = swapped_slice != nullptr ? swapped_slice : u.host_slice.data();
      device_.copy(own, host, static_cast<size_t>(S) * es, s);
      if (!u.slice_read) u.slice_read = device_.make_event();
      u.slice_read->record(s);
      in = own;
    }
  }
  const void* secondary_in = u.secondary.data();
  if (from_secondary && u.host_secondary.allocated()) {
    // hpZ's secondary partition in host memory: this rank's chunk comes up into its place in `full` on the gather
    // stream (where gathers read device memory), and the gather within the group runs in place.
    const int64_t chunk = P / layout_.hpz_size;
    void* own = element_ptr(out, ct, (rank_ % layout_.hpz_size) * chunk);
    device_.copy(own, u.host_secondary.data(), static_cast<size_t>(chunk) * es, s);
    secondary_in = own;
  }

  const void* piece_in = from_secondary ? secondary_in : in;
  const void* send = piece_in;
  void* recv = out;
  void* staged = nullptr;  // MiCS's hierarchical gather: the inter-node stage's pieces
  if (quantized || layout_.hierarchical) {
    if (quantized) {
      send = u.gather_scratch.data();
      recv = element_ptr(u.gather_scratch.data(), wire, words);
    }
    staged = element_ptr(u.gather_scratch.data(), wire, message_words);
  }

  // The collectives, in order, and their traffic.
  struct Part {
    Communicator* comm;
    void* out;
    const void* in;
    int64_t count;
  };
  std::vector<Part> parts;
  auto add = [&](const ProcessGroup& g, void* o, const void* i, int64_t count) {
    parts.push_back({g.comm.get(), o, i, count});
    count_collective(stats_.gather_traffic, g.link, CollectiveKind::all_gather, count, static_cast<int64_t>(ws));
  };
  struct Copy {
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
  } fill;
  if (from_secondary) {
    add(groups_.hpz, recv, send, words);
  } else if (layout_.hierarchical) {
    // Between the nodes: the pieces of the shard group's ranks with this local rank (shard ranks i, L+i, 2L+i, ...);
    // then node chunk j of the result gathers, within each node, piece j*L+i from local rank i.
    const int per_node = layout_.nodes.ranks_per_node;
    add(groups_.shard_inter_node, staged, send, words);
    for (int j = 0; j < nodes; ++j) {
      add(groups_.shard_intra_node, element_ptr(recv, wire, static_cast<int64_t>(j) * per_node * words),
          element_ptr(staged, wire, j * words), words);
    }
  } else {
    add(groups_.shard, recv, send, words);
    if (u.has_secondary()) {
      // hpZ: keep this rank's chunk of the secondary partition for the gathers until the next optimizer step.
      const int64_t chunk = P / layout_.hpz_size;
      void* keep = u.host_secondary.allocated() ? u.host_secondary.data() : u.secondary.data();
      fill = {keep, element_ptr(out, ct, (rank_ % layout_.hpz_size) * chunk),
              static_cast<size_t>(chunk) * es};
      u.secondary_valid = true;
    }
  }
  struct Quantized {
    bool on = false;
    QuantFormat fmt;
    void* send = nullptr;
    const void* src = nullptr;
    const void* recv = nullptr;
    int64_t piece = 0;
    int pieces = 0;
  } q;
  if (quantized) q = {true, fmt, const_cast<void*>(send), piece_in, recv, piece, pieces};
  Device* device = &device_;
  u.gather_ticket =
      queue_->submit(what, [parts = std::move(parts), fill, q, device, ct, wire, out, what, rank, s, gathered, queue] {
        try {
          if (q.on) kernels_of(*device).quantize(q.send, q.src, ct, q.piece, 1, q.fmt, s);
          for (const Part& p : parts) {
            WorkPtr work = p.comm->all_gather_into(p.out, p.in, static_cast<size_t>(p.count), wire, s);
            if (s == nullptr) {
              work->wait();
            } else {
              queue->track(log::concat(what, " on rank ", rank), std::move(work));
            }
          }
          if (q.on) kernels_of(*device).dequantize(out, ct, q.recv, q.piece, q.pieces, q.fmt, s);
          if (fill.bytes > 0) device->copy(fill.dst, fill.src, fill.bytes, s);
          if (s != nullptr) gathered->record(s);
        } catch (const CommError&) {
          rethrow_comm_error(log::concat(what, " on rank ", rank, " failed: "));
        }
      });
  u.gather = GatherState::in_flight;
}

void EngineImpl::wait_gather(UnitState& u) {
  if (u.gather != GatherState::in_flight) return;
  double before = queue_->blocked_seconds();
  queue_->wait(u.gather_ticket);
  stats_.gather_wait_seconds += queue_->blocked_seconds() - before;
  u.gather_ticket = nullptr;
  // cuda: the compute stream (not the host) waits for the gather to land.
  if (u.gathered) u.gathered->wait_on(compute_);
  u.gather = GatherState::gathered;
  u.gather_scratch.reset();  // freed after the compute stream, which now waits for the gather
  if (slice_swapped(u)) {
    if (slices_on_host_) {
      u.host_slice.reset_after(*gather_stream_);  // once its copy up has run: the host does not wait
    } else if (param_reads_->claimed(static_cast<size_t>(u.info.id.index))) {
      param_reads_->release(static_cast<size_t>(u.info.id.index));
    }
  }
}

void EngineImpl::release_gather(UnitState& u) {
  if (u.gather == GatherState::released) return;
  if (u.gather == GatherState::in_flight) wait_gather(u);
  gathered_bytes_ -= static_cast<int64_t>(u.full.bytes());
  u.full.reset();
  if (u.info.persistent) {
    stats_.persistent_numel -= u.info.numel;
  } else {
    stats_.live_numel -= u.info.numel;
  }
  if (u.prefetched_unused) ahead_numel_ -= u.info.numel;
  u.prefetched_unused = false;
  u.kept = false;
  u.gather = GatherState::released;
  stats_.releases++;
}

// Entering a unit at stage 3: gathered now unless gathered ahead or kept, the units after it prefetched along the
// trace, and the compute stream (cpu: the host) waits for it.
void EngineImpl::gather_for_entry(UnitState& u) {
  if (u.prefetched_unused) {
    stats_.prefetch_hits++;
    u.prefetched_unused = false;
    ahead_numel_ -= u.info.numel;
  }
  u.kept = false;
  if (u.gather == GatherState::released) {
    make_room_for(u);
    issue_gather(u, false);
  }
  prefetch_after_entry();
  wait_gather(u);
}

// The last open scope of a non-persistent unit closed: kept for its next use within the micro-step (within the
// live cap), kept for the next micro-step's start, or released.
void EngineImpl::release_or_keep(UnitState& u) {
  if (schedule_->keep_for_reuse(u.info.id) && stats_.live_numel <= schedule_policy_.max_live_numel) {
    u.kept = true;
    stats_.reuse_keeps++;
  } else if (keep_for_next_micro_step(u)) {
    u.kept = true;  // counted as a boundary keep if it stays past the micro-step's end
  } else {
    release_gather(u);
    prefetch_param_reads();  // its next use may be among the next units to read
  }
}

void EngineImpl::make_room_for(UnitState& u) {
  // A unit being entered is always gathered; to respect stage3_max_live_parameters, units kept only for
  // reuse go first, the one used last first.
  const int64_t cap = schedule_policy_.max_live_numel;
  while (stats_.live_numel + u.info.numel > cap) {
    UnitState* victim = nullptr;
    int64_t victim_next = 0;
    for (UnitState& o : units_) {
      if (!o.kept || o.open_scopes > 0) continue;
      int64_t next = schedule_->next_use(o.info.id);
      int64_t rank = next < 0 ? INT64_MAX : next;
      if (!victim || rank > victim_next) {
        victim = &o;
        victim_next = rank;
      }
    }
    if (!victim) return;
    release_gather(*victim);
    stats_.evictions++;
  }
}

void EngineImpl::prefetch_after_entry() {
  auto plan = schedule_->plan_prefetch(ahead_numel_, stats_.live_numel, [this](UnitId id) {
    return units_[static_cast<size_t>(id.index)].gather == GatherState::released;
  });
  for (UnitId id : plan) issue_gather(units_[static_cast<size_t>(id.index)], true);
}

void EngineImpl::end_micro_step_schedule(bool keep_first) {
  bool changed = schedule_->finish_micro_step();
  if (changed && micro_steps_ > 0) {
    log::debug("engine: the order of units changed in micro-step ", micro_steps_, "; following the new order");
  }
  if (!policy_.shard_params) return;
  // The first units of the order just finished (it is the trace now): a unit kept from its last use stays only
  // when it is among them, so what stays is what the boundary prefetch would have gathered.
  std::vector<bool> first(units_.size(), false);
  if (keep_first) {
    for (UnitId id : schedule_->plan_start()) first[static_cast<size_t>(id.index)] = true;
  }
  int64_t kept_numel = 0;
  for (size_t i = 0; i < units_.size(); ++i) {
    UnitState& u = units_[i];
    if (u.info.persistent) continue;
    if (first[i] && u.kept) {
      u.kept = false;
      u.prefetched_unused = true;  // as if gathered ahead: the next micro-step's entry counts a hit
      kept_numel += u.info.numel;
      stats_.boundary_keeps++;
    } else {
      release_gather(u);
    }
  }
  ahead_numel_ = kept_numel;
}

bool EngineImpl::keep_for_next_micro_step(const UnitState& u) const {
  if (evaluating_ || (micro_steps_ + 1) % gas_ == 0) return false;  // the optimizer step comes first
  if (!schedule_->following() || schedule_->next_use(u.info.id) >= 0) return false;
  for (UnitId id : schedule_->plan_start()) {
    if (id == u.info.id) return true;
  }
  return false;
}

// Every rank issues the same gathers here: the trace is the order the ranks agreed on (or will compare at the
// boundary, as every prefetch of the window), and the guard compares them as it will the next micro-step's calls.
void EngineImpl::prefetch_next_micro_step() {
  if (!policy_.shard_params || evaluating_) return;
  guard_calls(checking_order());
  const int64_t before = stats_.prefetches;
  prefetch_after_entry();
  stats_.boundary_prefetches += stats_.prefetches - before;
}

}  // namespace zero3::detail
