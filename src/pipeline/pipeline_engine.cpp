// PipelineEngine: the stages of a sequential model on their data-parallel groups, driven by a schedule
// (zero3/pipeline_engine.hpp). The engine of the stages this rank holds is an ordinary Engine over the stage's
// data-parallel group, bound to the pipeline group (PipelineStageBinding): all micro-batches of a step are one of its
// micro-steps, and its gradient statistics are summed over the stages. This file follows the schedule's actions:
// activation and gradient buffers per (stage, micro-batch), the transfers of one call in one send_recv(), the
// program's forward and backward, then step() and the loss from the last stage.
#include "zero3/pipeline_engine.hpp"

#include <algorithm>
#include <exception>
#include <map>
#include <numeric>
#include <utility>

#include "pipeline/layer_partition.hpp"
#include "pipeline/pipeline_topology.hpp"
#include "core/check.hpp"
#include "pipeline/stage_buffers.hpp"
#include "zero/comm_queue.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3 {
namespace {

using pipeline::Action;
using pipeline::ActionKind;

// The world's nodes as the launcher describes them; one node when its variables do not describe this world.
detail::NodeLayout world_nodes(const Communicator& world) {
  int per_node = world.size();
  std::string source = "one node: the launcher's variables do not describe this communicator's world";
  try {
    const LaunchInfo launch = detect_launch();
    const int l = launch.local_world_size;
    if (launch.world_size == world.size() && launch.rank == world.rank() && l >= 1 && world.size() % l == 0 &&
        launch.node_rank == world.rank() / l) {
      per_node = l;
      source = "the launcher (" + launch.launcher + ")";
    }
  } catch (const Error&) {
    // An unreadable launcher environment: one node, as the engine assumes.
  }
  return detail::make_node_layout(world.size(), per_node, source);
}

// How many of `group`'s ranks (in group order) share each node, when every node holds the same number of
// consecutive members; 0 otherwise (the stage's engine then finds its nodes itself).
int group_ranks_per_node(const detail::RankGroup& group, const detail::NodeLayout& nodes) {
  int run = 0;
  int per_node = 0;
  for (size_t i = 0; i < group.ranks.size(); ++i) {
    const bool same = i > 0 && nodes.node_of(group.ranks[i]) == nodes.node_of(group.ranks[i - 1]);
    if (same) {
      ++run;
      continue;
    }
    if (i > 0) {
      if (per_node != 0 && run != per_node) return 0;
      per_node = run;
    }
    run = 1;
  }
  if (per_node != 0 && run != per_node) return 0;
  return per_node == 0 ? run : per_node;
}

bool sends(ActionKind kind) { return kind == ActionKind::send_activation || kind == ActionKind::send_gradient; }

const char* transfer_what(ActionKind kind) {
  switch (kind) {
    case ActionKind::send_activation:
      return "sending the activation";
    case ActionKind::recv_activation:
      return "receiving the activation";
    case ActionKind::send_gradient:
      return "sending the gradient";
    case ActionKind::recv_gradient:
      return "receiving the gradient";
    default:
      return "computing";
  }
}

}  // namespace

struct PipelineEngine::Impl {
  Impl(const Config& c, std::shared_ptr<Communicator> w, Device& d, std::vector<PipelineLayer> l, PipelineModel& m,
       const PipelineOptions& o)
      : config(c), world(std::move(w)), device(d), layers(std::move(l)), model(m), options(o) {}

  Config config;
  std::shared_ptr<Communicator> world;
  Device& device;
  std::vector<PipelineLayer> layers;
  PipelineModel& model;
  PipelineOptions options;
  std::vector<int> bounds;
  pipeline::Schedule schedule;
  pipeline::PipelineGroups groups;
  std::vector<PipelineStageInfo> stages;  // this rank's, in stage order
  std::unique_ptr<Engine> engine;
  int64_t micro_batches = 1;
  int64_t eval_batches = 0;
  std::exception_ptr failed;

  const PipelineStageInfo& stage_info(int stage) const {
    for (const PipelineStageInfo& s : stages) {
      if (s.stage == stage) return s;
    }
    throw InvalidArgument(log::concat("PipelineEngine: stage ", stage, " is not on pipeline rank ",
                                      groups.stage));  // a schedule of another rank: an internal fault
  }
  bool holds(int stage) const {
    return std::any_of(stages.begin(), stages.end(), [&](const PipelineStageInfo& s) { return s.stage == stage; });
  }

  void check_usable() const {
    if (failed) std::rethrow_exception(failed);
  }

