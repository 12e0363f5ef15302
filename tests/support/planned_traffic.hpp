// The engine's traffic against plan_traffic() (include/zero3/traffic_plan.hpp), for the multi-rank tests of the
// layouts and of the quantized collectives, which train the equivalence MLP (support/reference_model.hpp).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "support/reference_model.hpp"
#include "zero3/comm.hpp"
#include "zero3/config.hpp"
#include "zero3/engine.hpp"
#include "zero3/memory_plan.hpp"
#include "zero3/traffic_plan.hpp"

namespace zero3::testing {

// The equivalence MLP as the plans see it: its units and their parameters' shapes.
inline ModelDesc mlp_desc(const MlpDims& dims) {
  ModelDesc m;
  m.name = "mlp";
  for (const std::string& unit : mlp_units()) {
    UnitDesc u{unit, {}};
    for (const MlpParamDesc& p : mlp_params(dims)) {
      if (p.unit == unit) u.params.push_back(p.shape);
    }
    m.units.push_back(std::move(u));
  }
  return m;
}

// Every unit released after use and gathered again (hpZ's backward then reads the secondary partition), small
// reduce buckets (several per step).
inline void tight_schedule(Config& c) {
  c.zero.param_persistence_threshold = 0;
  c.zero.max_reuse_distance = 0;
  c.zero.prefetch_bucket_size = 500;
  c.zero.reduce_bucket_size = 150;
}

// Expects `got` (the engine's counters over `steps` steady optimizer steps of `dims` under `config`) to equal
// `steps` times this rank's traffic in plan_traffic(); returns the plan.
inline TrafficPlan expect_planned_traffic(const ScheduleStats& got, const Config& config, const Communicator& comm,
                                          int ranks_per_node, const MlpDims& dims, int steps) {
  TrafficPlanOptions o;
  o.world_size = comm.size();
  o.ranks_per_node = ranks_per_node;
  TrafficPlan want = plan_traffic(mlp_desc(dims), config, o);
  const RankTraffic& mine = want.ranks[static_cast<size_t>(comm.rank())];
  CollectiveTraffic gathers, reductions;
  for (int s = 0; s < steps; ++s) {
    gathers += mine.gathers;
    reductions += mine.reductions;
  }
  EXPECT_EQ(got.gather_traffic, gathers)
      << "gathers: collectives " << got.gather_traffic.collectives << " vs " << gathers.collectives
      << ", intra-node bytes " << got.gather_traffic.intra_node_bytes << " vs " << gathers.intra_node_bytes
      << ", inter-node bytes " << got.gather_traffic.inter_node_bytes << " vs " << gathers.inter_node_bytes;
  EXPECT_EQ(got.reduce_traffic, reductions)
      << "reductions: collectives " << got.reduce_traffic.collectives << " vs " << reductions.collectives
      << ", intra-node bytes " << got.reduce_traffic.intra_node_bytes << " vs " << reductions.intra_node_bytes
      << ", inter-node bytes " << got.reduce_traffic.inter_node_bytes << " vs " << reductions.inter_node_bytes;
  return want;
}

}  // namespace zero3::testing
