// The engine's state and orchestration. engine.cpp holds the public forwarding layer and UnitScope; EngineImpl's
// code lives by concern: engine_impl.cpp (construction, guards, lookups), engine_layout.cpp (nodes and shard
// layout), engine_materialize.cpp (declaration, materialize), engine_scopes.cpp (entering and closing scopes),
// engine_gather.cpp (the gather path and the schedule it follows), engine_reduce.cpp (the reduction path),
// engine_agreement.cpp (the ranks' agreement on the schedule), engine_offload.cpp (offload and swap state),
// engine_step.cpp (step()), engine_eval.cpp (evaluation).
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "optim/loss_scaler.hpp"
#include "optim/lr_scheduler.hpp"
#include "optim/optimizer.hpp"
#include "zero/comm_queue.hpp"
#include "zero/device_buffer.hpp"
#include "zero/host_buffer.hpp"
#include "zero/optimizer_swap.hpp"
#include "zero/param_prefetcher.hpp"
#include "zero/param_swap.hpp"
#include "zero/process_groups.hpp"
#include "zero/reducer.hpp"
#include "zero/schedule.hpp"
#include "zero/tile_transfer.hpp"
#include "zero3/engine.hpp"

namespace zero3::detail {

// What the stage switches on. One code path reads these, never the stage number.
struct StagePolicy {
  int stage = 0;
  bool shard_optimizer = false;  // >= 1: master weights and Adam state are slices
  bool shard_grads = false;      // >= 2: gradients reduce-scattered every micro-step into slices
  bool shard_params = false;     // >= 3: full parameters exist only while gathered
};

enum class GatherState { released, in_flight, gathered };

struct ParamState {
  ParamInfo info;
  ParamInit init = ParamInit::zeros();
};

// MiCS: where a unit's all-reduce across the replicas stands in the window's last micro-step: left to step()'s
// declaration-order pass, its gradients final (EngineImpl::replica_ready_), or in the replica reducer's buckets.
enum class ReplicaReduce : uint8_t { at_boundary, ready, handed };

struct UnitState {
  UnitInfo info;
  std::vector<int64_t> param_offsets;  // per parameter of the unit
  std::vector<int64_t> param_numels;
  std::vector<int64_t> flat_shape;  // {numel}

  // This rank's optimizer range of the flat buffer: its slice, or everything at stage 0.
  int64_t owned_begin = 0;
  int64_t owned_len = 0;
  int64_t owned_valid = 0;  // of which real elements (the rest is padding)

  DeviceBuffer full;  // compute dtype, padded_numel: permanent at stage 0-2, gathered at stage 3
  // The optimizer's fp32 master of the owned range and Adam's moments: device buffers (the master may alias
  // `full`), or with optimizer offload on a GPU host buffers. The pointers say where they are; with NVMe
  // optimizer offload they are null (the state is in the swap file), except an fp32 master that is also the
  // parameter (cpu device).
  DeviceBuffer master_buf;
  HostBuffer host_master;
  float* master = nullptr;
  DeviceBuffer exp_avg_buf;
  DeviceBuffer exp_avg_sq_buf;
  HostBuffer host_exp_avg;
  HostBuffer host_exp_avg_sq;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  // Stage 3, unless the master is the parameter: this rank's compute-dtype slice, the all-gather's input. On
  // the device (compute_slice), or with parameter offload on a GPU in host memory (host_slice), copied into
  // the rank's place in `full` on the gather stream before an in-place all-gather.
  DeviceBuffer compute_slice;
  HostBuffer host_slice;
  std::unique_ptr<DeviceEvent> slice_read;  // gather stream: the last copy out of host_slice (made on first use)
  // hpZ (non-persistent units): this rank's chunk of the secondary partition, padded_numel / hpz elements of the
  // compute dtype (chunk rank % hpz of the full buffer). The first all-gather after an optimizer step reads the
  // primary partition over every rank and fills it; later gathers read the secondary partition within the group.
  // On the device (secondary), or with zero3.hpz_secondary_memory "host" on a GPU in pinned host memory
  // (host_secondary), copied into the rank's place in `full` before an in-place gather, as an offloaded slice is.
  DeviceBuffer secondary;
  HostBuffer host_secondary;
  bool secondary_valid = false;
  bool has_secondary() const { return secondary.allocated() || host_secondary.allocated(); }
  DeviceBuffer gather_scratch;  // MiCS's hierarchical gather: the slices of the inter-node stage, while in flight
  DeviceBuffer grad_acc;                    // grad_accum_dtype: padded_numel at stage 0-1, slice_numel at 2-3
  DeviceBuffer step_grads;  // reduce_once_per_step_: the full gradient over the step (grad_accum_dtype, padded_numel)
  ReplicaReduce replica = ReplicaReduce::at_boundary;  // MiCS: the all-reduce across the replicas, this window

