// The Hugging Face export of a model with tied embeddings (EngineModel::save_hf), and its import: after two
// training steps at ZeRO stage 3, in fp32 and bf16, as one file and as shards.
//   layout   exactly the model's parameter names, model.embed_tokens.weight and no lm_head.weight (Hugging Face's
//            tied layout), every tensor in the exported dtype;
//   config   the model's config.json with "torch_dtype" (and "dtype", which this text has) set to the exported
//            dtype, every other key kept;
//   reload   a new engine initialised from the export (each rank reading its slices) holds the exported weights
//            bit for bit, and evaluates a batch to the same loss bits as the engine that wrote it.
// The same file, given to a model whose config says untied, fails naming lm_head.weight and tie_word_embeddings.
// (tools/check_hf_export.py checks the other direction: transformers loads such an export and computes the same
// loss.)
// zero3-test-ranks: 1 3
#include <gtest/gtest.h>

#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine_model.hpp"
#include "support/engine_world.hpp"
#include "zero3/dtype.hpp"
#include "zero3/engine.hpp"
#include "zero3/error.hpp"
#include "zero3/safetensors.hpp"

using namespace llama3;
namespace fs = std::filesystem;
namespace st = zero3::safetensors;

namespace {

// hidden 24, 3 heads on 1 kv head, ffn 40, 2 layers, vocab 37, tied; "dtype" as transformers 5 writes it.
const char* const kConfigJson = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 24, "intermediate_size": 40,
  "num_hidden_layers": 2, "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 37,
  "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "max_position_embeddings": 64, "initializer_range": 0.2,
  "tie_word_embeddings": true, "dtype": "float32", "torch_dtype": "float32"
})";

constexpr int64_t kBatch = 2, kSeq = 7;

struct Batch {
  std::vector<int32_t> ids, targets;
};

Batch make_batch(int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab - 1));
  Batch b;
  for (int64_t i = 0; i < kBatch * kSeq; ++i) b.ids.push_back(tok(rng)), b.targets.push_back(tok(rng));
  b.targets[3] = kIgnoreIndex;
  return b;
}

zero3::Config engine_config(bool bf16) {
  zero3::Config c;
  c.zero.stage = 3;
  c.bf16.enabled = bf16;
  c.train_micro_batch_size_per_gpu = kBatch;
  c.gradient_accumulation_steps = 1;
  c.optimizer.present = true;
  c.optimizer.type = zero3::OptimizerType::adamw;
  c.optimizer.lr = 1e-2;
  c.zero.param_persistence_threshold = 0;
  c.zero3.seed = 7;
  return c;
}

