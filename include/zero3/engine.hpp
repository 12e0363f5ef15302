// The ZeRO engine: partitioned parameters, gradients and optimizer state for C++ training code.
//
// A training program joins the job and makes its engine in one call (initialize.hpp), declares its parameters
// in units, materializes them, and then, for every micro-batch, opens a scope around the code that uses each
// unit. The whole program, started once per rank (zero3 launch -n 4 -- ./train, torchrun --no-python, mpirun,
// srun: docs/launch.md):
//
//   #include <zero3/zero3.hpp>
//
//   int main() {
//     zero3::InitOptions opts;
//     opts.resolve.hidden_size = 64;  // fills the config's "auto" sizes (and micro_batch, lr, ... when "auto")
//     zero3::Session s = zero3::initialize("ds_config.json", opts);  // communicator, device, resolved config
//     zero3::Engine& engine = *s.engine;
//     zero3::UnitId fc = engine.add_unit("fc", {{"w", {64, 32}, zero3::ParamInit::normal(0.02)},
//                                               {"b", {64}, zero3::ParamInit::zeros()}});
//     engine.materialize();
//     for (int step = 0; step < 100; ++step) {
//       float loss = 0;
//       for (int64_t k = 0; k < engine.gradient_accumulation_steps(); ++k) {  // one micro-batch each
//         { auto sc = engine.forward_scope(fc);                 // the unit's full parameters, gathered
//           loss += forward(sc.param("w"), sc.param("b"), ...); }  // exit: released (stage 3) unless kept
//         { auto sc = engine.backward_scope(fc);                // parameters again, plus a zeroed gradient buffer
//           backward(sc.param("w"), sc.grad("w"), ...); }       // exit: gradients go to the reducer
//         zero3::StepResult r = engine.step();                  // optimizer step at accumulation boundaries
//       }
//       engine.all_reduce_host(&loss, 1, zero3::ReduceOp::avg);  // the loss over every rank's micro-batches
//     }
//   }
//
// Without initialize(): connect() a communicator (comm.hpp), make_device(), load_config() and resolve() it with
// ResolveInputs::world_size = comm->size(), then Engine(config, comm, *device). The Engine refuses a config that
// resolve() has not seen.
//
// Stages (zero_optimization.stage) are policies of one code path:
//   0  parameters, gradients and optimizer state replicated; gradients all-reduced at the boundary.
//   1  + fp32 master weights and Adam state sharded: each rank steps its slice, then parameters are
//        all-gathered.
//   2  + gradients reduce-scattered (every micro-step) into the owning rank's slice.
//   3  + parameters sharded: a unit's full parameters exist only while gathered (scope, prefetch, or
//        persistence), all-gathered straight into the unit's flat buffer.
//
// Layouts for slow links between nodes (stage 3; docs/architecture.md, "Process groups and layouts"): ZeRO++ hpZ
// (zero_hpz_partition_size: gathers after the first of each optimizer step read a secondary partition within a group
// of ranks) and MiCS (mics_shard_size: the state sharded within a shard group, replicated across the groups, whose
// gradients are all-reduced once per optimizer step; a group of one node is FSDP2's HSDP). materialize() splits the
// communicator into the groups; the nodes come from the launcher's variables (docs/launch.md).
//
// Gradients. The gradient a backward scope exposes is the gradient of this rank's micro-batch loss (as
// a loss.backward() in PyTorch would produce it; with fp16, of the loss multiplied by loss_scale()).
// Every backward scope starts from zeros; what the code writes there is added to the unit's gradient when
// the scope closes, so a unit may be entered any number of times per micro-step (tied weights). The
// engine averages over micro-steps and ranks, as DeepSpeed's engine.backward() + step() do.
//
// Schedule (stage 3). The first micro-step records the order in which units are entered; later micro-steps
// prefetch along it (the next unit, and more within stage3_prefetch_bucket_size elements ahead; 0 turns
// prefetch off; never beyond stage3_max_live_parameters gathered elements), keep units of at most
// stage3_param_persistence_threshold elements gathered for good, and keep a unit whose next use comes within
// stage3_max_reuse_distance elements. With overlap_comm the gathers and reduce-scatters run on a communication thread
// while the training thread computes.
//
// Ranks must open and close the same unit scopes in the same order. What is checked (docs/architecture.md,
// "Threads, ordering and errors"): every collective is compared across ranks before it moves data (Gloo does it;
// for nccl, which cannot, the engine does), so ranks whose orders differ never hand the library calls of
// different sizes; a hash of each micro-step's scope events is compared across ranks before the optimizer applies
// anything (the first micro-step's at its step(), the window's others together at the accumulation boundary;
// EvalMode::next_batch() compares each batch), so gradients reduced in another order are never applied; and during the first micro-step (every micro-step with zero3.check_schedule_every_step) each scope
// entry is compared before anything is issued for it. A difference is a CommError on every rank naming the
// micro-step, the first differing scope event and the ranks.
//
// Offload (docs/architecture.md, "Offload"). On the cpu device: offload_optimizer cpu steps with the SIMD CPU
// Adam; offload_optimizer nvme keeps the fp32 master and Adam moments in a per-rank swap file under nvme_path
// (checked and preallocated by materialize(), removed by the destructor) and streams it at every step;
// offload_param cpu is a no-op; offload_param nvme (stage 3, 16-bit compute) reads each unit's slice from its
// swap file before the unit's all-gather. Results are bit-identical to the same run without offload.
// On a cuda device (ZeRO-Offload / ZeRO-Infinity): offload_optimizer cpu keeps the fp32 master and moments in
// host memory (page-locked with pin_memory), nvme in the swap file; the step copies each sub_group_size tile
// of the reduced gradients to the host, runs the CPU Adam there and copies the tile's compute-dtype
// parameters back, the copies overlapping the Adam of the neighbouring tiles. offload_param cpu (stage 3)
// keeps the rank's compute-dtype slices in host memory (nvme: in a swap file) and copies a slice to the
// device just before its unit's all-gather. Gradients, their statistics and gathered units stay on the
// device; MemoryStats shows the moved bytes under host_*.
//
// The program's collectives. The engine issues its collectives on its communicator in an order every rank
// shares; with overlap_comm (on by default at stage 3) a communication thread of the engine issues them while the
// training thread computes, and a Communicator takes operations from one thread at a time (comm.hpp). So while
// the engine exists, the program must not issue collectives on that communicator itself: they could run at the
// same time as the engine's thread, or be matched against a different collective on another rank. For values
// such as the loss use all_reduce_host(), which goes through the engine's queue. For other collectives, split()
// the communicator before creating the engine (collective) and use the split one: it has connections and an
// order of its own (with nccl, as for any two NCCL communicators on one GPU, issue its collectives at the same
// point of the program on every rank).
//
// Threads: an Engine and its scopes are used from one thread. Collective calls (materialize, scopes at
// stage 3 or in the first micro-step, step, EvalMode::next_batch and end, gather_master_params, refresh_params,
// all_reduce_host) must be made by every rank in the same order. Errors: every failure is a zero3::Error naming the
// unit, parameter, rank or collective. An argument error is thrown before anything happens. Any other error raised
// once a collective call is under way (a communication error, device memory exhausted, a swap file that cannot be
// read or written) leaves the engine failed: the ranks may no longer be at the same collective and the state may be
// half updated, so every later call rethrows the first such error. Resume from a checkpoint in a new Engine.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zero3/comm.hpp"
#include "zero3/config.hpp"
#include "zero3/device.hpp"
#include "zero3/safetensors.hpp"
#include "zero3/tensor_view.hpp"
#include "zero3/traffic_plan.hpp"
#include "zero3/unit.hpp"