  // Runs `actions` (this rank's list, or its forward part for evaluation) on `buffers`; returns the last stage's
  // losses by micro-batch (empty elsewhere).
  std::vector<double> run_actions(const std::vector<Action>& actions, pipeline::StageBuffers& buffers,
                                  int64_t first_data_index, bool training);
  void run_call(const std::vector<Action>& call, pipeline::StageBuffers& buffers, std::vector<WorkPtr>& pending);
  double share_loss(const std::vector<double>& losses);
};

// ---- The schedule ----

std::vector<double> PipelineEngine::Impl::run_actions(const std::vector<Action>& actions,
                                                      pipeline::StageBuffers& buffers, int64_t first_data_index,
                                                      bool training) {
  std::vector<double> losses;
  std::vector<WorkPtr> pending;  // cuda: the stream-ordered transfers, checked once the schedule is queued
  std::vector<Action> call;
  auto flush = [&] {
    if (call.empty()) return;
    run_call(call, buffers, pending);
    call.clear();
  };
  for (const Action& a : actions) {
    if (a.is_transfer()) {
      if (!a.joins_previous) flush();
      call.push_back(a);
      continue;
    }
    flush();
    const PipelineStageInfo& s = stage_info(a.stage);
    PipelineCall c;
    c.stage = &s;
    c.micro_batch = a.micro_batch;
    c.data_index = first_data_index + a.micro_batch;
    c.training = training;
    if (!s.is_first()) c.input = buffers.input(a.stage, a.micro_batch, holds(a.stage - 1));
    if (a.kind == ActionKind::forward) {
      if (!s.is_last()) c.output = buffers.make_output(a.stage, a.micro_batch);
      const double loss = model.forward(*engine, c);
      if (s.is_last()) {
        if (losses.size() <= static_cast<size_t>(a.micro_batch)) losses.resize(a.micro_batch + 1, 0.0);
        losses[a.micro_batch] = loss;
      }
      if (!training) buffers.release_input(a.stage, a.micro_batch);
    } else {
      if (!s.is_last()) c.grad_output = buffers.grad_output(a.stage, a.micro_batch, holds(a.stage + 1));
      if (!s.is_first()) c.grad_input = buffers.make_grad_input(a.stage, a.micro_batch);
      model.backward(*engine, c);
      buffers.release_after_backward(a.stage, a.micro_batch);
    }
  }
  flush();
  try {
    for (WorkPtr& w : pending) w->wait();
  } catch (const CommError&) {
    detail::rethrow_comm_error(log::concat("pipeline stage ", stages.front().stage, " on world rank ", world->rank(),
                                           ", step ", engine->global_steps() + 1,
                                           ": the step's transfers on the compute stream: "));
  }
  buffers.release_sent();
  return losses;
}

void PipelineEngine::Impl::run_call(const std::vector<Action>& call, pipeline::StageBuffers& buffers,
                                    std::vector<WorkPtr>& pending) {
  std::vector<PeerTransfer> transfers;
  transfers.reserve(call.size());
  const DType dtype = options.activation_dtype;
  for (const Action& a : call) {
    TensorView v;
    switch (a.kind) {
      case ActionKind::send_activation:
        v = buffers.output(a.stage, a.micro_batch);
        break;
      case ActionKind::recv_activation:
        v = buffers.make_received_input(a.stage, a.micro_batch);
        break;
      case ActionKind::send_gradient:
        v = buffers.grad_input(a.stage, a.micro_batch);
        break;
      case ActionKind::recv_gradient:
        v = buffers.make_received_grad_output(a.stage, a.micro_batch);
        break;
      default:
        continue;
    }
    const uint32_t tag = pipeline::transfer_tag(a);
    transfers.push_back(sends(a.kind) ? PeerTransfer::send_to(a.peer_rank, v.data, v.numel, dtype, tag)
                                      : PeerTransfer::recv_from(a.peer_rank, v.data, v.numel, dtype, tag));
  }
  Communicator& pipe = *groups.pipeline.comm;
  const bool on_stream = device.type() != DeviceType::cpu;
  try {
    WorkPtr work = pipe.send_recv(transfers, on_stream ? device.default_stream() : nullptr);
    if (on_stream) {
      pending.push_back(std::move(work));
    } else {
      work->wait();
    }
  } catch (const CommError&) {
    std::string what;
    for (const Action& a : call) {
      what += log::concat(what.empty() ? "" : ", ", transfer_what(a.kind), " of micro-batch ", a.micro_batch,
                          sends(a.kind) ? " to" : " from", " stage ", a.peer_stage, " (world rank ",
                          groups.topology.rank_of(a.peer_rank, groups.topology.index_of(world->rank())), ")");
    }
    detail::rethrow_comm_error(log::concat("pipeline stage ", call.front().stage, " on world rank ", world->rank(),
                                           ", step ", engine->global_steps() + 1, ": ", what, ": "));
  }
  for (const Action& a : call) {
    if (a.kind == ActionKind::send_activation) buffers.sent_output(a.stage, a.micro_batch);
    if (a.kind == ActionKind::send_gradient) buffers.sent_grad_input(a.stage, a.micro_batch);
  }
  if (!on_stream) buffers.release_sent();
}