// One directory for all ranks: rank 0 makes it and sends its name.
fs::path shared_temp_dir(zero3::Communicator& comm) {
  char name[128] = {};
  if (comm.rank() == 0) {
    std::string tmpl = (fs::temp_directory_path() / "llama3-hf-export-XXXXXX").string();
    if (tmpl.size() >= sizeof name || ::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    std::memcpy(name, tmpl.data(), tmpl.size());
  }
  comm.broadcast(name, sizeof name / 2, zero3::DType::f16, 0)->wait();  // bytes, two per element
  return fs::path(name);
}

LossResult evaluate(zero3::Engine& engine, EngineModel& model, const Batch& b) {
  zero3::EvalMode mode = engine.evaluate();
  const LossResult r = model.evaluate(b.ids.data(), b.targets.data(), BatchShape{kBatch, kSeq});
  mode.end();
  return r;
}

struct ExportCase {
  bool bf16;
  uint64_t max_shard_bytes;
  std::string name;
};

void PrintTo(const ExportCase& c, std::ostream* os) { *os << c.name; }

constexpr uint64_t kOneFile = uint64_t{1} << 40;

class HfExport : public ::testing::TestWithParam<ExportCase> {};

TEST_P(HfExport, TiedLayoutReloadsToTheSameModel) {
  const ExportCase& ec = GetParam();
  auto comm = zero3::testing::engine_world();
  const ModelConfig mc = parse_model_config(kConfigJson);
  ASSERT_TRUE(mc.tie_word_embeddings);
  const fs::path dir = shared_temp_dir(*comm) / ec.name;
  const Batch eval_batch = make_batch(mc.vocab_size, 100);

  // Train two steps, evaluate, export.
  zero3::Engine engine(zero3::testing::resolved_for(engine_config(ec.bf16), *comm), comm,
                       zero3::testing::cpu_device());
  EngineModel model(engine, mc);
  engine.materialize();
  for (int step = 0; step < 2; ++step) {
    const Batch b = make_batch(mc.vocab_size, static_cast<uint64_t>(10 * step + comm->rank()));
    model.forward_backward(b.ids.data(), b.targets.data(), BatchShape{kBatch, kSeq});
    ASSERT_TRUE(engine.step().applied);
  }
  const LossResult trained = evaluate(engine, model, eval_batch);
  std::vector<std::vector<float>> master(model.num_units());
  for (size_t u = 0; u < model.num_units(); ++u) {
    master[u].resize(static_cast<size_t>(model.layouts()[u].numel));
    model.gather_unit(u, master[u].data());
  }
  const st::Dtype dtype = ec.bf16 ? st::Dtype::bf16 : st::Dtype::f32;
  model.save_hf(dir, dtype, ec.max_shard_bytes, kConfigJson);
  comm->barrier();

  // Layout and config (every rank reads the files: they are on this machine).
  st::ShardedSafetensorsReader reader(dir);
  EXPECT_EQ(reader.shard_count() > 1, ec.max_shard_bytes < kOneFile);
  std::vector<std::string> want_names;
  for (const UnitLayout& u : model.layouts())
    for (const ParamSpec& p : u.params) want_names.push_back(p.name);
  std::sort(want_names.begin(), want_names.end());
  EXPECT_EQ(reader.names(), want_names);
  EXPECT_FALSE(reader.contains("lm_head.weight"));
  EXPECT_TRUE(reader.contains("model.embed_tokens.weight"));
  for (const std::string& n : want_names) EXPECT_EQ(reader.tensor(n).dtype, dtype) << n;
  std::ifstream in(dir / "config.json");
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json config = nlohmann::json::parse(text.str());
  const char* want_dtype = ec.bf16 ? "bfloat16" : "float32";
  EXPECT_EQ(config.at("torch_dtype"), want_dtype);
  EXPECT_EQ(config.at("dtype"), want_dtype);
  EXPECT_EQ(config.at("tie_word_embeddings"), true);
  EXPECT_EQ(config.at("hidden_size"), 24);
  EXPECT_EQ(config.at("architectures").at(0), "LlamaForCausalLM");
  EXPECT_EQ(parse_model_config(text.str()).num_parameters(), mc.num_parameters());

  // Reload: the exported weights, and the same loss.
  zero3::Engine engine2(zero3::testing::resolved_for(engine_config(ec.bf16), *comm), comm, zero3::testing::cpu_device());
  EngineModelOptions opt;
  opt.init_from = dir;
  EngineModel reloaded(engine2, parse_model_config(text.str(), (dir / "config.json").string()), opt);
  engine2.materialize();
  for (size_t u = 0; u < reloaded.num_units(); ++u) {
    std::vector<float> got(master[u].size());
    reloaded.gather_unit(u, got.data());
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const float want = ec.bf16 ? zero3::bf16_to_f32(zero3::f32_to_bf16(master[u][i])) : master[u][i];
      differ += std::memcmp(&got[i], &want, sizeof want) != 0;
    }
    EXPECT_EQ(differ, 0u) << "unit " << reloaded.layouts()[u].name;
  }
  const LossResult again = evaluate(engine2, reloaded, eval_batch);
  EXPECT_EQ(again.loss, trained.loss);
  EXPECT_EQ(again.count, trained.count);
  if (comm->rank() == 0) {
    std::printf("[%s, %d ranks] exported %zu tensors; loss %.9f before, %.9f after the reload\n", ec.name.c_str(),
                comm->size(), want_names.size(), trained.loss, again.loss);
  }

  // An untied model needs lm_head.weight, which a tied export lacks: the error says why.
  ModelConfig untied = mc;
  untied.tie_word_embeddings = false;
  zero3::Engine engine3(zero3::testing::resolved_for(engine_config(ec.bf16), *comm), comm, zero3::testing::cpu_device());
  try {
    EngineModel wrong(engine3, untied, opt);
    ADD_FAILURE() << "an untied model loaded a tied export";
  } catch (const zero3::IoError& e) {
    EXPECT_NE(std::string(e.what()).find("no tensor 'lm_head.weight'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tie_word_embeddings"), std::string::npos) << e.what();
  }
  comm->barrier();
  if (comm->rank() == 0) fs::remove_all(dir.parent_path());
}

INSTANTIATE_TEST_SUITE_P(Tied, HfExport,
                         ::testing::Values(ExportCase{false, kOneFile, "fp32"}, ExportCase{true, kOneFile, "bf16"},
                                           ExportCase{false, 4000, "fp32_shards"}),
                         [](const ::testing::TestParamInfo<ExportCase>& i) { return i.param.name; });

}  // namespace
