// validate_schedule() and bubble_fraction(): the run of schedule_simulation.hpp.
#include "pipeline/schedule_simulation.hpp"
#include "zero3/pipeline_schedule.hpp"

namespace zero3::pipeline {

void validate_schedule(const Schedule& schedule) { detail::run(schedule, detail::check_and_match(schedule)); }

double bubble_fraction(const Schedule& schedule) {
  const int rounds = detail::run(schedule, detail::check_and_match(schedule));
  size_t computes = 0;
  for (const auto& list : schedule.actions) {
    for (const Action& a : list) computes += a.is_transfer() ? 0 : 1;
  }
  if (rounds == 0) return 0.0;
  return 1.0 - static_cast<double>(computes) / (static_cast<double>(rounds) * schedule.ranks);
}

}  // namespace zero3::pipeline