  // Stage-3 schedule state.
  GatherState gather = GatherState::released;
  CommQueue::Ticket gather_ticket;
  std::unique_ptr<DeviceEvent> gather_ready;  // cuda: the gather's inputs are ready (compute stream)
  std::unique_ptr<DeviceEvent> gathered;      // cuda: the gather has landed (gather stream)
  int open_scopes = 0;
  bool prefetched_unused = false;  // gathered ahead by a prefetch and not entered since
  bool kept = false;               // closed, but kept gathered for its next use
};

class EngineImpl {
 public:
  EngineImpl(const Config& config, std::shared_ptr<Communicator> comm, Device& device,
             PipelineStageBinding stage = {});
  ~EngineImpl();

  // Declaration and materialization (engine_materialize.cpp).
  UnitId add_unit(const std::string& name);
  ParamId add_param(UnitId unit, const ParamSpec& spec);
  void materialize();

  // Scopes (engine_scopes.cpp).
  UnitScope enter(UnitId unit, Phase phase);
  void exit(UnitScope& scope);  // throws
  void exit_noexcept(UnitScope& scope) noexcept;
  TensorView param_view(UnitId unit, ParamId param) const;
  TensorView grad_view(UnitId unit, ParamId param, void* grads) const;
  TensorView flat_param_view(UnitId unit) const;
  TensorView flat_grad_view(UnitId unit, void* grads) const;

  // Evaluation (engine_eval.cpp).
  EvalMode begin_eval();
  void next_eval_batch();
  void end_eval(EvalMode& mode);  // throws; refuses while scopes are open
  void end_eval_noexcept(EvalMode& mode) noexcept;
  void leave_eval(EvalMode& mode);  // ends evaluation even with scopes open

  // Step (engine_step.cpp).
  StepResult step();
  void gather_master_params(UnitId unit, float* out);
  void refresh_params();
  void all_reduce_host(float* values, size_t count, ReduceOp op);

  // Guards every public call: rethrows a deferred or fatal error (engine_impl.cpp).
  void check_usable();
  void require_materialized(const char* what) const;
  void require_declaring(const char* what) const;
  UnitState& unit_state(UnitId unit, const char* what);
  const UnitState& unit_state(UnitId unit, const char* what) const;
  const ParamState& param_state(ParamId param, const char* what) const;
  ParamId find_param_in_unit(UnitId unit, std::string_view local_name) const;
  MemoryStats memory() const;

  // Public state (read by Engine's queries).
  Config config_;
  std::shared_ptr<Communicator> user_comm_;  // the communicator the engine was given (Engine::communicator())
  // What the engine issues its collectives on: user_comm_, or where it cannot compare calls across ranks itself
  // (nccl), a CollectiveGuard around it that does.
  std::shared_ptr<Communicator> comm_;
  Device& device_;
  int rank_ = 0;
  int world_ = 1;
  StagePolicy policy_;
  DType compute_dtype_ = DType::f32;
  DType acc_dtype_ = DType::f32;
  DType comm_dtype_ = DType::f32;
  int64_t gas_ = 1;  // micro-steps per optimizer step (1 for a pipeline stage: its micro-batches share one)
  // What the gradients are averaged over: gas_, or a pipeline stage's micro-batches.
  int64_t grad_divisor_ = 1;
  // A pipeline stage's pipeline group: the gradient statistics are summed over it (read_boundary).
  std::shared_ptr<Communicator> pipeline_group_;
  int stage_ranks_per_node_ = 0;  // PipelineStageBinding::ranks_per_node
  bool reduce_once_per_step_ = false;  // a stage-2/3 pipeline stage with zero3.pipeline_gradient_reduction "step"
  bool overlap_ = false;
  int64_t reduce_bucket_numel_ = 0;
  SchedulePolicy schedule_policy_;
  int64_t persistence_threshold_ = 0;

