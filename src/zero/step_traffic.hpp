// The collectives one rank issues in one optimizer step of stage 3, and the bytes it sends in them, split by
// whether the receiving rank is on its node: the ring model of traffic_plan.hpp, counted with count_collective
// exactly as the engine counts ScheduleStats::gather_traffic and reduce_traffic. One function for every layout
// (plain ZeRO-3, hpZ, MiCS and its one-node case HSDP, hierarchical or not) and for ZeRO++'s quantized weights
// (qwZ) and gradients (qgZ).
//
// Per micro-step (grad_accum of them per optimizer step):
//   gathers     each unit's all-gathers, as gather_replay.hpp replays the engine's schedule (forward, and backward
//               unless the unit stayed gathered for its backward scope): S_u elements per rank over the shard group
//               (every rank, or the MiCS shard group); MiCS hierarchical: S_u between the nodes over the group's
//               ranks with this local rank, then one S_u gather per node of the group within the node; hpZ: the
//               first gather of a unit after the optimizer step from the primary partition, every later one from
//               the secondary partition over the hpZ group (P_u / hpz_size elements per rank).
//   reductions  the reducer's reduce-scatter of every unit's gradient over the shard group, in
//               communication_dtype() (Config::communication_dtype), S_u elements per rank.
// Per optimizer step:
//   boundary    MiCS: the all-reduce across replicas of every slice, in buckets of min(reduce_bucket_size, owned
//               elements), each rounded down as the ring formula says; persistent units re-gathered (S_u).
//
// qwZ (weights.bits = 8): every gather from the primary partition (MiCS's both stages included) sends the slice as
// int8 codes plus one fp32 scale per block; the hpZ secondary partition holds 16-bit weights and its gathers stay
// 16-bit. qgZ (gradients.bits = 4 or 8): instead of the reduce-scatter, ZeRO++'s hierarchical all-to-all over the
// shard group: within the node, each rank sends every other rank of its node in the group the quantized part of
// each unit's gradient that rank reduces (P_u / L' elements, L' the group's ranks per node), then across the nodes
// of the group, each rank sends the ranks with its local rank their quantized part of that (S_u elements). An
// all-to-all is not a ring: its bytes count by the node of each receiving peer.
//
// The engine issues qwZ and qgZ once issue 15's engine work lands; until then those figures are ZeRO++'s data flow,
// not a count of what the engine sends.
#pragma once

#include <cstdint>

#include "zero/topology.hpp"
#include "zero3/config.hpp"
#include "zero3/memory_plan.hpp"
#include "zero3/traffic_plan.hpp"

namespace zero3::detail {

// ZeRO++'s block quantization on the wire.
struct WireQuant {
  int bits = 0;          // 0: not quantized; else 8 or 4
  int64_t block = 2048;  // elements per fp32 scale
};

// Bytes of `n` elements on the wire: 16-bit or 32-bit elements unquantized (element_bytes each); quantized, the
// codes (ceil(n * bits / 8) bytes, padded to a multiple of 4) plus 4 bytes per block of `block` elements.
int64_t wire_bytes(int64_t n, int64_t element_bytes, const WireQuant& q);

struct StepTrafficOptions {
  int grad_accum = 1;   // micro-steps per optimizer step
  WireQuant weights;    // qwZ
  WireQuant gradients;  // qgZ
};

struct StepTraffic {
  CollectiveTraffic forward_gathers;   // over the step's micro-steps
  CollectiveTraffic backward_gathers;  // over the step's micro-steps
  CollectiveTraffic reductions;        // over the step's micro-steps
  CollectiveTraffic boundary;          // once per step
  // Elements of this rank's own slices read by gathers from the primary partition in one step: what parameter
  // offload copies from host memory to the device before those gathers.
  int64_t primary_slice_elements = 0;
  int64_t owned_elements = 0;  // elements of this rank's slices over all units: the optimizer's range

  CollectiveTraffic total() const;
};

// `config` must be resolved (stage3_prefetch_bucket_size, stage3_param_persistence_threshold and
// reduce_bucket_size set) and at stage 3; else ConfigError naming the key. `layout` is make_shard_layout's for the
// config; `rank` a rank of it. Throws InvalidArgument for a model without units, a rank outside the world, a
// grad_accum below 1, or quantization bits other than 0, 4 and 8 (weights: 0 or 8) or a block below 1.
StepTraffic plan_step_traffic(const ModelDesc& model, const Config& config, const ShardLayout& layout, int rank,
                              const StepTrafficOptions& options);

}  // namespace zero3::detail
