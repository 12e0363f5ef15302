// Meta initialisation on 1-4 ranks: every rank fills only its own slice, and the model is the same bits
// whatever the world size (the values are compared with the generator itself, element by element). A
// reader init is asked for each element exactly once over all ranks, and only for elements of the asking
// rank's slice. Units smaller than the world leave some ranks with padding only.
// zero3-test-ranks: 1 2 3 4
#include <gtest/gtest.h>

#include "kernels/philox_init.hpp"
#include "support/engine_world.hpp"
#include "support/mlp_trainer.hpp"
#include "zero3/engine.hpp"

using namespace zero3;
using namespace zero3::testing;

namespace {

FillSpec spec(FillKind kind, double a = 0, double b = 0) {
  FillSpec s;
  s.kind = kind;
  s.value = a;
  s.mean = a;
  s.stddev = b;
  s.low = a;
  s.high = b;
  return s;
}

struct Declared {
  UnitId big, tiny, mixed;
  std::vector<std::pair<std::string, FillSpec>> expected;  // by full name, in declaration order
};

// Returns what each parameter must hold; `asked` collects the reader's ranges.
Declared declare(Engine& e, std::vector<std::pair<int64_t, int64_t>>* asked) {
  Declared d;
  d.big = e.add_unit("big", {{"n", {17, 23}, ParamInit::normal(0.02, 0.5)}, {"u", {31}, ParamInit::uniform(-3, 2)}});
  d.tiny = e.add_unit("tiny", {{"one", {1}, ParamInit::ones()}, {"c", {1}, ParamInit::constant(0.1)}});
  d.mixed = e.add_unit("mixed");
  e.add_param(d.mixed, {"z", {5}, ParamInit::zeros()});
  e.add_param(d.mixed, {"r", {3, 7}, ParamInit::from_reader([asked](int64_t b, int64_t end, float* out) {
                          asked->emplace_back(b, end);
                          for (int64_t i = b; i < end; ++i) out[i - b] = 1000.0f + static_cast<float>(i);
                        })});
  d.expected = {{"big.n", spec(FillKind::normal, 0.5, 0.02)},
                {"big.u", spec(FillKind::uniform, -3, 2)},
                {"tiny.one", spec(FillKind::ones)},
                {"tiny.c", spec(FillKind::constant, 0.1)},
                {"mixed.z", spec(FillKind::zeros)}};
  return d;
}

// The value element i of parameter `name` must have.
float expected_value(const Declared& d, const std::string& name, int64_t i, uint64_t seed) {
  if (name == "mixed.r") return 1000.0f + static_cast<float>(i);
  for (const auto& [n, s] : d.expected) {
    if (n == name) return philox_fill_value(s, seed, philox_stream_id(n), static_cast<uint64_t>(i));
  }
  ADD_FAILURE() << "no expectation for " << name;
  return 0;
}

class Init : public ::testing::TestWithParam<int> {};

TEST_P(Init, SameBitsOnEveryWorldSize) {
  auto comm = engine_world();
  Config c = equivalence_config(GetParam());
  c.zero3.seed = 99;
  Engine e(resolved_for(c, *comm), comm, cpu_device());
  std::vector<std::pair<int64_t, int64_t>> asked;
  Declared d = declare(e, &asked);
  e.materialize();

  // Each rank's master slice holds exactly the generator's values at its offsets, and zeros in the padding.
  for (UnitId u : {d.big, d.tiny, d.mixed}) {
    const UnitInfo& info = e.unit(u);
    ShardView shard = e.local_shard(u);
    SliceInfo slice = e.slice(u, comm->rank());
    if (GetParam() >= 1) {
      EXPECT_EQ(shard.begin, slice.offset);
      EXPECT_EQ(shard.length, slice.size);
    } else {
      EXPECT_EQ(shard.begin, 0);
      EXPECT_EQ(shard.length, info.padded_numel);
    }
    std::vector<bool> covered(static_cast<size_t>(shard.length), false);
    for (const ParamSlice& ps : e.slice_params(u, comm->rank())) {
      const ParamInfo& p = e.param(ps.param);
      for (int64_t i = ps.param_begin; i < ps.param_end; ++i) {
        int64_t local = ps.slice_offset + (i - ps.param_begin) + (slice.offset - shard.begin);
        covered[static_cast<size_t>(local)] = true;
        ASSERT_EQ(shard.master[local], expected_value(d, p.name, i, c.zero3.seed)) << p.name << "[" << i << "]";
      }
    }
    if (GetParam() >= 1) {
      for (int64_t i = 0; i < shard.length; ++i) {
        if (!covered[static_cast<size_t>(i)]) {
          EXPECT_EQ(shard.master[i], 0.0f) << info.name << " padding element " << i;
          EXPECT_GE(shard.begin + i, info.numel) << "uncovered element inside the unit";
        }
      }
    }
  }

  // The gathered model is the same bits as the generator, on every rank.
  auto params = gather_params(e);
  for (const auto& [name, values] : params) {
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_EQ(values[i], expected_value(d, name, static_cast<int64_t>(i), c.zero3.seed)) << name << "[" << i << "]";
    }
  }

  // The reader was asked for each element exactly once over the ranks (sum of coverage counts).
  std::vector<float> count(21, 0.0f);
  for (auto [b, end] : asked) {
    const int64_t offset = e.param(*e.find_param("mixed.r")).offset;
    if (GetParam() >= 1) {
      SliceInfo s = e.slice(d.mixed, comm->rank());
      EXPECT_GE(offset + b, s.offset);
      EXPECT_LE(offset + end, s.offset + s.size);
    }
    for (int64_t i = b; i < end; ++i) count[static_cast<size_t>(i)] += 1.0f;
  }
  if (GetParam() >= 1) comm->all_reduce(count.data(), count.size(), DType::f32, ReduceOp::sum)->wait();
  for (float x : count) EXPECT_EQ(x, 1.0f);

  // Scopes show the compute copy: here fp32, equal to the master.
  {
    auto s = e.forward_scope(d.big);
    TensorView n = s.param("n");
    ASSERT_EQ(n.numel, 17 * 23);
    EXPECT_EQ(n.shape[0], 17);
    EXPECT_EQ(n.shape[1], 23);
    for (int64_t i = 0; i < n.numel; ++i) ASSERT_EQ(n.as<float>()[i], params["big.n"][static_cast<size_t>(i)]);
  }
}

TEST_P(Init, Bf16ComputeCopiesAreRoundedMasters) {
  auto comm = engine_world();
  Config c = equivalence_config(GetParam());
  c.bf16.enabled = true;
  Engine e(resolved_for(c, *comm), comm, cpu_device());
  std::vector<std::pair<int64_t, int64_t>> asked;
  Declared d = declare(e, &asked);
  e.materialize();
  auto params = gather_params(e);
  auto s = e.forward_scope(d.big);
  TensorView n = s.param("n");
  ASSERT_EQ(n.dtype, DType::bf16);
  for (int64_t i = 0; i < n.numel; ++i) {
    ASSERT_EQ(n.as<uint16_t>()[i], f32_to_bf16(params["big.n"][static_cast<size_t>(i)])) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, Init, ::testing::Values(0, 1, 3));

}  // namespace
