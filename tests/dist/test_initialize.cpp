// zero3::initialize(): from a DeepSpeed config file to a connected communicator, a device and an engine, with the
// config's zero3 section in force and "auto" resolved for the job's world size; the engine it makes trains as
// the unsharded reference does. Also what it refuses before connecting anything.
// zero3-test-ranks: 1 2 3
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <string>

#include "support/mlp_trainer.hpp"
#include "support/rank_temp_dir.hpp"
#include "support/reference_model.hpp"
#include "zero3/build_config.hpp"
#include "zero3/comm.hpp"
#include "zero3/error.hpp"
#include "zero3/initialize.hpp"

namespace zero3 {
namespace {

using namespace zero3::testing;

std::string write_config(const RankTempDir& dir, const std::string& text) {
  const std::string path = dir.path() + "/ds_config.json";
  std::ofstream(path) << text;
  return path;
}

// A Hugging Face-style config: batch sizes, learning rate and bucket sizes left "auto" to the program.
const char* kConfig = R"({
  "train_batch_size": "auto",
  "train_micro_batch_size_per_gpu": "auto",
  "gradient_accumulation_steps": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": 0.01}},
  "zero_optimization": {
    "stage": 3,
    "reduce_bucket_size": "auto",
    "stage3_prefetch_bucket_size": "auto",
    "stage3_param_persistence_threshold": "auto"
  },
  "zero3": {"device": "cpu", "comm_backend": "gloo", "comm_timeout_s": 42, "seed": 1234}
})";

TEST(Initialize, FromAConfigFileToAnEngineThatTrainsLikeTheReference) {
  RankTempDir dir;
  InitOptions opts;
  opts.resolve.hidden_size = 8;
  opts.resolve.micro_batch = 3;
  opts.resolve.lr = 2e-2;
  Session s = initialize(write_config(dir, kConfig), opts);
  const int world = detect_launch().world_size;

  // The zero3 section: gloo even for one process (where "auto" would be local), the timeout, the device.
  ASSERT_NE(s.comm, nullptr);
  EXPECT_STREQ(s.comm->backend(), "gloo");
  EXPECT_EQ(s.comm->timeout(), std::chrono::seconds(42));
  EXPECT_EQ(s.comm->size(), world);
  EXPECT_EQ(s.comm->rank(), s.launch.rank);
  ASSERT_NE(s.device, nullptr);
  EXPECT_EQ(s.device->type(), DeviceType::cpu);
  EXPECT_EQ(s.config.zero3.device, "cpu");

  // "auto" resolved from the program's facts and the communicator's world size.
  EXPECT_TRUE(s.config.resolved);
  EXPECT_EQ(s.config.train_micro_batch_size_per_gpu, 3);
  EXPECT_EQ(s.config.train_batch_size, 3 * 2 * world);
  EXPECT_EQ(s.config.zero.reduce_bucket_size, 64);           // hidden^2
  EXPECT_EQ(s.config.zero.prefetch_bucket_size, 57);         // int(0.9 x hidden^2)
  EXPECT_EQ(s.config.zero.param_persistence_threshold, 80);  // 10 x hidden
  EXPECT_EQ(s.config.optimizer.lr, 2e-2);

  // The engine runs that config on that communicator and device.
  ASSERT_NE(s.engine, nullptr);
  Engine& engine = *s.engine;
  EXPECT_EQ(&engine.communicator(), s.comm.get());
  EXPECT_EQ(&engine.device(), s.device.get());
  EXPECT_EQ(engine.world_size(), world);
  EXPECT_EQ(engine.stage(), 3);
  EXPECT_EQ(engine.gradient_accumulation_steps(), 2);
  EXPECT_EQ(engine.config().train_batch_size, s.config.train_batch_size);

  TrainPlan plan;
  plan.world = world;
  plan.steps = 3;
  MlpUnits units = declare_mlp(engine, plan.dims);
  engine.materialize();
  EngineRun run = train_mlp(engine, units, plan);
  ReferenceRun ref = run_reference(s.config, plan);
  std::string worst;
  EXPECT_LT(max_relative_error(run.params, ref.params, &worst), 1e-5) << worst;
}

TEST(Initialize, RefusesABackendThatCannotServeTheDeviceBeforeConnecting) {
  RankTempDir dir;
  std::string text = kConfig;
  text.replace(text.find("\"comm_backend\": \"gloo\""), 22, "\"comm_backend\": \"nccl\"");
  InitOptions opts;
  opts.resolve.hidden_size = 8;
  opts.resolve.micro_batch = 3;
  opts.resolve.lr = 2e-2;
  // The file itself refuses nccl with device cpu; with the device from the program, initialize() does.
  try {
    Config c = load_config(write_config(dir, text));
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("zero3.comm_backend"), std::string::npos) << e.what();
  }
  Config c = parse_config(kConfig, "ds_config.json");
  c.zero3.comm_backend = "nccl";
  c.zero3.device = "auto";
  opts.device = "cpu";
  try {
    initialize(c, opts);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("zero3.comm_backend: \"nccl\" with device cpu"), std::string::npos)
        << e.what();
  }
  opts.device = "tpu:0";
  EXPECT_THROW(initialize(c, opts), InvalidArgument);
  c.zero3.comm_backend = "gloo";
  opts.device = "cuda";
#if ZERO3_HAVE_CUDA
  EXPECT_THROW(initialize(c, opts), ConfigError);  // gloo cannot serve the GPU
#else
  EXPECT_THROW(initialize(c, opts), Unsupported);  // no CUDA in this build
#endif
  opts.device = "cpu";
  opts.resolve.world_size = detect_launch().world_size + 1;
  try {
    initialize(c, opts);
    FAIL() << "expected an InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("ResolveInputs::world_size"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zero3
