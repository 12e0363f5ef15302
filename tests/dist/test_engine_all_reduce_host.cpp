// Engine::all_reduce_host: the program's own values (the loss, counts) reduced over the ranks through the
// engine's ordered communication queue, at any point between engine calls: inside scopes while overlap_comm's
// thread gathers the next units ahead (stage 3), between scopes, after step(), during evaluation. Results are
// exact (rank r contributes r + 1), and the training the calls are interleaved with ends in the very same
// weights as without them.
// zero3-test-ranks: 1 2 3
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "support/engine_world.hpp"
#include "zero3/engine.hpp"
#include "zero3/error.hpp"

namespace zero3 {
namespace {

using namespace zero3::testing;

constexpr int kUnits = 3;
constexpr int64_t kSide = 200;  // each unit one 200 x 200 parameter: gathers that take a moment

Config chain_config() {
  Config c;
  c.zero.stage = 3;
  c.zero.overlap_comm = true;
  c.zero.overlap_comm_set = true;
  c.zero.prefetch_bucket_size = 10 * kSide * kSide;  // the next units are gathered ahead
  c.zero.param_persistence_threshold = 0;
  c.zero.reduce_bucket_size = kSide * kSide;
  c.train_micro_batch_size_per_gpu = 1;
  c.gradient_accumulation_steps = 2;
  c.optimizer.present = true;
  c.optimizer.lr = 1e-2;
  return c;
}

// Trains 3 optimizer steps on made-up gradients (a rank's gradient depends on its rank); with `reduce`, calls
// all_reduce_host at every kind of point and checks each result. Returns the final weights.
std::map<std::string, std::vector<float>> train(bool reduce, ScheduleStats* stats) {
  auto comm = engine_world();
  const int rank = comm->rank(), world = comm->size();
  const float r1 = static_cast<float>(rank + 1);
  const float sum = static_cast<float>(world * (world + 1) / 2);
  Engine engine(resolved_for(chain_config(), *comm), comm, cpu_device());
  std::vector<UnitId> units;
  for (int u = 0; u < kUnits; ++u) {
    units.push_back(engine.add_unit("u" + std::to_string(u), {{"w", {kSide, kSide}, ParamInit::normal(0.1)}}));
  }
  engine.materialize();
  auto check_sum = [&](const char* where) {
    float v[3] = {r1, -2 * r1, 0.5f};
    engine.all_reduce_host(v, 3);
    EXPECT_EQ(v[0], sum) << where;
    EXPECT_EQ(v[1], -2 * sum) << where;
    EXPECT_EQ(v[2], 0.5f * static_cast<float>(world)) << where;
  };
  for (int micro = 0; micro < 6; ++micro) {
    for (int u = 0; u < kUnits; ++u) {
      auto s = engine.forward_scope(units[static_cast<size_t>(u)]);
      if (reduce && u == 0) check_sum("inside the first forward scope");
    }
    if (reduce) {
      float avg = r1;
      engine.all_reduce_host(&avg, 1, ReduceOp::avg);
      EXPECT_EQ(avg, static_cast<float>(world + 1) / 2) << "between forward and backward";
    }
    for (int u = kUnits - 1; u >= 0; --u) {
      auto s = engine.backward_scope(units[static_cast<size_t>(u)]);
      const float* w = s.param("w").as<float>();
      float* g = s.grad("w").as<float>();
      for (int64_t i = 0; i < kSide * kSide; ++i) g[i] = 0.5f * w[i] + 1e-3f * r1 * static_cast<float>(i % 7);
      if (reduce && u == 1) {
        float mx = static_cast<float>(rank);
        engine.all_reduce_host(&mx, 1, ReduceOp::max);
        EXPECT_EQ(mx, static_cast<float>(world - 1)) << "inside a backward scope";
      }
    }
    engine.step();
    if (reduce) check_sum("after step()");
  }
  if (reduce) {
    EvalMode eval = engine.evaluate();
    { auto s = engine.forward_scope(units[0]); }
    check_sum("during evaluation");
    eval.end();
  }
  if (stats) *stats = engine.schedule_stats();
  std::map<std::string, std::vector<float>> out;
  for (UnitId u : units) {
    std::vector<float> w(static_cast<size_t>(kSide * kSide));
    engine.gather_master_params(u, w.data());
    out[engine.unit(u).name] = std::move(w);
  }
  return out;
}

TEST(EngineAllReduceHost, ExactAnywhereBetweenEngineCallsAndLeavesTrainingAsItWas) {
  ScheduleStats stats;
  const auto plain = train(false, nullptr);
  const auto reduced = train(true, &stats);
  EXPECT_GT(stats.prefetches, 0) << "no unit was gathered ahead: the calls never met the communication thread";
  ASSERT_EQ(plain.size(), reduced.size());
  for (const auto& [name, w] : plain) {
    EXPECT_EQ(reduced.at(name), w) << name << " trained differently with the reductions interleaved";
  }
}

TEST(EngineAllReduceHost, RefusesANullBufferBeforeAnyCollective) {
  auto comm = engine_world();
  Engine engine(resolved_for(chain_config(), *comm), comm, cpu_device());
  EXPECT_THROW(engine.all_reduce_host(nullptr, 2), InvalidArgument);
  // The engine is still usable: the refusal happened before anything was sent.
  float v = 1;
  engine.all_reduce_host(&v, 1);
  EXPECT_EQ(v, static_cast<float>(comm->size()));
  engine.all_reduce_host(nullptr, 0);
}

}  // namespace
}  // namespace zero3