namespace zero3 {

class Engine;
namespace detail {
class EngineImpl;
}

enum class Phase : uint8_t { forward, backward };

// The outcome of one step() call.
struct StepResult {
  bool boundary = false;    // this call ended a gradient accumulation window (an optimizer step was due)
  bool applied = false;     // the optimizer updated the weights
  bool overflow = false;    // skipped: some gradient on some rank was Inf or NaN (every rank skips)
  double grad_norm = 0.0;   // global L2 norm of the averaged, unscaled gradients before clipping (boundary only)
  double clip_coef = 1.0;   // factor the gradients were multiplied by for gradient_clipping (1: not clipped)
  double lr = 0.0;          // learning rate of this optimizer step (boundary only)
  double loss_scale = 1.0;  // loss scale for the next micro-step (fp16; 1 otherwise)
  int64_t global_step = 0;  // optimizer steps so far, skipped ones included (DeepSpeed's global_steps)
  int64_t micro_step = 0;   // micro-steps so far
};

// Bytes this rank holds on the engine's device, by category (the categories of memory_plan.hpp), and the host
// memory it holds for offload from a GPU (on the cpu device everything is counted as device memory).
struct MemoryStats {
  int64_t params = 0;           // compute-dtype parameters: full copies, slices, gathered and persistent units
  int64_t master = 0;           // fp32 master weights kept beside 16-bit parameters
  int64_t grads = 0;            // gradient accumulators and open backward scopes' buffers
  int64_t optimizer_state = 0;  // Adam's exp_avg and exp_avg_sq
  int64_t buffers = 0;          // communication buckets and staging
  int64_t peak_buffers = 0;     // the most `buffers` seen (gathers in flight hold scratch: qwZ, hierarchical MiCS)
  int64_t gathered = 0;         // part of `params`: stage-3 full buffers now gathered or in flight
  int64_t peak_gathered = 0;
  int64_t peak_total = 0;  // the largest total seen
  // Host memory (pinned or pageable) of offload from a GPU: parameter slices, master weights, Adam moments,
  // and the optimizer step's staging. Not part of total().
  int64_t host_params = 0;
  int64_t host_master = 0;
  int64_t host_optimizer_state = 0;
  int64_t host_buffers = 0;
  int64_t peak_host_total = 0;  // the largest host_total() seen
  int64_t total() const { return params + master + grads + optimizer_state + buffers; }
  int64_t host_total() const { return host_params + host_master + host_optimizer_state + host_buffers; }
};

// What the schedule did since the last reset_schedule_stats() (stage 3 gathers; reductions at every stage).
struct ScheduleStats {
  int64_t all_gathers = 0;           // unit all-gathers issued, prefetches included
  int64_t prefetches = 0;            // all-gathers issued ahead of use
  int64_t boundary_prefetches = 0;   // of the prefetches, those issued for the next micro-step's first units
                                     // (at the end of step(), after refresh_params(), after evaluation)
  int64_t boundary_keeps = 0;        // the next micro-step's first units kept gathered from their last use
                                     // (within the accumulation window) instead of released and gathered again
  int64_t prefetch_hits = 0;         // scope entries that found their unit gathered or in flight by a prefetch
                                     // (boundary keeps included)
  int64_t releases = 0;              // full buffers freed
  int64_t reuse_keeps = 0;           // scope exits that kept the unit for stage3_max_reuse_distance
  int64_t evictions = 0;             // kept units freed early to stay within stage3_max_live_parameters
  int64_t live_numel = 0;            // elements of non-persistent units gathered or in flight now
  int64_t peak_live_numel = 0;       // the most there were
  int64_t persistent_numel = 0;      // elements of units that stay gathered
  int64_t gathered_elements = 0;     // elements received by all-gathers (full unit sizes)
  int64_t reduced_elements = 0;      // gradient elements entering reductions (full unit sizes)
  double gather_wait_seconds = 0;    // the training thread blocked on all-gathers at scope entry
  double comm_wait_seconds = 0;      // blocked on any collective (gathers, reduce buckets, step, checks)
  int64_t agreement_checks = 0;      // comparisons of the ranks' scope events (one per micro-step, plus per entry)
  double agreement_seconds = 0;      // the training thread in them (part of comm_wait_seconds)
  std::vector<UnitId> gather_order;  // units in the order their all-gathers were issued
  // NVMe parameter offload: slices read from the swap file for all-gathers, how many of those reads had been
  // started ahead along the schedule (before the all-gather was issued), and the time the training thread
  // blocked on them.
  int64_t param_reads = 0;
  int64_t param_reads_ahead = 0;
  double param_read_wait_seconds = 0;
  // What this rank sent, split by the node of the receiving rank (traffic_plan.hpp's ring model): the parameter
  // all-gathers of training (scopes, persistent units, stage 1-2's refresh), and the gradient reductions
  // (reduce-scatters, all-reduces, MiCS's all-reduce across replicas). plan_traffic() predicts them per step.
  CollectiveTraffic gather_traffic;
  CollectiveTraffic reduce_traffic;
};

// Optimizer offload to nvme: what the swap of the fp32 master weights and Adam moments did since the last
// reset_offload_stats() (all zero without it).
struct OffloadStats {
  uint64_t bytes_read = 0;     // from the swap file, padded to 4096 per tile
  uint64_t bytes_written = 0;  // to the swap file
  double io_wait_seconds = 0;  // the training thread blocked on swap I/O
  double compute_seconds = 0;  // the training thread in the per-tile Adam step
};

// One entry of the recorded order.
struct ScheduleEvent {
  UnitId unit;
  Phase phase = Phase::forward;
  friend bool operator==(const ScheduleEvent&, const ScheduleEvent&) = default;
};

// This rank's fp32 master slice of a unit and its Adam state, in device memory (host memory with optimizer
// offload on a cuda device; the Device's copy() reaches both). The range is
// [begin, begin + length) of the unit's flat buffer: the rank's slice at stage >= 1, the whole padded
// buffer at stage 0. After writing into it (loading a checkpoint), call refresh_params().
struct ShardView {
  int64_t begin = 0;
  int64_t length = 0;
  float* master = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
};

// Counters a checkpoint saves to resume exactly.
struct TrainingState {
  int64_t micro_steps = 0;
  int64_t global_steps = 0;
  int64_t skipped_steps = 0;
  int64_t applied_steps = 0;  // Adam's step count; the scheduler's last_batch_iteration is this - 1
  double loss_scale = 1.0;
  int64_t scaler_iter = 0;
  int64_t scaler_last_overflow_iter = -1;
  int64_t scaler_hysteresis = 1;
};

// A tensor of the model that is not a parameter and is not trained (a BatchNorm layer's running mean): whole on
// every rank, in host memory the program owns. Checkpoints save rank 0's values and load them into every rank (any
// world size); save_16bit_model and consolidate_checkpoint write them beside the parameters under `name`, in their
// own element type.
struct ModelBuffer {
  std::string name;  // unique among the buffers and the exported parameter names
  safetensors::Dtype dtype = safetensors::Dtype::f32;
  std::vector<int64_t> shape;  // {} for a scalar
  void* data = nullptr;        // contiguous host memory of shape's elements: read by saves, written by loads
};
// Lists the model's buffers as they are now (called by each save, load and export).
using BufferSource = std::function<std::vector<ModelBuffer>()>;

// A gather scope: while it is open, the unit's full parameters are available (and, for a backward scope,
// its gradient buffer). Move-only. Closing it (destructor or close()) releases the unit according to the
// schedule and, for a backward scope, hands the gradients to the reducer. Views from a scope are valid
// until it closes.
class UnitScope {
 public:
  UnitScope() = default;
  UnitScope(UnitScope&& other) noexcept;
  UnitScope& operator=(UnitScope&& other) noexcept;
  UnitScope(const UnitScope&) = delete;
  UnitScope& operator=(const UnitScope&) = delete;
  // Closes the scope. Never throws: an error is logged and rethrown by the engine's next call.
  ~UnitScope();