  // Where the ranks run and how the model state is laid out over them (topology.hpp). The process groups are
  // split from comm_ by materialize(), after the ranks agreed on the nodes.
  NodeLayout nodes_;
  std::string nodes_source_;       // where the ranks per node came from, for messages
  bool launch_consistent_ = true;  // the launcher's node and local rank of this rank are those of nodes_
  int launch_node_ = 0, launch_local_size_ = 1;  // what the launcher said (for the message of uneven nodes)
  ShardLayout layout_;
  ProcessGroups groups_;
  int partition_size() const { return layout_.shard_size; }

  std::vector<UnitState> units_;
  std::vector<ParamState> params_;
  std::unordered_map<std::string, int32_t> unit_by_name_;
  std::unordered_map<std::string, int32_t> param_by_name_;
  bool materialized_ = false;

  MemoryCounters counters_;
  int64_t gathered_bytes_ = 0;
  int64_t peak_gathered_bytes_ = 0;
  ScheduleStats stats_;
  int64_t ahead_numel_ = 0;  // elements gathered by prefetch and not yet entered

  std::unique_ptr<CommQueue> queue_;
  // cuda: gathers run on gather_stream_ and reductions on reduce_stream_, ordered against the compute stream
  // (the device's default stream, where the engine's kernels and the user's run) by events, never by the
  // host. Null on cpu, where collectives complete inside their queue tasks.
  Stream compute_ = nullptr;
  std::unique_ptr<DeviceStream> gather_stream_;
  std::unique_ptr<DeviceStream> reduce_stream_;
  // The schedule scopes follow: training's, or evaluation's while evaluating_ (begin_eval swaps the two).
  std::unique_ptr<Schedule> schedule_;
  std::unique_ptr<Schedule> eval_schedule_;
  bool evaluating_ = false;
  int64_t eval_batches_ = 0;  // evaluation batches ended by this engine object (the first one checks the order)
  std::unique_ptr<Reducer> reducer_;
  std::unique_ptr<Reducer> replica_reducer_;  // MiCS: the all-reduce across the replicas, once per window
  // MiCS: the units whose gradients the window's last backward has finished, in that order, each with the count of
  // shard-group buckets launched once its last pieces are on their way (Reducer::launches()). With overlap_comm each
  // goes to the all-reduce across the replicas as soon as that count is reached (replica_handed_ of them so far);
  // without it, step() hands them over in the same order.
  struct ReplicaReady {
    size_t unit;
    int64_t shard_launches;
  };
  std::vector<ReplicaReady> replica_ready_;
  size_t replica_handed_ = 0;
  std::unique_ptr<LrScheduler> lr_scheduler_;
  LossScaler loss_scaler_;
  AdamHyper adam_;
  std::unordered_map<void*, DeviceBuffer> open_grads_;  // backward scopes' gradient buffers
  int open_scopes_ = 0;

  // Schedule agreement: the scope events of the current micro-step (or evaluation batch) as event codes, and
  // their running hash, compared across ranks when it ends (verify_schedule).
  std::vector<int64_t> events_;
  uint64_t events_hash_ = 0;
  // The micro-steps step() does not compare at once (after the first, unless zero3.check_schedule_every_step):
  // their events, and a hash over them, compared once at the boundary together with the gradient statistics
  // (read_boundary), so that a micro-step within the window waits for nothing.
  bool defer_agreement_ = false;
  std::vector<std::vector<int64_t>> window_events_;
  std::vector<std::string> window_positions_;  // schedule_position() of each, for the message
  uint64_t window_hash_ = 0;
  int64_t window_event_count_ = 0;
  // nccl without its own comparison: the engine's guard (comm_), compared call by call while checking_order().
  class CollectiveGuard* guard_ = nullptr;
  bool window_backward_ = false;  // a backward scope was entered since the last accumulation boundary

