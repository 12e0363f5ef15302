// Reading Hugging Face config.json files into ModelConfig, and the per-unit parameter layout.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "llama_layout.hpp"
#include "model_config.hpp"
#include "zero3/error.hpp"

using namespace llama3;

namespace {

// Meta-Llama-3-8B's published config.json.
const char* kLlama3_8B = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 500000.0,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0",
  "use_cache": true, "vocab_size": 128256
})";

std::string error_of(const std::string& json) {
  try {
    parse_model_config(json, "cfg.json");
  } catch (const zero3::ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(ModelConfig, ReadsMetaLlama3_8B) {
  ModelConfig c = parse_model_config(kLlama3_8B);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_FALSE(c.rope_scaling.has_value());
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c.initializer_range, 0.02);
  EXPECT_EQ(c.group_size(), 4);
  EXPECT_EQ(c.qkv_dim(), 4096 + 2 * 1024);
  // Meta-Llama-3-8B has 8,030,261,248 parameters.
  EXPECT_EQ(c.num_parameters(), 8030261248);
  EXPECT_NE(describe(c).find("8.03B params"), std::string::npos) << describe(c);
}

TEST(ModelConfig, ReadsLlama31RopeScalingInBothSpellings) {
  std::string base = kLlama3_8B;
  std::string scaled = base;
  scaled.replace(scaled.find("\"rope_scaling\": null"), 20,
                 R"("rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"})");
  ModelConfig c = parse_model_config(scaled);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_DOUBLE_EQ(c.rope_scaling->factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling->low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling->high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 8192);

  // transformers 5 writes rope_parameters (with rope_theta inside) instead.
  ModelConfig d = parse_model_config(R"({"hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
      "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})");
  EXPECT_DOUBLE_EQ(d.rope_theta, 500000.0);
  ASSERT_TRUE(d.rope_scaling.has_value());
  EXPECT_DOUBLE_EQ(d.rope_scaling->factor, 32.0);
  ModelConfig e = parse_model_config(R"({"hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
      "num_attention_heads": 4, "vocab_size": 256, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}})");
  EXPECT_FALSE(e.rope_scaling.has_value());
  EXPECT_EQ(e.num_key_value_heads, 4);  // absent: as many as the query heads
}

TEST(ModelConfig, ErrorsNameTheKey) {
  EXPECT_NE(error_of(R"({"intermediate_size": 1})").find("cfg.json: hidden_size: missing"), std::string::npos);
  EXPECT_NE(error_of(R"({"hidden_size": "big"})").find("hidden_size: expected an integer"), std::string::npos);
  const std::string dims = R"("hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2, "vocab_size": 256)";
  EXPECT_NE(error_of("{" + dims + R"(, "num_attention_heads": 4, "num_key_value_heads": 3})")
                .find("num_key_value_heads: must divide"),
            std::string::npos);
  EXPECT_NE(
      error_of("{" + dims + R"(, "num_attention_heads": 5})").find("num_attention_heads: must divide hidden_size"),
      std::string::npos);
  EXPECT_NE(error_of("{" + dims + R"(, "num_attention_heads": 4, "rope_scaling": {"rope_type": "yarn", "factor": 4}})")
                .find("rope_scaling.rope_type: \"yarn\" is not supported"),
            std::string::npos);
  EXPECT_NE(
      error_of("{" + dims + R"(, "num_attention_heads": 4, "rope_scaling": {"rope_type": "llama3", "factor": 8}})")
          .find("rope_scaling.low_freq_factor: missing"),
      std::string::npos);
  EXPECT_NE(error_of("{" + dims + R"(, "num_attention_heads": 4, "attention_bias": true})").find("attention_bias"),
            std::string::npos);
  EXPECT_NE(error_of("{" + dims + R"(, "num_attention_heads": 4, "hidden_act": "gelu"})").find("hidden_act"),
            std::string::npos);
  EXPECT_NE(
      error_of("{" + dims + R"(, "num_attention_heads": 4, "rms_norm_eps": 0})").find("rms_norm_eps: must be > 0"),
      std::string::npos);
  EXPECT_NE(error_of("{" + dims + R"(, "num_attention_heads": 4, "tie_word_embeddings": 1})")
                .find("tie_word_embeddings: expected true or false"),
            std::string::npos);
  EXPECT_NE(error_of("not json").find("cfg.json: not valid JSON"), std::string::npos);
  EXPECT_THROW(load_model_config("/nonexistent/config.json"), zero3::IoError);
}

