// Helpers of the checkpoint tests: training the equivalence MLP over a range of optimizer steps (so a run can
// stop, save, and go on in a fresh engine), a scratch directory every rank of a job shares, the full Adam
// state of a unit, and exact comparisons.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "support/engine_world.hpp"
#include "support/mlp_trainer.hpp"
#include "support/reference_model.hpp"
#include "zero3/checkpoint.hpp"
#include "zero3/comm.hpp"
#include "zero3/engine.hpp"

namespace zero3::testing {

// Losses of optimizer steps [first_step, first_step + steps), every micro-step of each, in order. The data of
// step t is the same whether the run started at 0 or resumed at t.
inline std::vector<double> train_steps(Engine& engine, const MlpUnits& units, const TrainPlan& plan, int64_t first_step,
                                       int64_t steps) {
  std::vector<double> losses;
  const int64_t gas = engine.gradient_accumulation_steps();
  for (int64_t step = first_step; step < first_step + steps; ++step) {
    for (int64_t micro = 0; micro < gas; ++micro) {
      Batch b = make_batch(plan.dims, plan.data_seed, batch_index(step, micro, gas, engine.rank(), engine.world_size()),
                           plan.micro_batch);
      losses.push_back(mlp_micro_step(engine, units, plan.dims, b));
      engine.step();
    }
  }
  return losses;
}

// An engine holding the MLP, materialized.
struct MlpEngine {
  std::unique_ptr<Engine> engine;
  MlpUnits units;
};

inline MlpEngine make_mlp_engine(const Config& config, std::shared_ptr<Communicator> comm, Device& device,
                                 const MlpDims& dims = {}) {
  MlpEngine m;
  const Config resolved = resolved_for(config, *comm);
  m.engine = std::make_unique<Engine>(resolved, std::move(comm), device);
  m.units = declare_mlp(*m.engine, dims);
  m.engine->materialize();
  return m;
}

// A directory under $TMPDIR (or /tmp) that every rank of `comm` uses: rank 0 creates it and broadcasts the
// path (host memory: gloo or local). Rank 0 removes it when the object goes away.
class SharedTempDir {
 public:
  SharedTempDir(Communicator& comm, const std::string& prefix) : comm_(comm) {
    char buf[512] = {};
    if (comm.rank() == 0) {
      const char* base = std::getenv("TMPDIR");
      std::string tmpl = std::string(base && *base ? base : "/tmp") + "/" + prefix + "-XXXXXX";
      if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp " + tmpl + " failed");
      std::strncpy(buf, tmpl.c_str(), sizeof(buf) - 1);
    }
    comm.broadcast(buf, sizeof(buf) / 4, DType::f32, 0)->wait();
    path_ = buf;
  }
  ~SharedTempDir() {
    try {
      comm_.barrier();
    } catch (...) {
    }
    if (comm_.rank() == 0 && std::getenv("ZERO3_TEST_KEEP_DIRS") == nullptr) {
      std::error_code ec;
      std::filesystem::remove_all(path_, ec);
    }
  }
  SharedTempDir(const SharedTempDir&) = delete;
  SharedTempDir& operator=(const SharedTempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  Communicator& comm_;
  std::filesystem::path path_;
};

// The whole of one state array (exp_avg, exp_avg_sq or master) of a unit, assembled from every rank's slice
// (collective over the engine's communicator; host memory). Under MiCS the first shard group's slices make it.
inline std::vector<float> gather_state(Engine& engine, UnitId unit, int part /* 0 master, 1 exp_avg, 2 exp_avg_sq */) {
  const UnitInfo& u = engine.unit(unit);
  const ShardView v = engine.local_shard(unit);
  const float* src = part == 0 ? v.master : part == 1 ? v.exp_avg : v.exp_avg_sq;
  if (v.length >= u.padded_numel && engine.world_size() > 1) {  // replicated (stage 0)
    return std::vector<float>(src, src + u.numel);
  }
  std::vector<float> all(static_cast<size_t>(u.slice_numel) * static_cast<size_t>(engine.world_size()));
  engine.communicator().all_gather_into(all.data(), src, static_cast<size_t>(u.slice_numel), DType::f32)->wait();
  all.resize(static_cast<size_t>(u.numel));
  return all;
}

// Every unit's three state arrays, keyed "<unit>.<part>".
inline std::map<std::string, std::vector<float>> gather_all_state(Engine& engine) {
  static const char* kParts[] = {"master", "exp_avg", "exp_avg_sq"};
  std::map<std::string, std::vector<float>> out;
  for (size_t i = 0; i < engine.num_units(); ++i) {
    const UnitId id{static_cast<int32_t>(i)};
    for (int part = 0; part < 3; ++part)
      out[engine.unit(id).name + "." + kParts[part]] = gather_state(engine, id, part);
  }
  return out;
}

// The state of the named units ("<unit>.<part>", `units`: name and numel) on every rank of `world`, whichever engine
// holds each (a pipeline's stages): a unit's holders gather it over their engine's communicator, and its holder of
// engine rank 0 broadcasts it over the world (host memory). `engine` is null on ranks without one. Collective over the
// world.
inline std::map<std::string, std::vector<float>> world_state(
    Engine* engine, Communicator& world, const std::vector<std::pair<std::string, int64_t>>& units) {
  static const char* kParts[] = {"master", "exp_avg", "exp_avg_sq"};
  std::map<std::string, std::vector<float>> out;
  if (engine) (void)engine->communicator();  // its queued collectives first (an Engine over the world shares it)
  for (const auto& [name, numel] : units) {
    const std::optional<UnitId> id = engine ? engine->find_unit(name) : std::nullopt;
    float root = id && engine->rank() == 0 ? static_cast<float>(world.rank() + 1) : 0.0f;
    world.all_reduce(&root, 1, DType::f32, ReduceOp::sum)->wait();
    for (int part = 0; part < 3; ++part) {
      std::vector<float> v(static_cast<size_t>(numel));
      if (id) v = gather_state(*engine, *id, part);
      world.broadcast(v.data(), v.size(), DType::f32, static_cast<int>(root) - 1)->wait();
      out[name + "." + kParts[part]] = std::move(v);
    }
  }
  return out;
}

// "" when `a` and `b` hold the same names and bit-identical values, else the first difference.
inline std::string first_bit_difference(const std::map<std::string, std::vector<float>>& a,
                                        const std::map<std::string, std::vector<float>>& b) {
  if (a.size() != b.size())
    return "different tensor counts " + std::to_string(a.size()) + " and " + std::to_string(b.size());
  for (const auto& [name, av] : a) {
    auto it = b.find(name);
    if (it == b.end()) return "'" + name + "' missing on one side";
    if (it->second.size() != av.size()) return "'" + name + "' has different sizes";
    for (size_t i = 0; i < av.size(); ++i) {
      if (std::memcmp(&av[i], &it->second[i], sizeof(float)) != 0) {
        return name + "[" + std::to_string(i) + "]: " + std::to_string(av[i]) + " vs " + std::to_string(it->second[i]);
      }
    }
  }
  return "";
}

// Two runs of the same training are the same bits: losses, gradient norms, applied steps and final weights.
inline void expect_same_run(const EngineRun& got, const EngineRun& want) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < got.losses.size(); ++i) {
    EXPECT_EQ(got.losses[i], want.losses[i]) << "micro-step " << i;
  }
  ASSERT_EQ(got.steps.size(), want.steps.size());
  for (size_t i = 0; i < got.steps.size(); ++i) {
    EXPECT_EQ(got.steps[i].grad_norm, want.steps[i].grad_norm) << "micro-step " << i;
    EXPECT_EQ(got.steps[i].applied, want.steps[i].applied) << "micro-step " << i;
  }
  EXPECT_EQ(first_bit_difference(got.params, want.params), "");
}

}  // namespace zero3::testing