double PipelineEngine::Impl::share_loss(const std::vector<double>& losses) {
  // The last stage's mean over its micro-batches, averaged over its data-parallel ranks (through the stage
  // engine's queue), then summed over the pipeline group, where every other stage adds 0.
  float value[1] = {0.0f};
  if (!losses.empty()) {
    value[0] = static_cast<float>(std::accumulate(losses.begin(), losses.end(), 0.0) /
                                  static_cast<double>(losses.size()));
  }
  engine->all_reduce_host(value, 1, ReduceOp::avg);
  Communicator& pipe = *groups.pipeline.comm;
  if (pipe.size() > 1) {
    if (device.type() == DeviceType::cpu) {
      pipe.all_reduce(value, 1, DType::f32, ReduceOp::sum)->wait();
    } else {
      void* d = device.allocate(sizeof(float));
      try {
        device.copy(d, value, sizeof(float), device.default_stream());
        pipe.all_reduce(d, 1, DType::f32, ReduceOp::sum, device.default_stream())->wait();
        device.copy(value, d, sizeof(float), device.default_stream());
        device.synchronize();
      } catch (...) {
        device.deallocate(d, sizeof(float));
        throw;
      }
      device.deallocate(d, sizeof(float));
    }
  }
  return value[0];
}

// ---- PipelineEngine ----

PipelineEngine::PipelineEngine(const Config& config, std::shared_ptr<Communicator> world, Device& device,
                               std::vector<PipelineLayer> layers, PipelineModel& model, const PipelineOptions& options)
    : impl_(std::make_unique<Impl>(config, std::move(world), device, std::move(layers), model, options)) {
  Impl& p = *impl_;
  ZERO3_REQUIRE(p.world != nullptr, InvalidArgument, "PipelineEngine: the communicator is null");
  ZERO3_REQUIRE(config.resolved, ConfigError, "PipelineEngine: the config (",
                config.source.empty() ? "built in the program" : config.source,
                ") was never resolved; call zero3::resolve(config, {.world_size = world->size(), "
                ".pipeline_stages = ...}) first");
  ZERO3_REQUIRE(!p.layers.empty(), InvalidArgument, "PipelineEngine: the model has no layers");
  const int ranks = static_cast<int>(config.pipeline.stages.value_or(1));
  const auto per_rank = static_cast<int>(config.zero3.pipeline_virtual_stages);
  p.micro_batches = config.gradient_accumulation_steps.value_or(1);
  const auto kind = pipeline::parse_schedule(config.zero3.pipeline_schedule, "zero3.pipeline_schedule");
  const auto order = pipeline::parse_stage_order(config.zero3.pipeline_stage_order, "zero3.pipeline_stage_order");
  const auto topology = pipeline::make_pipeline_topology(world_nodes(*p.world), ranks, order);
  p.schedule = pipeline::make_schedule(kind, ranks, static_cast<int>(p.micro_batches), per_rank);

  std::vector<pipeline::LayerInfo> infos;
  for (const PipelineLayer& l : p.layers) infos.push_back({l.name, l.parameters});
  p.bounds = pipeline::partition_layers(infos, p.schedule.stages(), config.pipeline.partition);
  const int total = p.schedule.stages();
  for (int s = 0; s + 1 < total; ++s) {
    const PipelineLayer& last = p.layers[static_cast<size_t>(p.bounds[s + 1] - 1)];
    ZERO3_REQUIRE(last.output_numel > 0, InvalidArgument, "PipelineEngine: layer '", last.name,
                  "' ends stage ", s, " of ", total, " (", pipeline::describe_partition(infos, p.bounds),
                  "), but its output_numel is ", last.output_numel,
                  "; the activation sent to the next stage needs its element count");
  }

  p.groups = pipeline::make_pipeline_groups(p.world, topology);
  const int prank = p.groups.stage;
  for (int s = prank; s < total; s += ranks) {
    PipelineStageInfo info;
    info.stage = s;
    info.stages = total;
    info.first_layer = static_cast<size_t>(p.bounds[s]);
    info.end_layer = static_cast<size_t>(p.bounds[s + 1]);
    info.input_numel = s > 0 ? p.layers[info.first_layer - 1].output_numel : 0;
    info.output_numel = s + 1 < total ? p.layers[info.end_layer - 1].output_numel : 0;
    info.activation_checkpoint_interval = config.pipeline.activation_checkpoint_interval;
    p.stages.push_back(info);
  }
  PipelineStageBinding binding;
  binding.pipeline_group = p.groups.pipeline.comm;
  binding.micro_batches = p.micro_batches;
  binding.ranks_per_node = group_ranks_per_node(p.groups.data_parallel.ranks, topology.nodes);
  p.engine = std::make_unique<Engine>(config, p.groups.data_parallel.comm, device, std::move(binding));
  for (const PipelineStageInfo& s : p.stages) p.model.declare(*p.engine, s);
  p.engine->materialize();
  log::info_rank0("pipeline: ", topology.describe(), "; ", pipeline::schedule_name(kind), ", ", p.micro_batches,
                  " micro-batches, ", total, " stages: ", pipeline::describe_partition(infos, p.bounds));
}