  int64_t micro_steps_ = 0;
  BufferSource buffer_source_;  // the model's buffers (Engine::set_buffer_source), for checkpoints and exports
  int64_t global_steps_ = 0;
  int64_t skipped_steps_ = 0;
  int64_t applied_steps_ = 0;
  int64_t local_micro_steps_ = 0;  // micro-steps run by this engine object (a resumed run checks again)
  int64_t reduced_base_ = 0;       // reducer count at the last reset_schedule_stats()
  double blocked_base_ = 0;        // queue's blocked time at the last reset_schedule_stats()

  // Optimizer offload (cpu or nvme): the step runs cpu_adam_step on host memory. With nvme the master
  // weights and moments live in opt_swap_ and local_shard() stages a unit's slice in host memory
  // (staging_, by unit index) until the next step() or refresh_params().
  bool offload_optimizer_ = false;
  // Offload from a GPU. optimizer_on_host_: the master and moments live in host memory (offload_optimizer
  // cpu; nvme: in the swap file), the step brings the gradients down and the compute copies up tile by tile
  // (transfer_). slices_on_host_: stage 3 with offload_param, the compute-dtype slices live in host memory
  // (cpu; nvme: in the swap file, in host memory while used). host_device_ is the cpu device, whose kernels
  // run on host memory; host_counters_ count what the engine holds there.
  bool optimizer_on_host_ = false;
  bool slices_on_host_ = false;
  bool secondary_on_host_ = false;  // hpZ's secondary partition in pinned host memory (zero3.hpz_secondary_memory)
  std::unique_ptr<Device> host_device_;
  MemoryCounters host_counters_;
  std::unique_ptr<TileTransfer> transfer_;
  std::unique_ptr<DeviceEvent> host_ready_;  // compute stream: device-to-host writes of the step are done
  std::unique_ptr<OptimizerSwap> opt_swap_;
  struct ShardStaging {
    std::vector<float> master, exp_avg, exp_avg_sq;
  };
  std::unordered_map<size_t, ShardStaging> staging_;
  ShardView local_shard(UnitId unit);
  // Parameter offload to nvme (stage 3, 16-bit compute): a unit's slice is read into one of param_reads_'s
  // buffers, ahead along the schedule, and feeds the unit's all-gather from there (on a GPU through host_slice,
  // which exists from the read until the gather completes). The step and refresh_params() rebuild the slices
  // in compute_slice / host_slice and write them back.
  std::unique_ptr<ParamSwap> param_swap_;
  std::unique_ptr<ParamPrefetcher> param_reads_;  // destroyed before param_swap_
  bool slice_swapped(const UnitState& u) const;
  void new_compute_slice(UnitState& u);
  void store_compute_slice(UnitState& u);
  // The step rebuilds one unit's slice at a time: allocated (zeroed) before the unit's first tile, written back
  // to the swap before the next unit's (u nullptr: the last one), so host memory holds one slice, not all.
  void step_slice_for(UnitState* u);
  UnitState* step_slice_ = nullptr;
  void prefetch_param_reads();

  std::exception_ptr deferred_error_;  // from a scope destructor; thrown by the next call
  std::exception_ptr fatal_error_;     // a communication failure: thrown by every later call

 private:
  // engine_layout.cpp
  void detect_nodes();
  void agree_on_nodes();

  // engine_materialize.cpp
  void check_declarations_agree();
  void set_owned_range(UnitState& u);
  void allocate_and_init(UnitState& u);
  void init_owned_range(UnitState& u);
  void build_compute_copies(UnitState& u, const float* master = nullptr);  // null: u.master
  void write_compute_copy(void* dst, bool dst_on_host, DType dtype, const float* src, bool src_on_host, int64_t n);
  bool master_is_param(const UnitState& u) const;
  HostMemory host_memory(const OffloadConfig& off) const;

  // engine_offload.cpp (with slice_swapped, new_compute_slice, store_compute_slice, step_slice_for,
  // prefetch_param_reads and local_shard above)
  void spill_optimizer_state(UnitState& u);
  void before_host_slice_write(UnitState& u);
  const void* claim_param_slice(UnitState& u);

