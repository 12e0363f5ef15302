// The ranks' action lists run against each other (pipeline_schedule.hpp, "Validation"): the checks of every list
// on its own, the matching of sends and receives, and the run in rounds that finds a deadlock (validate_schedule(),
// bubble_fraction()).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "zero3/pipeline_schedule.hpp"

namespace zero3::pipeline::detail {

// partners[r][i] = (peer rank, index of the counterpart there) for transfer i of rank r.
using Partners = std::vector<std::vector<std::pair<int, size_t>>>;

// "forward of micro-batch 2 on stage 1", "send of the activation of micro-batch 0 on stage 0 to rank 1".
std::string describe(const Action& action);

// Checks each action and the order of each rank's list, and matches the k-th send from a to b with b's k-th
// receive from a. Throws InvalidArgument naming the schedule, the rank, the action and the rule.
Partners check_and_match(const Schedule& schedule);

// Runs the lists in rounds: every transfer whose counterpart is posted too (in the peer's current batch) completes,
// a batch whose transfers all completed finishes (transfers cost nothing), then every rank whose next action
// computes runs it. Returns the number of rounds with a computation; throws InvalidArgument naming every waiting
// rank and its action on a deadlock.
int run(const Schedule& schedule, const Partners& partners);

}  // namespace zero3::pipeline::detail