  bool active() const { return impl_ != nullptr; }
  UnitId unit() const { return unit_; }
  Phase phase() const { return phase_; }

  // A parameter of this unit, in the unit's compute dtype. Throws InvalidArgument for a parameter of
  // another unit or an unknown name.
  TensorView param(ParamId param) const;
  TensorView param(std::string_view local_name) const;
  // Its gradient buffer, in data_types.grad_accum_dtype (fp32 unless configured). Backward scopes only.
  TensorView grad(ParamId param) const;
  TensorView grad(std::string_view local_name) const;
  // The whole unit as one flat tensor of `numel` elements (parameters back to back, in declaration order).
  TensorView flat_params() const;
  TensorView flat_grads() const;

  // Closes the scope now and throws what closing raised (a communication error, a divergence).
  void close();

 private:
  friend class detail::EngineImpl;
  UnitScope(detail::EngineImpl* impl, UnitId unit, Phase phase, void* grads)
      : impl_(impl), unit_(unit), phase_(phase), grads_(grads) {}
  detail::EngineImpl* impl_ = nullptr;
  UnitId unit_;
  Phase phase_ = Phase::forward;
  void* grads_ = nullptr;  // the backward scope's gradient buffer
};

// Evaluation between optimizer steps (Engine::evaluate): forward scopes without gradients. Move-only; ending it
// (destructor or end()) returns the engine to training.
class EvalMode {
 public:
  EvalMode() = default;
  EvalMode(EvalMode&& other) noexcept;
  EvalMode& operator=(EvalMode&& other) noexcept;
  EvalMode(const EvalMode&) = delete;
  EvalMode& operator=(const EvalMode&) = delete;
  // Ends evaluation. Never throws: an error is logged and rethrown by the engine's next call.
  ~EvalMode();

