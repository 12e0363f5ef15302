// Pipeline schedules as plain data: for every pipeline rank, the list of actions it takes in one optimizer step
// (forward or backward of micro-batch m on (virtual) stage s; send or receive an activation or its gradient to or
// from the neighbouring stage's rank), which a test can print and check and an engine can follow.
//
// Stages. A pipeline of `ranks` ranks holds ranks * stages_per_rank (virtual) stages; stage s lives on rank
// s % ranks (Megatron's interleaving: rank r holds stages r, r + ranks, r + 2 ranks, ...). With one stage per
// rank, stage s is rank s. Activations go from stage s to s + 1, their gradients from s + 1 back to s; between two
// stages on the same rank nothing is sent.
//
// Communication. A transfer marked joins_previous is issued in the same Communicator::send_recv() call (comm.hpp)
// as the transfer before it: the transfers between two computations of a rank form one call, whose transfers run
// side by side; calls run one after another. The k-th send from rank a to rank b meets b's k-th receive from a,
// and both carry the same transfer_tag(). Receives are placed right before the computation that needs them and
// sends right after the one that made them; the interleaved schedule's steady state computes a forward and a
// backward back to back, with the receives of both before the pair and the sends of both after it (Megatron-LM).
//
// Validation (validate_schedule) runs the ranks' lists against each other as the communicators do: a transfer
// completes once both sides have posted it (it is in the current call of each), a call finishes once all of its
// transfers completed. It checks that every send meets a receive of the same activation or gradient, that nothing
// waits forever (naming each waiting rank and action otherwise), that every (micro-batch, stage) runs its forward
// and its backward exactly once, the forward first, after its input arrived (or, on the same rank, after the
// previous stage's forward), and the backward after the gradient of its output.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zero3::pipeline {

enum class ScheduleKind : uint8_t {
  gpipe,             // every forward, then every backward (GPipe)
  one_f_one_b,       // warm-up forwards, then one forward and one backward alternately (PipeDream-Flush, DeepSpeed)
  interleaved_1f1b,  // 1F1B over several virtual stages per rank (Megatron-LM's interleaved schedule)
};

// "gpipe", "1f1b", "interleaved_1f1b".
const char* schedule_name(ScheduleKind kind);
// The inverse of schedule_name(); throws ConfigError naming `key`, the value and the accepted names.
ScheduleKind parse_schedule(const std::string& name, const std::string& key);

enum class ActionKind : uint8_t { forward, backward, send_activation, recv_activation, send_gradient, recv_gradient };

struct Action {
  ActionKind kind = ActionKind::forward;
  int micro_batch = 0;
  // forward/backward: the stage computed. send/recv: the stage on this rank that sends or receives.
  int stage = 0;
  // send/recv: the stage on the other side and its rank; -1 for forward/backward.
  int peer_stage = -1;
  int peer_rank = -1;
  // A transfer issued in the same send_recv() call as the transfer right before it.
  bool joins_previous = false;

  bool is_transfer() const { return kind != ActionKind::forward && kind != ActionKind::backward; }
  friend bool operator==(const Action&, const Action&) = default;
};

// The tag both sides of a transfer give Communicator::send_recv: what moves (activation or gradient), the
// micro-batch and the stage it goes from. Micro-batches below 2^20 and stages below 2^11.
uint32_t transfer_tag(const Action& transfer);

struct Schedule {
  ScheduleKind kind = ScheduleKind::one_f_one_b;
  int ranks = 1;
  int stages_per_rank = 1;
  int micro_batches = 1;
  std::vector<std::vector<Action>> actions;  // by pipeline rank

  int stages() const { return ranks * stages_per_rank; }
  int rank_of_stage(int stage) const { return stage % ranks; }
};

// The schedule of `kind` for `ranks` pipeline ranks, `micro_batches` micro-batches (the gradient accumulation
// steps) and `stages_per_rank` virtual stages per rank. Throws ConfigError naming the key and the numbers when the
// shape does not fit the schedule: ranks or micro-batches below 1 (pipeline.stages, gradient_accumulation_steps),
// stages_per_rank other than 1 for gpipe and 1f1b or below 2 for interleaved_1f1b
// (zero3.pipeline_virtual_stages), fewer micro-batches than ranks for 1f1b and interleaved_1f1b, and for
// interleaved_1f1b micro-batches that are not a multiple of the ranks. The result passes validate_schedule().
Schedule make_schedule(ScheduleKind kind, int ranks, int micro_batches, int stages_per_rank = 1);

// Throws InvalidArgument naming the first problem found (the rule, the rank, the action and its position).
void validate_schedule(const Schedule& schedule);

// Every rank's actions on one line, each send_recv() call in brackets; a headline first:
//   1f1b: 2 ranks x 1 stage per rank, 4 micro-batches
//   rank 0: F0 [>a0] F1 [>a1 <g0] B0 ...
// Fm / Bm: forward / backward of micro-batch m (Fm.s with several stages per rank: on stage s); >a / <a: send /
// receive an activation, >g / <g: a gradient (its micro-batch, and .s the stage on this rank).
std::string format_schedule(const Schedule& schedule);

// The bubble: the share of the time steps of a run of the schedule (every action one step, transfers free) in
// which a rank computes nothing, averaged over the ranks; from the same simulation as validate_schedule().
double bubble_fraction(const Schedule& schedule);

}  // namespace zero3::pipeline
