// Stage 3's persistence decision, said once at materialize: which units stay gathered for good and why.
#pragma once

#include <cstdint>
#include <vector>

#include "zero/engine_impl.hpp"

namespace zero3::detail {

// Logs on rank 0 (info) the units of `units` marked persistent, their elements and the thresholds that decided
// it (or that none is); and warns when every unit is persistent on more than one rank, since stage 3 then holds
// the full parameters on every rank as stage 2 does.
void log_persistence(const std::vector<UnitState>& units, int64_t threshold, int64_t model_threshold, int world);

}  // namespace zero3::detail