  bool active() const { return impl_ != nullptr; }
  // Ends one evaluated batch (every scope closed): gathered units are released, and at stage 3 the order of
  // the scopes since the last call is the one later batches prefetch along.
  void next_batch();
  // Ends evaluation now and throws what ending raised.
  void end();

 private:
  friend class detail::EngineImpl;
  explicit EvalMode(detail::EngineImpl* impl) : impl_(impl) {}
  detail::EngineImpl* impl_ = nullptr;
};

// An Engine that runs the stages one pipeline rank holds (PipelineEngine, pipeline_engine.hpp, makes it): all the
// micro-batches of an optimizer step go through one micro-step, so every step() ends an accumulation window.
struct PipelineStageBinding {
  // The ranks of the other stages with this rank's data-parallel index (the pipeline group): the gradient
  // statistics (Inf/NaN count, squared norm) are summed over it too, so clipping and skipping agree across stages.
  std::shared_ptr<Communicator> pipeline_group;
  // The micro-batches of one step (the config's gradient_accumulation_steps): gradients are averaged over them.
  int64_t micro_batches = 1;
  // How many of the stage's data-parallel ranks share a node (consecutive in the group's order), for the layouts
  // over nodes (MiCS, hpZ); 0: the launcher's variables decide, as for any engine.
  int ranks_per_node = 0;
};

class Engine {
 public:
  // `config` must have been through resolve() (Config::resolved), for this communicator's world size:
  // otherwise ConfigError, naming the "auto" keys still pending and the batch sizes not inferred, or the batch
  // sizes that do not multiply to train_batch_size at this world size. initialize() resolves it for you.
  // `comm` is the data-parallel group; the engine shares it. `device` must outlive the engine.
  // Stage, optimizer, precision, buckets and schedule knobs all come from `config`.
  // On a cuda device the communicator must be nccl (Unsupported otherwise), parameter and gradient views are
  // device memory, and the engine computes on the device's compute stream, Device::default_stream(): the
  // caller's stream when the device was made with make_device("cuda:N", stream) (zero3/stream.hpp: the caller
  // keeps it alive until the engine and the device are destroyed), else CUDA's legacy default stream. Its own
  // kernels run there; gathers and reductions run on streams of their own that wait for it, and it waits for
  // them, through events (no host synchronization). Run the model's kernels on that stream: a unit's
  // parameters are ready there once its scope is open, and its gradients are read there when the scope closes.
  // A Device that zero3 did not make (make_device, make_cpu_device) is InvalidArgument.
  Engine(const Config& config, std::shared_ptr<Communicator> comm, Device& device);
  // One pipeline rank's stage engine: `comm` is the stage's data-parallel group, and the config's pipeline.stages
  // may be above 1 (the batch sizes are checked against comm's size as the data-parallel size).
  Engine(const Config& config, std::shared_ptr<Communicator> comm, Device& device, PipelineStageBinding stage);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // ---- Declaring the model (before materialize; local, no communication) ----

