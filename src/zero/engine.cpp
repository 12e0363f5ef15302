// The public Engine and UnitScope: argument checks and forwarding to EngineImpl.
#include "zero3/engine.hpp"

#include <set>

#include "core/check.hpp"
#include "zero/engine_impl.hpp"
#include "zero/partition.hpp"
#include "zero3/error.hpp"

namespace zero3 {

const char* phase_name(Phase phase) { return phase == Phase::forward ? "forward" : "backward"; }

// ---- UnitScope ----

UnitScope::UnitScope(UnitScope&& other) noexcept
    : impl_(other.impl_), unit_(other.unit_), phase_(other.phase_), grads_(other.grads_) {
  other.impl_ = nullptr;
  other.grads_ = nullptr;
}

UnitScope& UnitScope::operator=(UnitScope&& other) noexcept {
  if (this != &other) {
    if (impl_) impl_->exit_noexcept(*this);
    impl_ = other.impl_;
    unit_ = other.unit_;
    phase_ = other.phase_;
    grads_ = other.grads_;
    other.impl_ = nullptr;
    other.grads_ = nullptr;
  }
  return *this;
}

UnitScope::~UnitScope() {
  if (impl_) impl_->exit_noexcept(*this);
}

void UnitScope::close() {
  ZERO3_REQUIRE(impl_ != nullptr, InvalidArgument, "UnitScope::close: the scope is not open");
  impl_->exit(*this);
}

static void require_open(const detail::EngineImpl* impl, const char* what) {
  ZERO3_REQUIRE(impl != nullptr, InvalidArgument, "UnitScope::", what, ": the scope is closed (or was moved from)");
}

TensorView UnitScope::param(ParamId param) const {
  require_open(impl_, "param");
  return impl_->param_view(unit_, param);
}

TensorView UnitScope::param(std::string_view local_name) const {
  require_open(impl_, "param");
  return impl_->param_view(unit_, impl_->find_param_in_unit(unit_, local_name));
}

TensorView UnitScope::grad(ParamId param) const {
  require_open(impl_, "grad");
  return impl_->grad_view(unit_, param, grads_);
}

TensorView UnitScope::grad(std::string_view local_name) const {
  require_open(impl_, "grad");
  return impl_->grad_view(unit_, impl_->find_param_in_unit(unit_, local_name), grads_);
}

TensorView UnitScope::flat_params() const {
  require_open(impl_, "flat_params");
  return impl_->flat_param_view(unit_);
}

TensorView UnitScope::flat_grads() const {
  require_open(impl_, "flat_grads");
  return impl_->flat_grad_view(unit_, grads_);
}

// ---- EvalMode ----

EvalMode::EvalMode(EvalMode&& other) noexcept : impl_(other.impl_) { other.impl_ = nullptr; }

EvalMode& EvalMode::operator=(EvalMode&& other) noexcept {
  if (this != &other) {
    if (impl_) impl_->end_eval_noexcept(*this);
    impl_ = other.impl_;
    other.impl_ = nullptr;
  }
  return *this;
}

EvalMode::~EvalMode() {
  if (impl_) impl_->end_eval_noexcept(*this);
}

void EvalMode::next_batch() {
  ZERO3_REQUIRE(impl_ != nullptr, InvalidArgument, "EvalMode::next_batch: evaluation has ended (or was moved from)");
  impl_->next_eval_batch();
}

void EvalMode::end() {
  ZERO3_REQUIRE(impl_ != nullptr, InvalidArgument, "EvalMode::end: evaluation has ended (or was moved from)");
  impl_->end_eval(*this);
}

// ---- Engine ----

Engine::Engine(const Config& config, std::shared_ptr<Communicator> comm, Device& device)
    : impl_(std::make_unique<detail::EngineImpl>(config, std::move(comm), device)) {}

Engine::Engine(const Config& config, std::shared_ptr<Communicator> comm, Device& device, PipelineStageBinding stage) {
  ZERO3_REQUIRE(stage.pipeline_group != nullptr, InvalidArgument,
                "Engine: a pipeline stage's engine needs its pipeline group (PipelineStageBinding::pipeline_group)");
  impl_ = std::make_unique<detail::EngineImpl>(config, std::move(comm), device, std::move(stage));
}

Engine::~Engine() = default;

UnitId Engine::add_unit(const std::string& name) { return impl_->add_unit(name); }

UnitId Engine::add_unit(const std::string& name, const std::vector<ParamSpec>& params) {
  UnitId id = impl_->add_unit(name);
  for (const ParamSpec& p : params) impl_->add_param(id, p);
  return id;
}

ParamId Engine::add_param(UnitId unit, const ParamSpec& spec) { return impl_->add_param(unit, spec); }

void Engine::materialize() { impl_->materialize(); }
bool Engine::materialized() const { return impl_->materialized_; }

UnitScope Engine::forward_scope(UnitId unit) { return impl_->enter(unit, Phase::forward); }
UnitScope Engine::backward_scope(UnitId unit) { return impl_->enter(unit, Phase::backward); }
EvalMode Engine::evaluate() { return impl_->begin_eval(); }
bool Engine::evaluating() const { return impl_->evaluating_; }

StepResult Engine::step() { return impl_->step(); }

bool Engine::is_gradient_accumulation_boundary() const { return (impl_->micro_steps_ + 1) % impl_->gas_ == 0; }
int64_t Engine::gradient_accumulation_steps() const { return impl_->gas_; }
int64_t Engine::micro_steps() const { return impl_->micro_steps_; }
int64_t Engine::global_steps() const { return impl_->global_steps_; }
int64_t Engine::skipped_steps() const { return impl_->skipped_steps_; }
double Engine::loss_scale() const { return impl_->loss_scaler_.scale(); }

double Engine::current_lr() const { return impl_->lr_scheduler_->lr_at(impl_->applied_steps_ - 1); }

void Engine::gather_master_params(UnitId unit, float* out) { impl_->gather_master_params(unit, out); }

ShardView Engine::local_shard(UnitId unit) { return impl_->local_shard(unit); }

void Engine::refresh_params() { impl_->refresh_params(); }

void Engine::all_reduce_host(float* values, size_t count, ReduceOp op) { impl_->all_reduce_host(values, count, op); }

void Engine::set_buffer_source(BufferSource source) { impl_->buffer_source_ = std::move(source); }

std::vector<ModelBuffer> Engine::buffers() const {
  if (!impl_->buffer_source_) return {};
  std::vector<ModelBuffer> out = impl_->buffer_source_();
  std::set<std::string> names;
  for (const ModelBuffer& b : out) {
    ZERO3_REQUIRE(!b.name.empty(), InvalidArgument, "Engine::buffers: a buffer without a name");
    ZERO3_REQUIRE(names.insert(b.name).second, InvalidArgument, "Engine::buffers: buffer '", b.name,
                  "' is listed twice");
    ZERO3_REQUIRE(b.data != nullptr, InvalidArgument, "Engine::buffers: buffer '", b.name, "' has no data");
  }
  return out;
}

OffloadStats Engine::offload_stats() const {
  OffloadStats s;
  if (!impl_->opt_swap_) return s;
  const offload::SwapperStats& w = impl_->opt_swap_->swapper().stats();
  s.bytes_read = w.bytes_read;
  s.bytes_written = w.bytes_written;
  s.io_wait_seconds = w.io_wait_seconds;
  s.compute_seconds = w.compute_seconds;
  return s;
}

void Engine::reset_offload_stats() {
  if (impl_->opt_swap_) impl_->opt_swap_->swapper().reset_stats();
}

const Config& Engine::config() const { return impl_->config_; }
int Engine::rank() const { return impl_->rank_; }
int Engine::world_size() const { return impl_->world_; }
int Engine::stage() const { return impl_->policy_.stage; }
DType Engine::compute_dtype() const { return impl_->compute_dtype_; }
DType Engine::grad_dtype() const { return impl_->acc_dtype_; }
Device& Engine::device() const { return impl_->device_; }
Communicator& Engine::communicator() const {
  // The collectives the engine queued on its communication thread (the gathers step() issues for the next
  // micro-step) run first: a collective issued on the communicator next comes after them on every rank.
  if (impl_->queue_->async()) impl_->queue_->wait_submitted();
  return *impl_->user_comm_;
}

size_t Engine::num_units() const { return impl_->units_.size(); }
size_t Engine::num_params() const { return impl_->params_.size(); }
const UnitInfo& Engine::unit(UnitId unit) const { return impl_->unit_state(unit, "unit").info; }
const ParamInfo& Engine::param(ParamId param) const { return impl_->param_state(param, "param").info; }

std::optional<UnitId> Engine::find_unit(std::string_view name) const {
  auto it = impl_->unit_by_name_.find(std::string(name));
  if (it == impl_->unit_by_name_.end()) return std::nullopt;
  return UnitId{it->second};
}

std::optional<ParamId> Engine::find_param(std::string_view full_name) const {
  auto it = impl_->param_by_name_.find(std::string(full_name));
  if (it == impl_->param_by_name_.end()) return std::nullopt;
  return ParamId{it->second};
}

ParamId Engine::param_id(UnitId unit, std::string_view local_name) const {
  return impl_->find_param_in_unit(unit, local_name);
}

int Engine::partition_size() const { return impl_->partition_size(); }

SliceInfo Engine::slice(UnitId unit, int rank) const {
  const detail::UnitState& u = impl_->unit_state(unit, "slice");
  ZERO3_REQUIRE(rank >= 0 && rank < impl_->world_, InvalidArgument, "Engine::slice: rank ", rank,
                " is not in a world of ", impl_->world_);
  const int g = impl_->partition_size();
  SliceInfo s = detail::slice_of(u.info.numel, g, rank % g);
  s.rank = rank;
  return s;
}

std::vector<ParamSlice> Engine::slice_params(UnitId unit, int rank) const {
  const detail::UnitState& u = impl_->unit_state(unit, "slice_params");
  SliceInfo s = slice(unit, rank);
  std::vector<ParamSlice> out;
  for (const auto& r : detail::params_in_range(u.param_offsets, u.param_numels, s.offset, s.size)) {
    out.push_back({u.info.params[static_cast<size_t>(r.param_index)], r.param_begin, r.param_end, r.local_offset});
  }
  return out;
}

MemoryStats Engine::memory() const { return impl_->memory(); }
ScheduleStats Engine::schedule_stats() const {
  ScheduleStats s = impl_->stats_;
  if (impl_->reducer_) s.reduced_elements = impl_->reducer_->reduced_elements() - impl_->reduced_base_;
  s.comm_wait_seconds = impl_->queue_->blocked_seconds() - impl_->blocked_base_;
  return s;
}

void Engine::reset_schedule_stats() {
  ScheduleStats fresh;
  fresh.live_numel = impl_->stats_.live_numel;
  fresh.peak_live_numel = impl_->stats_.live_numel;
  fresh.persistent_numel = impl_->stats_.persistent_numel;
  impl_->stats_ = fresh;
  impl_->peak_gathered_bytes_ = impl_->gathered_bytes_;
  if (impl_->reducer_) impl_->reduced_base_ = impl_->reducer_->reduced_elements();
  impl_->blocked_base_ = impl_->queue_->blocked_seconds();
}

std::vector<ScheduleEvent> Engine::recorded_order() const {
  if (!impl_->schedule_) return {};
  return impl_->schedule_->trace();
}

TrainingState Engine::training_state() const {
  TrainingState s;
  s.micro_steps = impl_->micro_steps_;
  s.global_steps = impl_->global_steps_;
  s.skipped_steps = impl_->skipped_steps_;
  s.applied_steps = impl_->applied_steps_;
  LossScalerState ls = impl_->loss_scaler_.state();
  s.loss_scale = ls.cur_scale;
  s.scaler_iter = ls.cur_iter;
  s.scaler_last_overflow_iter = ls.last_overflow_iter;
  s.scaler_hysteresis = ls.cur_hysteresis;
  return s;
}

void Engine::restore_training_state(const TrainingState& s) {
  ZERO3_REQUIRE(s.micro_steps >= 0 && s.global_steps >= 0 && s.skipped_steps >= 0 && s.applied_steps >= 0 &&
                    s.applied_steps + s.skipped_steps == s.global_steps,
                InvalidArgument, "Engine::restore_training_state: inconsistent counters (global ", s.global_steps,
                ", applied ", s.applied_steps, ", skipped ", s.skipped_steps, ")");
  impl_->micro_steps_ = s.micro_steps;
  impl_->global_steps_ = s.global_steps;
  impl_->skipped_steps_ = s.skipped_steps;
  impl_->applied_steps_ = s.applied_steps;
  impl_->loss_scaler_.restore(
      LossScalerState{s.loss_scale, s.scaler_iter, s.scaler_last_overflow_iter, s.scaler_hysteresis});
}

}  // namespace zero3
