// ZeRO++'s quantized collectives in the engine (docs/quantization.md): qwZ (int8 parameter gathers) and qgZ (int4
// two-stage all-to-all gradient reduction), alone and together, with plain ZeRO-3, hpZ, HSDP and MiCS's hierarchical
// gather, on one node (2-4 ranks) and on nodes simulated by `zero3 launch --simulate-nodes` (2 x 2 and 3 x 2):
//   - the engine's byte counters equal plan_traffic() step for step;
//   - the forward sees each weight within the int8 block bound of its bf16 value, and the fp32 master never takes
//     the quantized values (with a learning rate of 1e-6 it moves by Adam's steps only);
//   - the equivalence model trains to losses within a stated bound of the same run unquantized.
// zero3-test-ranks: 2 3 4
// zero3-test-nodes: 2x2 3x2
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <ostream>
#include <string>

#include "support/engine_world.hpp"
#include "support/layouts.hpp"
#include "support/mlp_trainer.hpp"
#include "support/planned_traffic.hpp"
#include "zero3/comm.hpp"
#include "zero3/dtype.hpp"
#include "zero3/engine.hpp"
#include "zero3/traffic_plan.hpp"

using namespace zero3;
using namespace zero3::testing;

namespace {

// Small blocks, so that slices hold several blocks and a partial one.
void qwz(Config& c) {
  c.zero.quantized_weights = true;
  c.zero3.qwz_block_size = 16;
}
void qgz(Config& c) {
  c.zero.quantized_gradients = true;
  c.zero3.qgz_block_size = 32;
}
void both(Config& c) {
  qwz(c);
  qgz(c);
}

Config bf16_config() {
  Config c = equivalence_config(3);
  c.bf16.enabled = true;
  return c;
}

void train_step(Engine& engine, const MlpUnits& units, const TrainPlan& plan, int64_t step) {
  const int64_t gas = engine.gradient_accumulation_steps();
  for (int64_t micro = 0; micro < gas; ++micro) {
    Batch b = make_batch(plan.dims, plan.data_seed, batch_index(step, micro, gas, engine.rank(), engine.world_size()),
                         plan.micro_batch);
    mlp_micro_step(engine, units, plan.dims, b);
    engine.step();
  }
}

TEST(QuantizedTraffic, TheEngineCountsWhatThePlanPredicts) {
  auto comm = engine_world();
  const LauncherNodes n = launcher_nodes();
  TrainPlan plan;
  plan.world = comm->size();
  const std::vector<std::pair<std::string, LayoutSetter>> layouts = {{"plain", plain_layout},
                                                                     {"hpz", hpz_layout},
                                                                     {"hsdp", hsdp_layout},
                                                                     {"mics_hierarchical", mics_hierarchical_layout}};
  const std::vector<std::pair<std::string, std::function<void(Config&)>>> quant = {
      {"qwz", qwz}, {"qgz", qgz}, {"qwz+qgz", both}};
  for (const auto& [name, layout] : layouts) {
    for (const auto& [qname, q] : quant) {
      for (bool tight : {false, true}) {
        Config c = bf16_config();
        c.gradient_accumulation_steps = 3;
        if (tight) tight_schedule(c);
        q(c);
        if (!layout(c)) continue;
        SCOPED_TRACE(name + " + " + qname + (tight ? " (tight schedule)" : ""));
        Engine engine(resolved_for(c, *comm), comm, cpu_device());
        MlpUnits units = declare_mlp(engine, plan.dims);
        engine.materialize();
        train_step(engine, units, plan, 0);  // the first step records the order; the steady state follows
        engine.reset_schedule_stats();
        train_step(engine, units, plan, 1);
        train_step(engine, units, plan, 2);
        const TrafficPlan want =
            expect_planned_traffic(engine.schedule_stats(), c, *comm, n.per_node, plan.dims, /*steps=*/2);
        const RankTraffic& mine = want.ranks[static_cast<size_t>(comm->rank())];
        // Against the same run unquantized: qwZ sends about half the gather bytes, qgZ fewer reduction bytes.
        Config u = c;
        u.zero.quantized_weights = u.zero.quantized_gradients = false;
        TrafficPlanOptions o;
        o.world_size = comm->size();
        o.ranks_per_node = n.per_node;
        const TrafficPlan unquantized = plan_traffic(mlp_desc(plan.dims), u, o);
        const RankTraffic& plain_rank = unquantized.ranks[static_cast<size_t>(comm->rank())];
        const int64_t qg = mine.gathers.intra_node_bytes + mine.gathers.inter_node_bytes;
        const int64_t pg = plain_rank.gathers.intra_node_bytes + plain_rank.gathers.inter_node_bytes;
        const int64_t qr = mine.reductions.intra_node_bytes + mine.reductions.inter_node_bytes;
        const int64_t pr = plain_rank.reductions.intra_node_bytes + plain_rank.reductions.inter_node_bytes;
        if (c.zero.quantized_weights) {
          EXPECT_LT(qg, pg * 3 / 4) << "qwZ gathers " << qg << " bytes, plain " << pg;
        }
        if (c.zero.quantized_gradients) {
          EXPECT_LT(qr, pr) << "qgZ reduces " << qr << " bytes, plain " << pr;
        }
      }
    }
  }
}

// The weights the forward computes with are the int8 round trip of the bf16 weights: within half a step of each
// block's scale (plus the roundings), and not all equal to them (the quantization is on). Under every layout: MiCS's
// gathers (HSDP, and the hierarchical gather through both of its stages) quantize each rank's slice of its shard
// group as plain ZeRO-3's do, which DeepSpeed's MiCS does not (its gathers never quantize).
TEST(QuantizedWeights, TheForwardSeesEachWeightWithinTheBlockBound) {
  auto comm = engine_world();
  TrainPlan plan;
  plan.world = comm->size();
  const std::vector<std::pair<std::string, LayoutSetter>> layouts = {
      {"plain", plain_layout}, {"hsdp", hsdp_layout}, {"mics_hierarchical", mics_hierarchical_layout}};
  for (const auto& [name, layout] : layouts) {
    Config c = bf16_config();
    tight_schedule(c);
    qwz(c);
    if (!layout(c)) continue;
    SCOPED_TRACE(name);
    Engine engine(resolved_for(c, *comm), comm, cpu_device());
    MlpUnits units = declare_mlp(engine, plan.dims);
    engine.materialize();
    train_step(engine, units, plan, 0);
    int64_t changed = 0, total = 0;
    for (UnitId unit : {units.fc1, units.norm, units.fc2, units.head}) {
      const UnitInfo& info = engine.unit(unit);
      std::vector<float> master(static_cast<size_t>(info.numel));
      engine.gather_master_params(unit, master.data());
      const int64_t slice = info.slice_numel;
      const int64_t slices = info.padded_numel / slice;  // the ranks the unit is partitioned over
      EXPECT_EQ(slices, c.zero.mics_shard_size > 0 ? c.zero.mics_shard_size : comm->size());
      auto scope = engine.forward_scope(unit);
      const TensorView flat = scope.flat_params();
      ASSERT_EQ(flat.dtype, DType::bf16);
      const auto* got = static_cast<const uint16_t*>(flat.data);
      for (int64_t r = 0; r < slices; ++r) {
        for (int64_t b0 = r * slice; b0 < std::min((r + 1) * slice, info.numel); b0 += c.zero3.qwz_block_size) {
          const int64_t b1 = std::min({b0 + c.zero3.qwz_block_size, (r + 1) * slice, info.numel});
          float amax = 0;
          for (int64_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(bf16_to_f32(f32_to_bf16(master[i]))));
          for (int64_t i = b0; i < b1; ++i) {
            const float x = bf16_to_f32(f32_to_bf16(master[static_cast<size_t>(i)]));
            const float y = bf16_to_f32(got[i]);
            const double bound = amax / 127.0 / 2 + amax * std::ldexp(1.0, -21) + std::fabs(y) * std::ldexp(1.0, -8);
            EXPECT_LE(std::fabs(x - y), bound) << info.name << " element " << i << " (block amax " << amax << ")";
            changed += x != y;
            ++total;
          }
        }
      }
    }
    EXPECT_GT(changed, total / 4) << "the gathered weights should be the int8 round trip, not the bf16 weights";
  }
}

// With a learning rate of 1e-6 Adam moves each master weight by a few 1e-6 per step; a master that took the
// dequantized values would jump by up to half an int8 step (about 1e-3 of the block's largest weight).
TEST(QuantizedWeights, TheMasterWeightsNeverTakeQuantizedValues) {
  auto comm = engine_world();
  TrainPlan plan;
  plan.world = comm->size();
  Config c = bf16_config();
  both(c);
  c.optimizer.lr = 1e-6;
  c.optimizer.weight_decay = 0;
  c.scheduler.type = SchedulerType::none;
  Engine engine(resolved_for(c, *comm), comm, cpu_device());
  MlpUnits units = declare_mlp(engine, plan.dims);
  engine.materialize();
  const auto before = gather_params(engine);
  constexpr int kSteps = 3;
  for (int64_t step = 0; step < kSteps; ++step) train_step(engine, units, plan, step);
  const auto after = gather_params(engine);
  int64_t moved = 0, total = 0;
  for (const auto& [name, b] : before) {
    const std::vector<float>& a = after.at(name);
    for (size_t i = 0; i < b.size(); ++i) {
      // Adam's step with bias correction is at most about lr * sqrt(1 - beta2^t) / (1 - beta1^t) <= 3 lr here.
      EXPECT_LE(std::fabs(a[i] - b[i]), kSteps * 3e-6 + 1e-9) << name << " element " << i;
      moved += a[i] != b[i];
      ++total;
    }
  }
  EXPECT_GT(moved, total / 2) << "the optimizer should have moved the weights";
}

struct Convergence {
  std::string name;
  LayoutSetter layout;
  std::function<void(Config&)> quantize;
  double bound;  // relative, on every micro-step's loss against the unquantized run
};
void PrintTo(const Convergence& v, std::ostream* os) { *os << v.name; }

class QuantizedTraining : public ::testing::TestWithParam<Convergence> {};

// The equivalence model, 10 optimizer steps of 2 micro-steps, quantized and not, on the same layout and data.
TEST_P(QuantizedTraining, LossesStayWithinTheBoundOfTheUnquantizedRun) {
  const Convergence& v = GetParam();
  auto comm = engine_world();
  Config probe;
  if (!v.layout(probe)) GTEST_SKIP() << v.name << " does not fit this world";
  TrainPlan plan;
  plan.world = comm->size();
  plan.steps = 10;
  auto run = [&](bool quantized) {
    Config c = bf16_config();
    v.layout(c);
    if (quantized) v.quantize(c);
    Engine engine(resolved_for(c, *comm), comm, cpu_device());
    MlpUnits units = declare_mlp(engine, plan.dims);
    engine.materialize();
    return train_mlp(engine, units, plan);
  };
  const EngineRun base = run(false), q = run(true);
  ASSERT_EQ(base.losses.size(), q.losses.size());
  double worst = 0;
  for (size_t i = 0; i < base.losses.size(); ++i) {
    const double err = std::fabs(q.losses[i] - base.losses[i]) / std::fabs(base.losses[i]);
    worst = std::max(worst, err);
    EXPECT_LE(err, v.bound) << "micro-step " << i << ": " << q.losses[i] << " vs " << base.losses[i];
  }
  // Over every rank: the mean loss of the first and the last optimizer step, quantized and not.
  const size_t gas = 2, last = base.losses.size() - gas;
  float means[4] = {static_cast<float>(q.losses[0] + q.losses[1]),
                    static_cast<float>(q.losses[last] + q.losses[last + 1]),
                    static_cast<float>(base.losses[0] + base.losses[1]),
                    static_cast<float>(base.losses[last] + base.losses[last + 1])};
  comm->all_reduce(means, 4, DType::f32, ReduceOp::sum)->wait();
  for (float& m : means) m /= static_cast<float>(gas * static_cast<size_t>(comm->size()));
  EXPECT_GE(means[0] - means[1], 0.5 * (means[2] - means[3]))
      << "the quantized run should converge at least half as far as the unquantized one";
  EXPECT_LE(std::fabs(means[1] - means[3]), v.bound * means[3]) << "final mean loss " << means[1] << " vs " << means[3];
  if (comm->rank() == 0) {
    std::printf(
        "%s: mean loss of step 1 %.5f / %.5f, of step %lld %.5f / %.5f (quantized / not); worst relative "
        "micro-step difference on rank 0 %.4f\n",
        v.name.c_str(), means[0], means[2], static_cast<long long>(plan.steps), means[1], means[3], worst);
  }
  ::testing::Test::RecordProperty("max_relative_loss_error", ::testing::PrintToString(worst));
}

// The bounds (docs/quantization.md, "Training"): twice the largest difference measured on 2-4 ranks and on the
// simulated 2 x 2 and 3 x 2 nodes.
const Convergence kRuns[] = {
    {"qwz", plain_layout, qwz, 0.04},          {"qgz", plain_layout, qgz, 0.04},
    {"qwz_qgz", plain_layout, both, 0.06},     {"hpz_qwz", hpz_layout, qwz, 0.04},
    {"hpz_qgz", hpz_layout, qgz, 0.04},        {"hpz_qwz_qgz", hpz_layout, both, 0.06},
    {"hsdp_qwz_qgz", hsdp_layout, both, 0.06}, {"mics_hierarchical_qwz_qgz", mics_hierarchical_layout, both, 0.06},
};

INSTANTIATE_TEST_SUITE_P(Engine, QuantizedTraining, ::testing::ValuesIn(kRuns),
                         [](const ::testing::TestParamInfo<Convergence>& info) { return info.param.name; });

}  // namespace