  // A new, empty unit. Names are unique and must not contain '/'; InvalidArgument otherwise.
  UnitId add_unit(const std::string& name);
  // A unit with its parameters.
  UnitId add_unit(const std::string& name, const std::vector<ParamSpec>& params);
  // Appends a parameter to `unit`. InvalidArgument for a duplicate name, a dimension < 1, a dtype that
  // differs from the unit's other parameters, or a call after materialize().
  ParamId add_param(UnitId unit, const ParamSpec& spec);

  // Collective. Checks that every rank declared the same units and parameters (CommError naming the first
  // difference), partitions every unit, allocates this rank's slices and state, and initialises the local
  // slice from each parameter's ParamInit. At stage 0-2 it then all-gathers the full parameters; at stage 3
  // it gathers the persistent units.
  void materialize();
  bool materialized() const;

  // ---- Training ----

  // Opens a scope on `unit` (collective at stage 3: the gather). Nested scopes on different units are
  // allowed, and several scopes on one unit count up.
  UnitScope forward_scope(UnitId unit);
  UnitScope backward_scope(UnitId unit);

  // Ends a micro-step (collective). First compares the micro-step's scope events across ranks (a CommError
  // naming the first difference; nothing is reduced or applied). At an accumulation boundary (every
  // gradient_accumulation_steps calls) it reduces what remains, checks for Inf/NaN on every rank, clips by the
  // global norm, unscales (fp16), runs Adam/AdamW on the local slices with the scheduler's lr, updates the loss
  // scale and refreshes the compute-dtype parameters. Every scope must be closed.
  // At stage 3 it returns with the persistent units gathered and the next micro-step's first units (along the
  // recorded order, as many as stage3_prefetch_bucket_size and stage3_max_live_parameters allow: the first one
  // always, none with a bucket of 0) gathered or in flight, from the updated weights after an optimizer step;
  // within the accumulation window those still gathered from their last use are kept. refresh_params() and
  // load_checkpoint gather them again from the new values; evaluate() releases them and its end gathers them again.
  // A boundary with no backward_scope since the previous one (on any rank: the ranks' scopes are the same)
  // applies nothing, as PyTorch's optimizers skip parameters without gradients: no update, no weight decay, no
  // Adam step, no move of the lr schedule; the result has boundary set and applied unset, and it counts as a
  // skipped step (skipped_steps(), TrainingState). A unit without a backward scope in a window that has others
  // is stepped with a zero gradient (its moments decay, weight decay applies), as DeepSpeed's flat partitions do.
  StepResult step();