PipelineEngine::~PipelineEngine() = default;

PipelineStepResult PipelineEngine::train_batch() {
  Impl& p = *impl_;
  p.check_usable();
  PipelineStepResult result;
  try {
    pipeline::StageBuffers buffers(p.device, p.options.activation_dtype, p.stages);
    const std::vector<double> losses = p.run_actions(p.schedule.actions[static_cast<size_t>(p.groups.stage)], buffers,
                                                     p.engine->global_steps() * p.micro_batches, true);
    result.step = p.engine->step();
    result.loss = p.share_loss(losses);
  } catch (...) {
    p.failed = std::current_exception();
    throw;
  }
  return result;
}

double PipelineEngine::eval_batch() {
  Impl& p = *impl_;
  p.check_usable();
  double loss = 0.0;
  try {
    // Forwards only, micro-batch by micro-batch and, within one, this rank's stages in order: each receives its
    // input, computes and sends its output on (the activations' order of the training schedule is not deadlock-free
    // without its backwards once a rank holds several stages).
    std::vector<Action> forward;
    const int ranks = p.schedule.ranks;
    for (int mb = 0; mb < static_cast<int>(p.micro_batches); ++mb) {
      for (const PipelineStageInfo& s : p.stages) {
        if (!s.is_first() && !p.holds(s.stage - 1)) {
          forward.push_back({ActionKind::recv_activation, mb, s.stage, s.stage - 1, (s.stage - 1) % ranks, false});
        }
        forward.push_back({ActionKind::forward, mb, s.stage, -1, -1, false});
        if (!s.is_last() && !p.holds(s.stage + 1)) {
          forward.push_back({ActionKind::send_activation, mb, s.stage, s.stage + 1, (s.stage + 1) % ranks, false});
        }
      }
    }
    EvalMode eval = p.engine->evaluate();
    pipeline::StageBuffers buffers(p.device, p.options.activation_dtype, p.stages);
    const std::vector<double> losses = p.run_actions(forward, buffers, p.eval_batches * p.micro_batches, false);
    eval.end();
    loss = p.share_loss(losses);
    ++p.eval_batches;
  } catch (...) {
    p.failed = std::current_exception();
    throw;
  }
  return loss;
}

Engine& PipelineEngine::engine() { return *impl_->engine; }
const Engine& PipelineEngine::engine() const { return *impl_->engine; }
const std::vector<PipelineStageInfo>& PipelineEngine::stages() const { return impl_->stages; }
const std::vector<int>& PipelineEngine::stage_bounds() const { return impl_->bounds; }
const std::vector<PipelineLayer>& PipelineEngine::layers() const { return impl_->layers; }
const pipeline::Schedule& PipelineEngine::schedule() const { return impl_->schedule; }
int PipelineEngine::pipeline_rank() const { return impl_->groups.stage; }
int PipelineEngine::pipeline_size() const { return impl_->groups.topology.stages; }
int PipelineEngine::data_parallel_rank() const { return impl_->engine->rank(); }
int PipelineEngine::data_parallel_size() const { return impl_->engine->world_size(); }
int PipelineEngine::world_rank() const { return impl_->world->rank(); }
Communicator& PipelineEngine::world() const { return *impl_->world; }
int64_t PipelineEngine::micro_batches() const { return impl_->micro_batches; }
int64_t PipelineEngine::global_steps() const { return impl_->engine->global_steps(); }

}  // namespace zero3
