// Forms of real DeepSpeed configs that DeepSpeed, Hugging Face and Accelerate run, read the way they read
// them. Each file under tests/data/configs/real/ has the shape of a published config (its first comment
// says which): sub_group_size 0 (axolotl), fp16 "auto" with no bf16 section in a bf16 program (FastChat),
// stage3_gather_16bit_weights_on_model_save "auto" (Accelerate's templates), reduce_bucket_size 0
// (transformers' tests), offload_param below stage 3 (DeepSpeed-Chat's generated configs).
#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "support/engine_world.hpp"
#include "support/mlp_trainer.hpp"
#include "zero3/comm.hpp"
#include "zero3/config.hpp"
#include "zero3/engine.hpp"
#include "zero3/error.hpp"
#include "zero3/memory_plan.hpp"

using namespace zero3;
using json = nlohmann::json;

namespace {

std::string real(const std::string& name) {
  const char* src = std::getenv("ZERO3_SOURCE_DIR");
  if (!src) ADD_FAILURE() << "ZERO3_SOURCE_DIR is not set (ctest sets it; set it when running by hand)";
  return std::string(src ? src : ".") + "/tests/data/configs/real/" + name;
}

bool has_warning(const Config& c, const std::string& part) {
  for (const std::string& w : c.warnings) {
    if (w.find(part) != std::string::npos) return true;
  }
  return false;
}

// The program of the seed job: Llama-3-8B on 16 ranks, micro batch 4, accumulation 4.
ResolveInputs llama_run(DType precision) {
  ResolveInputs in;
  in.world_size = 16;
  in.hidden_size = 4096;
  in.micro_batch = 4;
  in.grad_accum = 4;
  in.precision = precision;
  return in;
}

constexpr int64_t kLargest = std::numeric_limits<int64_t>::max();

}  // namespace

// DeepSpeed's stage 3 makes every parameter its own sub-group when sub_group_size is 0 (its
// _create_fp16_sub_groups closes a group once it holds >= sub_group_size elements). zero3's tiles never
// span units, so 0 is read as "no cut": one tile per unit's owned range.
TEST(RealConfigForms, AxolotlSubGroupSizeZero) {
  for (const char* name : {"axolotl-zero3.json", "axolotl-zero3-bf16.json", "axolotl-zero3-bf16-cpuoffload-all.json"}) {
    SCOPED_TRACE(name);
    Config c = load_config(real(name));
    EXPECT_EQ(c.zero.sub_group_size, kLargest);
    EXPECT_EQ(c.zero.max_live_parameters, 0);
    EXPECT_EQ(c.zero.max_reuse_distance, 0);
    EXPECT_TRUE(c.zero.gather_16bit_weights_on_model_save);
    resolve(c, llama_run(DType::bf16));
    EXPECT_EQ(c.compute_dtype(), DType::bf16);
    EXPECT_EQ(c.zero.reduce_bucket_size, 4096 * 4096);
    EXPECT_EQ(c.zero.prefetch_bucket_size, 15099494);
    EXPECT_EQ(c.zero.param_persistence_threshold, 40960);
    EXPECT_EQ(c.train_batch_size, 256);
    // What config check prints reads back to the same config.
    Config again = parse_config(to_json(c), "again.json");
    EXPECT_EQ(again.zero.sub_group_size, kLargest);
    EXPECT_EQ(to_json(again), to_json(c));
  }
  Config all = load_config(real("axolotl-zero3-bf16-cpuoffload-all.json"));
  EXPECT_EQ(all.zero.offload_param.device, OffloadDevice::cpu);
  EXPECT_EQ(all.zero.offload_optimizer.device, OffloadDevice::cpu);
  EXPECT_TRUE(has_warning(all, "zero_force_ds_cpu_optimizer: ignored"));
  // Negative sizes stay errors.
  EXPECT_THROW(parse_config(R"({"zero_optimization": {"sub_group_size": -1}})"), ConfigError);
}

// A unit's owned range is one tile: the step's staging tile is the largest owned range, as with any
// sub_group_size at least that large.
TEST(RealConfigForms, SubGroupSizeZeroPlansOneTilePerUnit) {
  ModelDesc m;
  m.name = "two units";
  m.units = {{"a", {{10, 3}}}, {"b", {{101}}}};
  MemoryPlanOptions o;
  o.world_size = 4;
  auto staging = [&](const std::string& text) {
    Config c = parse_config(text);
    MemoryPlan p = plan_memory(m, c, o);
    for (const MemoryPlanEntry& e : p.entries) {
      if (e.what.rfind("optimizer step tile", 0) == 0) return e.bytes;
    }
    ADD_FAILURE() << "no optimizer step tile in the plan";
    return int64_t{0};
  };
  const char* base = R"({"bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "bf16"},
                         "zero_optimization": {"stage": 3, "reduce_bucket_size": 100, "sub_group_size": %s}})";
  auto with = [&](const char* size) {
    char text[512];
    std::snprintf(text, sizeof text, base, size);
    return staging(text);
  };
  EXPECT_EQ(with("0"), 26 * 4);  // b's slice on 4 ranks: 26 elements, fp32
  EXPECT_EQ(with("0"), with("1e9"));
  EXPECT_EQ(with("10"), 10 * 4);
}