  // engine_agreement.cpp
  bool checking_order() const;
  void check_order(int64_t code, const std::string& doing);
  bool ranks_hold(const std::vector<float>& mine, const std::string& what);  // ranks_agree, timed in stats_
  void record_event(int64_t code);
  void reset_events();
  int64_t event_code(UnitId unit, Phase phase, bool closing) const;
  int64_t step_code() const;
  std::string describe_code(int64_t code) const;
  std::string schedule_position() const;
  // `where`: the micro-step the events are of (default: the current one, schedule_position()).
  std::string divergence_message(const std::vector<std::vector<int64_t>>& all, const std::string& where = {}) const;
  std::exception_ptr explain_mismatch(std::exception_ptr error) noexcept;
  void guard_calls(bool checking);
  void defer_schedule_check();

  // engine_gather.cpp
  // qwZ: the unit's gathers send int8 messages (non-persistent units, as DeepSpeed's coordinator fetches them).
  bool gathers_quantized(const UnitState& u) const { return config_.zero.quantized_weights && !u.info.persistent; }
  void issue_gather(UnitState& u, bool prefetch);
  void wait_gather(UnitState& u);
  void release_gather(UnitState& u);
  void gather_for_entry(UnitState& u);
  void release_or_keep(UnitState& u);
  void make_room_for(UnitState& u);
  void prefetch_after_entry();
  // Releases the micro-step's gathered units (persistent ones stay) and makes its order the trace. With
  // `keep_first` (within the accumulation window: the parameters do not change) the next micro-step's first
  // units that are still gathered from their last use stay, as gathered ahead (ScheduleStats::boundary_keeps).
  void end_micro_step_schedule(bool keep_first);
  // A closing unit with no further use in this micro-step stays gathered when it is among the next one's first
  // units and the next micro-step is in the same accumulation window.
  bool keep_for_next_micro_step(const UnitState& u) const;
  // The next micro-step's first units along the trace, gathered now (the rule after an entry, from the trace's
  // start): at the end of step(), after refresh_params() and after evaluation (ScheduleStats::boundary_prefetches).
  void prefetch_next_micro_step();

  // engine_reduce.cpp
  void make_reducers();
  // MiCS: whether the window's last backward has finished u's gradients (the scope just closed is its last in the
  // recorded schedule); then its all-reduce across the replicas (hand_replica_units) need not wait for step().
  bool replica_reduce_ready(const UnitState& u) const;
  // Hands the ready units whose shard-group buckets have all been launched (all of them: `all`) to the replica
  // reducer, in order.
  void hand_replica_units(bool all);
  void reopen_replica_unit(UnitState& u);  // u's backward scope opens again in the last micro-step
  void add_scope_grads(UnitState& u, const void* grads);  // a closing backward scope's gradient buffer
  void reduce_at_boundary();
  void zero_grads();
  const void* owned_grads(const UnitState& u) const;
  void* owned_grads(UnitState& u);

  // engine_step.cpp
  // The boundary's values, reduced across ranks on the device and read by the host at once: the deferred schedule
  // agreement of the window, and with `stats` the Inf/NaN count and squared norm (stats[0], stats[1]).
  struct BoundaryValues {
    float stats[2] = {0.0f, 0.0f};
  };
  BoundaryValues read_boundary(bool stats);
  // Collective on `comm`: issued through the queue; on a device with streams its Work is tracked (waited for at the
  // next drain), on cpu waited for in its task.
  void issue_collective(const std::string& what, const std::function<WorkPtr()>& fn);
  void publish_params(UnitState& u);
  void run_optimizer(const AdamStepConsts& consts, float grad_factor);
  void run_host_optimizer(const AdamStepConsts& consts, float grad_factor);
  void wait_for_device_writes();

 public:
  // Runs a collective through the queue and waits, wrapping errors with `what` (engine_step.cpp).
  void run_collective(const std::string& what, const std::function<void()>& fn);
  // Collective: compares the hash of this micro-step's (or evaluation batch's) scope events across ranks; a
  // difference is a CommError naming the first differing event and the ranks (engine_agreement.cpp).
  void verify_schedule(const std::string& doing);
  [[noreturn]] void fail(std::exception_ptr error);  // engine_impl.cpp
};

}  // namespace zero3::detail
