// The "pipeline" section and zero3's pipeline keys: read, checked, written back, DeepSpeed's batch arithmetic over
// the data-parallel ranks (world size / pipeline.stages), the schedule's demands on the micro-batches, and the
// Engine's refusal of more than one stage while the pipeline engine is not built.
// zero3-test-labels: pipeline
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>

#include "support/engine_world.hpp"
#include "support/mlp_trainer.hpp"
#include "zero3/comm.hpp"
#include "zero3/config.hpp"
#include "zero3/device.hpp"
#include "zero3/engine.hpp"
#include "zero3/error.hpp"

using namespace zero3;

namespace {

ResolveInputs world(int64_t size, std::optional<int64_t> stages = std::nullopt) {
  ResolveInputs in;
  in.world_size = size;
  in.pipeline_stages = stages;
  return in;
}

std::string error_of(const std::string& text, const ResolveInputs& in = {}) {
  try {
    Config c = parse_config(text, "p.json");
    resolve(c, in);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ConfigPipeline, TheSectionIsReadAndWrittenBack) {
  Config c = parse_config(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 8,
      "pipeline": {"stages": 4, "partition": "type:DecoderLayer", "activation_checkpoint_interval": 1},
      "zero3": {"pipeline_schedule": "interleaved_1f1b", "pipeline_virtual_stages": 2,
                "pipeline_stage_order": "stages_within_node"}})",
                          "p.json");
  EXPECT_EQ(c.pipeline.stages, 4);
  EXPECT_EQ(c.pipeline.partition, "type:DecoderLayer");
  EXPECT_EQ(c.pipeline.activation_checkpoint_interval, 1);
  EXPECT_EQ(c.zero3.pipeline_schedule, "interleaved_1f1b");
  EXPECT_EQ(c.zero3.pipeline_virtual_stages, 2);
  EXPECT_EQ(c.zero3.pipeline_stage_order, "stages_within_node");
  resolve(c, world(8));
  // DeepSpeed's rule over the data-parallel ranks: 2 x 8 x (8 / 4).
  EXPECT_EQ(c.train_batch_size, 32);
  const std::string written = to_json(c);
  EXPECT_NE(written.find("\"partition\": \"type:DecoderLayer\""), std::string::npos) << written;
  Config again = parse_config(written, "again.json");
  EXPECT_EQ(again.pipeline.stages, 4);
  EXPECT_EQ(again.zero3.pipeline_schedule, "interleaved_1f1b");
}

TEST(ConfigPipeline, DefaultsAreNoPipeline) {
  Config c = parse_config(R"({"train_batch_size": 8})", "p.json");
  EXPECT_FALSE(c.pipeline.stages.has_value());
  resolve(c, world(4));
  EXPECT_EQ(c.pipeline.stages, 1);
  EXPECT_EQ(c.pipeline.partition, "parameters");
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 2);
  Config from_program = parse_config(
      R"({"train_batch_size": 8, "gradient_accumulation_steps": 2, "pipeline": {"stages": "auto"}})", "p.json");
  resolve(from_program, world(4, 2));
  EXPECT_EQ(from_program.pipeline.stages, 2);
  EXPECT_EQ(from_program.train_micro_batch_size_per_gpu, 2);  // 8 / (4 / 2) / 2
}

TEST(ConfigPipeline, TheBatchArithmeticCountsDataParallelRanks) {
  EXPECT_EQ(error_of(R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2,
                         "gradient_accumulation_steps": 4, "pipeline": {"stages": 2}})",
                     world(8)),
            "train_batch_size: got 64, expected train_micro_batch_size_per_gpu 2 x gradient_accumulation_steps 4 x "
            "data-parallel size 4 (world size 8 / pipeline.stages 2) = 32, every factor >= 1 (DeepSpeed's rule) (in "
            "p.json)");
}