// Accelerate's set_mixed_precision: a bf16 program whose config has no bf16 section gets
// "bf16": {"enabled": true}; fp16 "auto" becomes false.
TEST(RealConfigForms, FastChatFp16AutoWithoutBf16SectionInABf16Program) {
  Config c = load_config(real("fastchat-zero3-fp16-auto.json"));
  EXPECT_TRUE(c.fp16.section_given);
  EXPECT_FALSE(c.bf16.section_given);
  resolve(c, llama_run(DType::bf16));
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.compute_dtype(), DType::bf16);
  json out = json::parse(to_json(c));
  EXPECT_EQ(out["bf16"]["enabled"], true);
  EXPECT_EQ(out["fp16"]["enabled"], false);

  // The same file in an fp16 program: fp16 "auto" follows it; in fp32 nothing is enabled.
  c = load_config(real("fastchat-zero3-fp16-auto.json"));
  resolve(c, llama_run(DType::f16));
  EXPECT_EQ(c.compute_dtype(), DType::f16);
  c = load_config(real("fastchat-zero3-fp16-auto.json"));
  resolve(c, llama_run(DType::f32));
  EXPECT_EQ(c.compute_dtype(), DType::f32);
}

TEST(RealConfigForms, MissingPrecisionSectionFollowsTheProgram) {
  // No precision section at all (FastChat's stage 2 config): the program's precision, both ways.
  const char* none = R"({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 2})";
  ResolveInputs in;
  in.precision = DType::bf16;
  Config c = parse_config(none);
  resolve(c, in);
  EXPECT_EQ(c.compute_dtype(), DType::bf16);
  in.precision = DType::f16;
  c = parse_config(none);
  resolve(c, in);
  EXPECT_EQ(c.compute_dtype(), DType::f16);
  // Without a precision from the program, a missing section is off, as in DeepSpeed.
  c = parse_config(none);
  resolve(c, {});
  EXPECT_EQ(c.compute_dtype(), DType::f32);
  // An explicit section keeps its value: disabled, or the other type enabled, is a mismatch (Accelerate
  // refuses fp16 enabled in a bf16 program too).
  in.precision = DType::bf16;
  c = parse_config(R"({"bf16": {"enabled": false}, "train_batch_size": 8})");
  EXPECT_THROW(resolve(c, in), ConfigError);
  c = parse_config(R"({"fp16": {"enabled": true}, "train_batch_size": 8})");
  try {
    resolve(c, in);
    ADD_FAILURE() << "fp16 enabled in a bf16 program was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("fp16.enabled: got true, but the program runs in bf16"), std::string::npos)
        << e.what();
  }
}

// Accelerate fills "auto" from its zero3_save_16bit_model, false unless the program sets it.
TEST(RealConfigForms, AccelerateGather16BitWeightsAuto) {
  Config c = load_config(real("accelerate-zero3-offload-gather-auto.json"));
  EXPECT_EQ(json::parse(to_json(c))["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"], "auto");
  ResolveInputs in = llama_run(DType::f16);
  in.grad_accum = 1;
  in.lr = 2e-5;
  in.warmup_steps = 10;
  in.total_steps = 100;
  Config by_default = c;
  resolve(by_default, in);
  EXPECT_FALSE(by_default.zero.gather_16bit_weights_on_model_save);
  EXPECT_EQ(json::parse(to_json(by_default))["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"], false);
  in.save_16bit_model = true;
  resolve(c, in);
  EXPECT_TRUE(c.zero.gather_16bit_weights_on_model_save);
  // Under its shorter alias as well.
  c = parse_config(R"({"zero_optimization": {"stage": 3, "gather_16bit_weights_on_model_save": "auto"},
                       "train_batch_size": 8})");
  in = ResolveInputs{};
  in.save_16bit_model = true;
  resolve(c, in);
  EXPECT_TRUE(c.zero.gather_16bit_weights_on_model_save);
  // "auto" is the only string it takes.
  EXPECT_THROW(parse_config(R"({"zero_optimization": {"stage3_gather_16bit_weights_on_model_save": "yes"}})"),
               ConfigError);
}