  // True while the current micro-step is the last of its accumulation window (its step() steps).
  bool is_gradient_accumulation_boundary() const;
  int64_t gradient_accumulation_steps() const;
  int64_t micro_steps() const;
  int64_t global_steps() const;
  int64_t skipped_steps() const;
  // Multiply the loss by this before computing gradients (fp16 loss scaling; 1 otherwise).
  double loss_scale() const;
  // The learning rate the next optimizer step will use.
  double current_lr() const;

  // ---- Evaluation ----

  // Forward passes without gradients (a validation loss, generation) between optimizer steps. Call it with
  // every scope closed and no scope entered since the last step() (or before the first micro-step). Until the
  // returned EvalMode ends, forward scopes gather parameters as in training; backward_scope() and step() throw
  // InvalidArgument; the training schedule, the micro-step count, the accumulated gradients and the optimizer
  // state stay as they were. Evaluation has a schedule of its own: at stage 3 its first batch records the order
  // of units and later batches prefetch along it, so evaluating does not disturb the order training follows.
  // Collective like training: every rank must evaluate the same batches, entering the same units in the same
  // order; each batch is compared across ranks as a micro-step is (at its first batch entry by entry, and as a
  // whole when EvalMode::next_batch() or end() ends it).
  EvalMode evaluate();
  bool evaluating() const;