TEST(ModelConfig, IntegersMayBeWrittenAsFloats) {
  ModelConfig c = parse_model_config(R"({"hidden_size": 6.4e1, "intermediate_size": 176.0, "num_hidden_layers": 2,
      "num_attention_heads": 4, "vocab_size": 256})");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_NE(error_of(R"({"hidden_size": 64.5})").find("hidden_size: expected an integer"), std::string::npos);
}

TEST(ModelConfig, ExportedConfigSaysTheExportedDtype) {
  // The key the text has is set (both when it has both); with neither, torch_dtype, which every transformers reads.
  const std::string with_torch_dtype = exported_config_json(
      R"({"hidden_size": 64, "torch_dtype": "float32", "vocab_size": 256, "tie_word_embeddings": true})", "bfloat16");
  EXPECT_EQ(with_torch_dtype,
            "{\n  \"hidden_size\": 64,\n  \"torch_dtype\": \"bfloat16\",\n  \"vocab_size\": 256,\n"
            "  \"tie_word_embeddings\": true\n}\n");  // the file's order kept
  const std::string with_dtype = exported_config_json(R"({"dtype": "bfloat16", "hidden_size": 64})", "float32");
  EXPECT_NE(with_dtype.find(R"("dtype": "float32")"), std::string::npos) << with_dtype;
  EXPECT_EQ(with_dtype.find("torch_dtype"), std::string::npos) << with_dtype;
  const std::string both = exported_config_json(R"({"dtype": "float32", "torch_dtype": "float32"})", "bfloat16");
  EXPECT_EQ(both, "{\n  \"dtype\": \"bfloat16\",\n  \"torch_dtype\": \"bfloat16\"\n}\n");
  const std::string neither = exported_config_json(R"({"hidden_size": 64} // a comment)", "bfloat16");
  EXPECT_EQ(neither, "{\n  \"hidden_size\": 64,\n  \"torch_dtype\": \"bfloat16\"\n}\n");
  EXPECT_THROW(exported_config_json("[1, 2]", "float32", "x.json"), zero3::ConfigError);
  try {
    exported_config_json("{", "float32", "x.json");
    ADD_FAILURE() << "no error for text that is not JSON";
  } catch (const zero3::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("x.json"), std::string::npos) << e.what();
  }
}

TEST(ModelConfig, RepositoryModelConfigsLoad) {
  const char* src = std::getenv("ZERO3_SOURCE_DIR");
  std::filesystem::path dir =
      (src != nullptr ? std::filesystem::path(src) : std::filesystem::path(LLAMA3_SOURCE_DIR) / ".." / "..") /
      "configs" / "models";
  ModelConfig big = load_model_config((dir / "llama-3-8b.json").string());
  EXPECT_EQ(big.num_parameters(), 8030261248);
  EXPECT_EQ(big.num_key_value_heads, 8);
  EXPECT_EQ(big.max_position_embeddings, 8192);
  ModelConfig tiny = load_model_config((dir / "llama-3-tiny.json").string());
  EXPECT_NO_THROW(model_unit_layouts(tiny));
  ModelConfig tiny_tied = load_model_config((dir / "llama-3-tiny-tied.json").string());
  EXPECT_TRUE(tiny_tied.tie_word_embeddings);
  EXPECT_EQ(tiny_tied.num_parameters(), tiny.num_parameters() - tiny.vocab_size * tiny.hidden_size);
  // Meta's Llama-3.2-1B: tied embeddings, 1.24B parameters as published.
  ModelConfig small = load_model_config((dir / "llama-3.2-1b.json").string());
  EXPECT_TRUE(small.tie_word_embeddings);
  EXPECT_EQ(small.num_parameters(), 1235814400);
  ASSERT_TRUE(small.rope_scaling.has_value());
  EXPECT_EQ(small.rope_scaling->factor, 32.0);
  EXPECT_EQ(model_unit_layouts(small).back().params.size(), 1u);
}