// DeepSpeed's reducers with reduce_bucket_size 0 reduce each parameter's gradient on its own (a bucket
// never holds more than one); zero3's buckets then hold the largest unit.
TEST(RealConfigForms, TransformersReduceBucketSizeZero) {
  Config c = load_config(real("transformers-zero3-bucket0.json"));
  EXPECT_EQ(c.zero.reduce_bucket_size, 0);
  EXPECT_EQ(c.zero.prefetch_bucket_size, 0);
  EXPECT_EQ(c.zero.param_persistence_threshold, 0);
  EXPECT_EQ(c.zero.sub_group_size, 100'000'000'000'000);
  EXPECT_TRUE(c.zero.gather_16bit_weights_on_model_save);
  ResolveInputs in;
  in.precision = DType::f16;
  in.micro_batch = 4;
  resolve(c, in);
  EXPECT_EQ(c.zero.reduce_bucket_size, 0);

  ModelDesc m;
  m.name = "two units";
  m.units = {{"a", {{10, 3}}}, {"b", {{101}}}};  // on 4 ranks: slices of 8 and 26 elements
  MemoryPlanOptions o;
  o.world_size = 4;
  auto buckets = [&](int stage) {
    Config s = c;
    s.zero.stage = stage;
    if (stage < 3) s.zero.offload_param.device = OffloadDevice::none;
    for (const MemoryPlanEntry& e : plan_memory(m, s, o).entries) {
      if (e.what.find("buckets") != std::string::npos) return e.what;
    }
    return std::string("none");
  };
  EXPECT_EQ(buckets(3), "reduce-scatter buckets, 2 x 104 (fp16)");  // 4 ranks x b's slice of 26, in the compute dtype
  EXPECT_EQ(buckets(1), "all-reduce buckets, 2 x 101 (fp16)");      // b itself
}

// DeepSpeed reads offload_param only in its stage 3 optimizer; below stage 3 it is ignored, here with a
// warning that names the key, and the device is read as "none".
TEST(RealConfigForms, OffloadParamBelowStage3IsIgnoredWithAWarning) {
  Config c = load_config(real("zero0-offload-param.json"));
  EXPECT_EQ(c.zero.stage, 0);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::none);
  EXPECT_TRUE(has_warning(c, "zero_optimization.offload_param: ignored at zero_optimization.stage 0")) << [&] {
    std::string all;
    for (const std::string& w : c.warnings) all += w + "\n";
    return all;
  }();
  for (int stage : {1, 2}) {
    Config s = parse_config(R"({"zero_optimization": {"stage": )" + std::to_string(stage) +
                            R"(, "offload_param": {"device": "nvme"}}})");
    EXPECT_EQ(s.zero.offload_param.device, OffloadDevice::none);
    EXPECT_TRUE(has_warning(s, "ignored at zero_optimization.stage " + std::to_string(stage)));
  }
  // At stage 3 it is read, and with device "none" there is nothing to warn about.
  EXPECT_EQ(parse_config(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})")
                .zero.offload_param.device,
            OffloadDevice::cpu);
  EXPECT_TRUE(
      parse_config(R"({"zero_optimization": {"stage": 1, "offload_param": {"device": "none"}}})").warnings.empty());
  // A Config built in code is still checked: below stage 3 it cannot offload parameters.
  Config code;
  code.zero.stage = 2;
  code.zero.offload_param.device = OffloadDevice::cpu;
  code.train_batch_size = 8;
  EXPECT_THROW(resolve(code, {}), ConfigError);
}

// The engine reads reduce_bucket_size 0 as buckets of the largest unit (fc2, 1102 elements on one rank):
// the same buffers as that size written out, and the same training.
TEST(RealConfigForms, EngineBucketsOfTheLargestUnitForReduceBucketSizeZero) {
  using namespace zero3::testing;
  CommOptions o;
  o.backend = "local";
  std::shared_ptr<Communicator> comm = make_communicator(o, LaunchInfo{}, nullptr);
  std::unique_ptr<Device> device = make_cpu_device();
  auto run = [&](int stage, int64_t bucket) {
    Config c = equivalence_config(stage);
    c.zero.reduce_bucket_size = bucket;
    Engine e(resolved_for(c, *comm), comm, *device);
    MlpUnits units = declare_mlp(e, MlpDims{});
    e.materialize();
    TrainPlan plan;
    plan.steps = 2;
    EngineRun r = train_mlp(e, units, plan);
    return std::make_pair(e.memory().buffers, r.losses);
  };
  for (int stage : {1, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    auto zero = run(stage, 0);
    auto largest = run(stage, 1102);
    EXPECT_EQ(zero.first, largest.first);
    // One element less is another bucket size (fc2 then spans two buckets, and the ring holds three).
    EXPECT_NE(zero.first, run(stage, 1101).first);
    EXPECT_EQ(zero.second, largest.second);
  }
}
