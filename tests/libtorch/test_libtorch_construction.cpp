// Building a model one unit at a time (UnitFactory): a stack of 8 blocks, each built by a factory, is never more than
// one block at full size on any rank (counted on the modules the factories make, at wrapping and in materialize()),
// and it starts from the same weights, draws the same random numbers afterwards and trains to the same losses as the
// same model built whole.
// zero3-test-ranks: 1 2
#include <gtest/gtest.h>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>

#include "support/engine_world.hpp"
#include "support/libtorch_training.hpp"

namespace zero3::testing {
namespace {

using libtorch::ShardedModel;
using libtorch::UnitFactory;
using libtorch::WrapOptions;

constexpr int64_t kWidth = 16, kBlocks = 8;

struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : up(register_module("up", torch::nn::Linear(kWidth, 2 * kWidth))),
        down(register_module("down", torch::nn::Linear(2 * kWidth, kWidth))) {}
  at::Tensor forward(const at::Tensor& x) { return x + down(torch::gelu(up(x))); }
  torch::nn::Linear up, down;
};
TORCH_MODULE(Block);

// The stem and the head are built with the model; the blocks by the test (whole, or by factories).
struct StackImpl : torch::nn::Module {
  StackImpl()
      : stem(register_module("stem", torch::nn::Linear(4, kWidth))),
        head(register_module("head", torch::nn::Linear(kWidth, 3))),
        blocks(register_module("blocks", torch::nn::ModuleList())) {}
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = zero3::libtorch::call(stem, x);
    for (const auto& block : *blocks) h = zero3::libtorch::call(block->as<BlockImpl>(), h);
    return zero3::libtorch::call(head, h);
  }
  torch::nn::Linear stem, head;
  torch::nn::ModuleList blocks;
};
TORCH_MODULE(Stack);

int64_t storage_bytes(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const at::Tensor& t : m.parameters()) n += static_cast<int64_t>(t.storage().nbytes());
  return n;
}

// The modules the factories made: how many held their parameters at once, and how many bytes.
struct Census {
  std::vector<std::weak_ptr<torch::nn::Module>> made;
  int64_t calls = 0, peak_full = 0, peak_bytes = 0;

  std::shared_ptr<torch::nn::Module> make() {
    ++calls;
    auto block = Block().ptr();
    int64_t full = 0, bytes = 0;
    made.push_back(block);
    for (const auto& w : made) {
      if (auto m = w.lock()) {
        const int64_t b = storage_bytes(*m);
        full += b > 0 ? 1 : 0;
        bytes += b;
      }
    }
    peak_full = std::max(peak_full, full);
    peak_bytes = std::max(peak_bytes, bytes);
    return block;
  }
};

std::unique_ptr<Engine> make_engine(const std::shared_ptr<Communicator>& comm) {
  TrainSpec spec;
  spec.world = comm->size();
  return std::make_unique<Engine>(resolved_for(libtorch_test_config(3, spec), *comm), comm, cpu_device());
}

std::vector<std::string> block_paths() {
  std::vector<std::string> out;
  for (int64_t i = 0; i < kBlocks; ++i) out.push_back("blocks." + std::to_string(i));
  return out;
}

std::vector<double> train(ShardedModel& sharded, Stack& model) {
  std::vector<double> losses;
  Engine& engine = sharded.engine();
  for (int64_t step = 0; step < 3; ++step) {
    torch::manual_seed(500 + static_cast<uint64_t>(step * 8 + engine.rank()));
    const at::Tensor x = torch::randn({6, 4}), y = torch::randint(3, {6});
    at::Tensor loss = torch::nn::functional::cross_entropy(zero3::libtorch::call(model, x), y);
    sharded.backward(loss);
    sharded.step();
    float value = loss.item<float>();
    engine.all_reduce_host(&value, 1, ReduceOp::avg);
    losses.push_back(value);
  }
  return losses;
}

TEST(LibtorchConstruction, FactoriesHoldOneUnitAtATimeAndBuildTheSameModel) {
  auto world = engine_world();
  const std::vector<std::string> units = {"stem", "head"};

  // Each engine on a communicator of its own: both live at once.
  std::shared_ptr<Communicator> whole_comm(world->split(0, world->rank())), built_comm(world->split(0, world->rank()));
  // The model built whole: the blocks pushed in order after the stem and the head, from the same seed.
  auto whole_engine = make_engine(whole_comm);
  torch::manual_seed(42);
  Stack whole;
  for (int64_t i = 0; i < kBlocks; ++i) whole->blocks->push_back(Block());
  const int64_t block_bytes = storage_bytes(*whole->blocks[0]);
  std::vector<std::string> all_units = units;
  for (const std::string& p : block_paths()) all_units.push_back(p);
  ShardedModel whole_sharded(*whole_engine, whole.ptr(), WrapOptions{.units = all_units});
  whole_sharded.materialize();
  const float whole_draw = torch::rand({1}).item<float>();

  // The same model with the blocks built by factories.
  auto built_engine = make_engine(built_comm);
  torch::manual_seed(42);
  Stack built;
  Census census;
  std::vector<UnitFactory> factories;
  for (const std::string& path : block_paths()) factories.push_back({path, [&census] { return census.make(); }});
  ShardedModel built_sharded(*built_engine, built.ptr(), WrapOptions{.units = units}, factories);
  EXPECT_EQ(census.calls, kBlocks);
  EXPECT_EQ(census.peak_full, 1) << "blocks at full size at once, while wrapping";
  EXPECT_EQ(storage_bytes(*built->blocks), 0) << "the blocks' storage after wrapping";
  built_sharded.materialize();
  const float built_draw = torch::rand({1}).item<float>();
  EXPECT_EQ(census.calls, 2 * kBlocks) << "each factory runs again in materialize()";
  EXPECT_EQ(census.peak_full, 1) << "blocks at full size at once, in materialize()";
  EXPECT_EQ(census.peak_bytes, block_bytes);
  EXPECT_EQ(built_sharded.unit_names(), whole_sharded.unit_names());
  EXPECT_EQ(built_draw, whole_draw) << "the CPU generator after materialize()";

  const auto want = to_param_map(whole_sharded.gather_state_dict());
  const auto got = to_param_map(built_sharded.gather_state_dict());
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, values] : want) EXPECT_EQ(got.at(name), values) << name;
  EXPECT_EQ(train(built_sharded, built), train(whole_sharded, whole));
}

TEST(LibtorchConstruction, AFactoryThatBuildsAnotherModuleTheSecondTimeIsNamed) {
  auto world = engine_world();
  std::unique_ptr<Communicator> sub = world->split(world->rank() == 0 ? 0 : -1, world->rank());
  if (sub) {
    std::shared_ptr<Communicator> comm(std::move(sub));
    auto engine = make_engine(comm);
    Stack model;
    int runs = 0;
    UnitFactory changing{"blocks.0", [&runs]() -> std::shared_ptr<torch::nn::Module> {
                           return ++runs == 1 ? Block().ptr()
                                              : std::shared_ptr<torch::nn::Module>(torch::nn::Linear(2, 2).ptr());
                         }};
    ShardedModel sharded(*engine, model.ptr(), WrapOptions{.units = {"stem", "head"}}, {changing});
    try {
      sharded.materialize();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {  // the engine names the parameter it was reading
      EXPECT_NE(std::string(e.what()).find("UnitFactory 'blocks.0' built a module with other parameters"),
                std::string::npos)
          << e.what();
    }
  }
  world->barrier();
}

}  // namespace
}  // namespace zero3::testing