TEST(Layout, UnitsInOrderWithHuggingFaceNamesAndPackedOffsets) {
  ModelConfig c = parse_model_config(R"({"hidden_size": 12, "intermediate_size": 20, "num_hidden_layers": 2,
      "num_attention_heads": 3, "num_key_value_heads": 1, "vocab_size": 17})");
  auto units = model_unit_layouts(c);
  ASSERT_EQ(units.size(), 4u);
  EXPECT_EQ(units[0].name, "embedding");
  EXPECT_EQ(units[1].name, "layers.0");
  EXPECT_EQ(units[2].name, "layers.1");
  EXPECT_EQ(units[3].name, "head");
  const auto& l1 = units[2].params;
  ASSERT_EQ(l1.size(), static_cast<size_t>(kLayerParamCount));
  const char* names[] = {"input_layernorm",  "self_attn.q_proj", "self_attn.k_proj",
                         "self_attn.v_proj", "self_attn.o_proj", "post_attention_layernorm",
                         "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
  int64_t offset = 0;
  for (int i = 0; i < kLayerParamCount; ++i) {
    EXPECT_EQ(l1[i].name, std::string("model.layers.1.") + names[i] + ".weight");
    EXPECT_EQ(l1[i].offset, offset);
    offset += l1[i].numel;
  }
  EXPECT_EQ(units[2].numel, offset);
  EXPECT_EQ(l1[kQProj].shape, (std::vector<int64_t>{12, 12}));
  EXPECT_EQ(l1[kKProj].shape, (std::vector<int64_t>{4, 12}));
  EXPECT_EQ(l1[kOProj].shape, (std::vector<int64_t>{12, 12}));
  EXPECT_EQ(l1[kDownProj].shape, (std::vector<int64_t>{12, 20}));
  EXPECT_EQ(l1[kInputLayernorm].init, ParamInit::ones);
  EXPECT_EQ(l1[kGateProj].init, ParamInit::normal);
  EXPECT_DOUBLE_EQ(l1[kGateProj].init_std, 0.02);
  EXPECT_EQ(units[3].params[0].name, "model.norm.weight");
  EXPECT_EQ(units[3].params[1].name, "lm_head.weight");
  int64_t total = 0;
  for (const auto& u : units) total += u.numel;
  EXPECT_EQ(total, c.num_parameters());
  const int64_t untied_total = total;

  EXPECT_EQ(unit_of_param(c, "model.embed_tokens.weight"), 0);
  EXPECT_EQ(unit_of_param(c, "model.layers.1.mlp.up_proj.weight"), 2);
  EXPECT_EQ(unit_of_param(c, "lm_head.weight"), 3);
  EXPECT_EQ(unit_of_param(c, "model.layers.2.mlp.up_proj.weight"), -1);
  EXPECT_EQ(unit_of_param(c, "model.layers.1.mlp.up_proj.bias"), -1);
  EXPECT_THROW(units[0].param("lm_head.weight"), zero3::InvalidArgument);

  // Tied: the head unit holds the final norm only; lm_head.weight is no parameter (the embedding's is used).
  c.tie_word_embeddings = true;
  const std::vector<UnitLayout> tied = model_unit_layouts(c);
  ASSERT_EQ(tied.size(), units.size());
  ASSERT_EQ(tied.back().params.size(), 1u);
  EXPECT_EQ(tied.back().params[0].name, "model.norm.weight");
  EXPECT_EQ(tied.back().numel, c.hidden_size);
  EXPECT_EQ(tied.front().numel, units.front().numel);
  total = 0;
  for (const auto& u : tied) total += u.numel;
  EXPECT_EQ(total, c.num_parameters());
  EXPECT_EQ(total, untied_total - c.vocab_size * c.hidden_size);
  EXPECT_EQ(unit_of_param(c, "lm_head.weight"), -1);
  EXPECT_EQ(unit_of_param(c, "model.norm.weight"), 3);
  EXPECT_EQ(unit_of_param(c, "model.embed_tokens.weight"), 0);
}
