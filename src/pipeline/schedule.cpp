// The schedules' compute orders (which forward and backward each rank runs, in what order) as slots of computes
// that run back to back, and the transfers placed around each slot: the receives its computes need right before it,
// the sends of what they made right after it. GPipe and 1F1B run one compute per slot; the interleaved schedule's
// steady state runs a forward and a backward per slot, as Megatron-LM does, so that the receives of both come before
// the pair. What runs when across ranks follows from the transfers; validate_schedule() checks it never waits forever.
#include <algorithm>
#include <string>

#include "zero3/error.hpp"
#include "zero3/pipeline_schedule.hpp"

namespace zero3::pipeline {
namespace {

struct Compute {
  bool forward;
  int micro_batch;
  int stage;
};

std::string plural(int n, const char* one, const char* many) { return std::to_string(n) + " " + (n == 1 ? one : many); }

void check_shape(ScheduleKind kind, int ranks, int micro_batches, int stages_per_rank) {
  const std::string name = schedule_name(kind);
  if (ranks < 1)
    throw ConfigError("pipeline.stages: " + std::to_string(ranks) + " pipeline ranks; expected at least 1");
  if (ranks > 2047) throw ConfigError("pipeline.stages: " + std::to_string(ranks) + "; at most 2047 are supported");
  if (micro_batches < 1) {
    throw ConfigError("gradient_accumulation_steps: " + std::to_string(micro_batches) +
                      " micro-batches; the pipeline needs at least 1");
  }
  if (micro_batches >= (1 << 20)) {
    throw ConfigError("gradient_accumulation_steps: " + std::to_string(micro_batches) +
                      " micro-batches; a pipeline schedule supports fewer than 1048576");
  }
  if (kind == ScheduleKind::interleaved_1f1b) {
    if (stages_per_rank < 2) {
      throw ConfigError("zero3.pipeline_virtual_stages: " + std::to_string(stages_per_rank) + " for schedule " + name +
                        "; the interleaved schedule needs at least 2 stages per rank (use 1f1b for 1)");
    }
    if (ranks * stages_per_rank > 2047) {
      throw ConfigError("zero3.pipeline_virtual_stages: " + std::to_string(stages_per_rank) + " x pipeline.stages " +
                        std::to_string(ranks) + " = " + std::to_string(ranks * stages_per_rank) +
                        " virtual stages; at most 2047 are supported");
    }
    if (micro_batches % ranks != 0) {
      throw ConfigError("gradient_accumulation_steps: schedule " + name + " needs the micro-batches to be a multiple " +
                        "of pipeline.stages, got " + plural(micro_batches, "micro-batch", "micro-batches") + " over " +
                        plural(ranks, "stage", "stages") + " (" + std::to_string(micro_batches % ranks) +
                        " left over)");
    }
  } else if (stages_per_rank != 1) {
    throw ConfigError("zero3.pipeline_virtual_stages: " + std::to_string(stages_per_rank) + " for schedule " + name +
                      "; only interleaved_1f1b runs several stages per rank");
  }
  if (kind != ScheduleKind::gpipe && micro_batches < ranks) {
    throw ConfigError("gradient_accumulation_steps: schedule " + name + " needs at least as many micro-batches as " +
                      "pipeline.stages, got " + plural(micro_batches, "micro-batch", "micro-batches") + " for " +
                      plural(ranks, "stage", "stages"));
  }
}

std::vector<Compute> gpipe_order(int micro_batches, int rank) {
  std::vector<Compute> order;
  for (int m = 0; m < micro_batches; ++m) order.push_back({true, m, rank});
  for (int m = 0; m < micro_batches; ++m) order.push_back({false, m, rank});
  return order;
}

// Warm-up: the forwards the later stages need before this rank's first backward can come back; then one forward
// and one backward alternately; then the remaining backwards.
std::vector<Compute> one_f_one_b_order(int ranks, int micro_batches, int rank) {
  const int warmup = std::min(ranks - rank - 1, micro_batches);
  std::vector<Compute> order;
  for (int m = 0; m < warmup; ++m) order.push_back({true, m, rank});
  int backward = 0;
  for (int m = warmup; m < micro_batches; ++m) {
    order.push_back({true, m, rank});
    order.push_back({false, backward++, rank});
  }
  while (backward < micro_batches) order.push_back({false, backward++, rank});
  return order;
}

// Megatron-LM's interleaved order: the k-th forward of a rank is micro-batch (k / (ranks * v)) * ranks + k % ranks
// on its chunk (k / ranks) % v (chunk c of rank r is stage c * ranks + r); backwards go through the chunks in
// reverse. Warm-up: (ranks - rank - 1) * 2 + (v - 1) * ranks forwards (all of them when there are as many
// micro-batches as ranks), then 1F1B, then the remaining backwards.
using Slots = std::vector<std::vector<Compute>>;

Slots one_per_slot(const std::vector<Compute>& order) {
  Slots slots;
  for (const Compute& c : order) slots.push_back({c});
  return slots;
}

Slots interleaved_order(int ranks, int micro_batches, int v, int rank) {
  const int total = micro_batches * v;
  auto micro_batch = [&](int k) { return (k / (ranks * v)) * ranks + k % ranks; };
  auto forward = [&](int k) { return Compute{true, micro_batch(k), ((k / ranks) % v) * ranks + rank}; };
  auto backward = [&](int k) { return Compute{false, micro_batch(k), (v - 1 - (k / ranks) % v) * ranks + rank}; };
  const int warmup = micro_batches == ranks ? total : std::min((ranks - rank - 1) * 2 + (v - 1) * ranks, total);
  Slots slots;
  int f = 0, b = 0;
  while (f < warmup) slots.push_back({forward(f++)});
  while (f < total) {
    slots.push_back({forward(f), backward(b++)});
    ++f;
  }
  while (b < total) slots.push_back({backward(b++)});
  return slots;
}

}  // namespace

Schedule make_schedule(ScheduleKind kind, int ranks, int micro_batches, int stages_per_rank) {
  check_shape(kind, ranks, micro_batches, stages_per_rank);
  Schedule schedule;
  schedule.kind = kind;
  schedule.ranks = ranks;
  schedule.stages_per_rank = stages_per_rank;
  schedule.micro_batches = micro_batches;
  const int last = schedule.stages() - 1;
  for (int r = 0; r < ranks; ++r) {
    Slots slots;
    switch (kind) {
      case ScheduleKind::gpipe:
        slots = one_per_slot(gpipe_order(micro_batches, r));
        break;
      case ScheduleKind::one_f_one_b:
        slots = one_per_slot(one_f_one_b_order(ranks, micro_batches, r));
        break;
      case ScheduleKind::interleaved_1f1b:
        slots = interleaved_order(ranks, micro_batches, stages_per_rank, r);
        break;
    }
    std::vector<Action>& actions = schedule.actions.emplace_back();
    // Transfers between two computes share one send_recv() call.
    auto transfer = [&](ActionKind k, int m, int stage, int peer_stage) {
      if (schedule.rank_of_stage(peer_stage) == r) return;  // the neighbouring stage is on this rank
      const bool joins = !actions.empty() && actions.back().is_transfer();
      actions.push_back({k, m, stage, peer_stage, schedule.rank_of_stage(peer_stage), joins});
    };
    for (const auto& slot : slots) {
      for (const Compute& c : slot) {
        if (c.forward && c.stage > 0) transfer(ActionKind::recv_activation, c.micro_batch, c.stage, c.stage - 1);
        if (!c.forward && c.stage < last) transfer(ActionKind::recv_gradient, c.micro_batch, c.stage, c.stage + 1);
      }
      for (const Compute& c : slot) {
        actions.push_back({c.forward ? ActionKind::forward : ActionKind::backward, c.micro_batch, c.stage});
      }
      for (const Compute& c : slot) {
        if (c.forward && c.stage < last) transfer(ActionKind::send_activation, c.micro_batch, c.stage, c.stage + 1);
        if (!c.forward && c.stage > 0) transfer(ActionKind::send_gradient, c.micro_batch, c.stage, c.stage - 1);
      }
    }
  }
  validate_schedule(schedule);
  return schedule;
}

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::gpipe:
      return "gpipe";
    case ScheduleKind::one_f_one_b:
      return "1f1b";
    case ScheduleKind::interleaved_1f1b:
      return "interleaved_1f1b";
  }
  return "unknown";
}

ScheduleKind parse_schedule(const std::string& name, const std::string& key) {
  for (ScheduleKind k : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved_1f1b}) {
    if (name == schedule_name(k)) return k;
  }
  throw ConfigError(key + ": unknown pipeline schedule \"" + name + "\"; expected gpipe, 1f1b or interleaved_1f1b");
}

uint32_t transfer_tag(const Action& t) {
  const bool gradient = t.kind == ActionKind::send_gradient || t.kind == ActionKind::recv_gradient;
  const bool sends = t.kind == ActionKind::send_activation || t.kind == ActionKind::send_gradient;
  const int from_stage = sends ? t.stage : t.peer_stage;
  return (uint32_t{gradient} << 31) | (static_cast<uint32_t>(from_stage) << 20) | static_cast<uint32_t>(t.micro_batch);
}

}  // namespace zero3::pipeline