TEST(ConfigPipeline, BadInputsAreNamedWithTheirKeysAndNumbers) {
  EXPECT_EQ(error_of(R"({"train_batch_size": 8, "pipeline": {"stages": 3}})", world(8)),
            "pipeline.stages: 3 stages do not divide the world size 8; every stage needs the same number of "
            "data-parallel ranks (in p.json)");
  EXPECT_EQ(error_of(R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 3,
                         "pipeline": {"stages": 4}})",
                     world(4)),
            "gradient_accumulation_steps: schedule 1f1b needs at least as many micro-batches as pipeline.stages, got "
            "3 micro-batches for 4 stages (in p.json)");
  EXPECT_EQ(error_of(R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 6,
                         "pipeline": {"stages": 4},
                         "zero3": {"pipeline_schedule": "interleaved_1f1b", "pipeline_virtual_stages": 2}})",
                     world(8)),
            "gradient_accumulation_steps: schedule interleaved_1f1b needs the micro-batches to be a multiple of "
            "pipeline.stages, got 6 micro-batches over 4 stages (2 left over) (in p.json)");
  EXPECT_EQ(error_of(R"({"train_batch_size": 8, "pipeline": {"stages": 2}})", world(4, 4)),
            "pipeline.stages: got 2, but the program passes 4; expected the same value, or \"auto\" (in p.json)");
  EXPECT_NE(error_of(R"({"train_batch_size": 8, "pipeline": {"partition": "type:("}})")
                .find("pipeline.partition: \"type:(\": the regular expression does not compile"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"train_batch_size": 8, "pipeline": {"partition": "profile"}})")
                .find("pipeline.partition: \"profile\" is not implemented"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"train_batch_size": 8, "pipeline": {"partition": "layers"}})").find("pipeline.partition"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"train_batch_size": 8, "pipeline": {"stage": 2}})").find("pipeline.stage"),
            std::string::npos);  // unknown key, with a hint
  EXPECT_NE(
      error_of(R"({"train_batch_size": 8, "zero3": {"pipeline_schedule": "zb"}})").find("zero3.pipeline_schedule"),
      std::string::npos);
}

TEST(ConfigPipeline, DeepSpeedsOwnDefaultsAreAcceptedAndSaidWhatTheyDo) {
  Config c = parse_config(R"({"train_batch_size": 8, "pipeline": {"stages": "auto", "partition": "best",
      "seed_layers": false, "activation_checkpoint_interval": 0, "pipe_partitioned": true, "grad_partitioned": true}})",
                          "p.json");
  EXPECT_EQ(c.pipeline.partition, "parameters");
  bool warned = false;
  for (const std::string& w : c.warnings)
    warned = warned || w.find("\"best\" is DeepSpeed's config default") != std::string::npos;
  EXPECT_TRUE(warned);
  Config off = parse_config(R"({"train_batch_size": 8, "pipeline": {"pipe_partitioned": false}})", "p.json");
  bool ignored = false;
  for (const std::string& w : off.warnings)
    ignored = ignored || w.find("pipeline.pipe_partitioned") != std::string::npos;
  EXPECT_TRUE(ignored);
}

TEST(ConfigPipeline, AWorldEngineRefusesAPipelinedConfig) {
  CommOptions options;
  options.backend = "local";
  auto comm = std::shared_ptr<Communicator>(make_communicator(options, LaunchInfo{}, nullptr));
  auto device = make_cpu_device();
  Config c = zero3::testing::resolved_for(zero3::testing::equivalence_config(3), *comm);
  EXPECT_NO_THROW(Engine(c, comm, *device));
  c.pipeline.stages = 2;
  try {
    Engine engine(c, comm, *device);
    ADD_FAILURE() << "an engine over the whole world was created for two stages";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("Engine: pipeline.stages = 2 (config "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("runs on a zero3::PipelineEngine"), std::string::npos) << e.what();
  }
  // A stage's engine needs its pipeline group, and as many micro-batches as the config accumulates.
  EXPECT_THROW(Engine(c, comm, *device, PipelineStageBinding{}), InvalidArgument);
  try {
    Engine engine(c, comm, *device, PipelineStageBinding{comm, 5});
    ADD_FAILURE() << "a stage engine of 5 micro-batches was created for gradient_accumulation_steps 2";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("5 micro-batches per step, but gradient_accumulation_steps is 2"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