  // ---- Parameters outside scopes ----

  // Collective. Writes the unit's full fp32 master parameters (numel floats) to host memory `out`.
  void gather_master_params(UnitId unit, float* out);
  // This rank's master slice and Adam state of `unit` (valid after materialize). With optimizer offload to
  // nvme the state lives in the swap file: the first call for a unit reads its whole slice into host
  // staging (3 x length floats, kept until the next applied step or refresh_params(), which writes it back).
  ShardView local_shard(UnitId unit);
  // Collective. Recomputes every compute-dtype parameter from the fp32 master slices (after local_shard
  // writes) and drops stage-3 gathered copies; the next micro-step's first units are then gathered again.
  void refresh_params();

  // ---- The program's own values ----

  // Collective: `values` (count floats of host memory) become `op` (sum, avg or max) over the ranks: the
  // global loss, token counts, anything the ranks must agree on. It goes through the engine's communication
  // queue, after every collective the engine issued before it, and blocks until the result is back; so it may be
  // called between any two engine calls (inside scopes, during evaluate(), with overlap_comm's thread running)
  // provided every rank calls it at the same point of its sequence of engine calls. On a cuda device the
  // values travel through a device buffer. A failed or timed-out reduction leaves the engine failed, like any
  // of its collectives. Do not issue collectives on communicator() yourself: see "The program's collectives" at
  // the top of this header.
  void all_reduce_host(float* values, size_t count, ReduceOp op = ReduceOp::sum);

  // ---- Buffers ----

  // Registers where the model's buffers are (zero3::libtorch registers its module's). Local; replaces an earlier
  // source, and an empty function removes it. Every rank must list the same names, types and shapes.
  void set_buffer_source(BufferSource source);
  // What the source lists now; empty without one. InvalidArgument for a nameless, duplicate or null buffer.
  std::vector<ModelBuffer> buffers() const;

  // ---- Queries ----

  const Config& config() const;
  int rank() const;
  int world_size() const;
  int stage() const;
  DType compute_dtype() const;
  DType grad_dtype() const;  // data_types.grad_accum_dtype
  Device& device() const;
  // The engine's communicator. Not for the program's own collectives while the engine exists (all_reduce_host).
  // With overlap_comm's thread, returns once the collectives the engine queued there have run (step() leaves the
  // next micro-step's gathers queued), so a collective issued on it next is in the same order on every rank.
  Communicator& communicator() const;

  size_t num_units() const;
  size_t num_params() const;
  const UnitInfo& unit(UnitId unit) const;
  const ParamInfo& param(ParamId param) const;
  std::optional<UnitId> find_unit(std::string_view name) const;
  std::optional<ParamId> find_param(std::string_view full_name) const;  // "<unit>.<param>"
  // The parameter `local_name` of `unit`; InvalidArgument when it has none.
  ParamId param_id(UnitId unit, std::string_view local_name) const;

  // The ranks one copy of the parameters, gradients and optimizer state is partitioned over: the world, or under
  // MiCS (zero_optimization.mics_shard_size) a shard group of consecutive ranks, the groups holding replicas.
  int partition_size() const;
  // Rank `rank`'s slice of `unit` (the slice of index rank % partition_size()), and the parameter ranges in it.
  SliceInfo slice(UnitId unit, int rank) const;
  std::vector<ParamSlice> slice_params(UnitId unit, int rank) const;

  MemoryStats memory() const;
  ScheduleStats schedule_stats() const;
  void reset_schedule_stats();
  // The order the schedule follows: the units entered during the last completed micro-step.
  std::vector<ScheduleEvent> recorded_order() const;

  OffloadStats offload_stats() const;
  void reset_offload_stats();

  TrainingState training_state() const;
  void restore_training_state(const TrainingState& state);

 private:
  std::unique_ptr<detail::EngineImpl> impl_;
};

const char* phase_name(Phase phase);

}  // namespace zero3
