// format_schedule(): one line per rank, the notation in pipeline_schedule.hpp.
#include <string>

#include "zero3/pipeline_schedule.hpp"

namespace zero3::pipeline {
namespace {

std::string token(const Action& a, bool show_stage) {
  std::string t;
  switch (a.kind) {
    case ActionKind::forward:
      t = "F";
      break;
    case ActionKind::backward:
      t = "B";
      break;
    case ActionKind::send_activation:
      t = ">a";
      break;
    case ActionKind::recv_activation:
      t = "<a";
      break;
    case ActionKind::send_gradient:
      t = ">g";
      break;
    case ActionKind::recv_gradient:
      t = "<g";
      break;
  }
  t += std::to_string(a.micro_batch);
  if (show_stage) t += "." + std::to_string(a.stage);
  return t;
}

}  // namespace

std::string format_schedule(const Schedule& s) {
  const bool show_stage = s.stages_per_rank > 1;
  std::string out = std::string(schedule_name(s.kind)) + ": " + std::to_string(s.ranks) + " rank" +
                    (s.ranks == 1 ? "" : "s") + " x " + std::to_string(s.stages_per_rank) + " stage" +
                    (s.stages_per_rank == 1 ? "" : "s") + " per rank, " + std::to_string(s.micro_batches) +
                    " micro-batch" + (s.micro_batches == 1 ? "" : "es") + "\n";
  for (size_t r = 0; r < s.actions.size(); ++r) {
    out += "rank " + std::to_string(r) + ":";
    bool in_batch = false;
    for (const Action& a : s.actions[r]) {
      if (in_batch && (!a.is_transfer() || !a.joins_previous)) {
        out += "]";
        in_batch = false;
      }
      if (a.is_transfer() && !in_batch) {
        out += " [";
        in_batch = true;
      }
      out += (out.back() == '[' ? "" : " ") + token(a, show_stage);
    }
    if (in_batch) out += "]";
    out += "\n";
  }
  return out;
}

}  // namespace zero3::pipeline
