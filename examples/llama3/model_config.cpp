#include "model_config.hpp"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "zero3/error.hpp"

namespace llama3 {
namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& source, const std::string& key, const std::string& what) {
  throw zero3::ConfigError(source + ": " + key + ": " + what);
}

std::string type_name(const json& v) { return v.type_name(); }

// An integer written as 4096, 4096.0 or 4.096e3 (the way DeepSpeed-era tools sometimes write them).
int64_t read_int(const json& obj, const std::string& key, const std::string& source, const std::string& path) {
  const json& v = obj.at(key);
  if (v.is_number_integer() || v.is_number_unsigned()) return v.get<int64_t>();
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
    fail(source, path, "expected an integer, got " + v.dump());
  }
  fail(source, path, "expected an integer, got " + type_name(v) + " " + v.dump());
}

double read_double(const json& obj, const std::string& key, const std::string& source, const std::string& path) {
  const json& v = obj.at(key);
  if (!v.is_number()) fail(source, path, "expected a number, got " + type_name(v) + " " + v.dump());
  return v.get<double>();
}

bool read_bool(const json& obj, const std::string& key, const std::string& source, const std::string& path) {
  const json& v = obj.at(key);
  if (!v.is_boolean()) fail(source, path, "expected true or false, got " + type_name(v) + " " + v.dump());
  return v.get<bool>();
}

int64_t required_int(const json& root, const std::string& key, const std::string& source) {
  if (!root.contains(key) || root.at(key).is_null()) fail(source, key, "missing (required by the Llama architecture)");
  return read_int(root, key, source, key);
}

bool present(const json& obj, const std::string& key) { return obj.contains(key) && !obj.at(key).is_null(); }

// "rope_scaling" (Meta's files) or "rope_parameters" (recent transformers): the same fields, plus rope_theta in
// the latter. Returns nullopt for plain RoPE.
std::optional<RopeScaling> read_rope_scaling(const json& obj, const std::string& source, const std::string& path) {
  if (!obj.is_object()) fail(source, path, "expected an object or null, got " + type_name(obj) + " " + obj.dump());
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (present(obj, key)) {
      if (!obj.at(key).is_string()) fail(source, path + "." + key, "expected a string, got " + obj.at(key).dump());
      type = obj.at(key).get<std::string>();
      break;
    }
  }
  if (type == "default") return std::nullopt;
  if (type != "llama3") {
    fail(source, path + ".rope_type",
         "\"" + type +
             "\" is not supported; this model computes plain RoPE (\"default\") and Llama-3.1 scaling (\"llama3\")");
  }
  RopeScaling s;
  auto need = [&](const char* key) {
    if (!present(obj, key)) fail(source, path + "." + key, "missing (required by rope_type \"llama3\")");
  };
  need("factor");
  need("low_freq_factor");
  need("high_freq_factor");
  need("original_max_position_embeddings");
  s.factor = read_double(obj, "factor", source, path + ".factor");
  s.low_freq_factor = read_double(obj, "low_freq_factor", source, path + ".low_freq_factor");
  s.high_freq_factor = read_double(obj, "high_freq_factor", source, path + ".high_freq_factor");
  s.original_max_position_embeddings =
      read_int(obj, "original_max_position_embeddings", source, path + ".original_max_position_embeddings");
  if (!(s.factor > 0)) fail(source, path + ".factor", "must be > 0, got " + std::to_string(s.factor));
  if (!(s.low_freq_factor > 0)) fail(source, path + ".low_freq_factor", "must be > 0");
  if (!(s.high_freq_factor > s.low_freq_factor)) {
    fail(source, path + ".high_freq_factor",
         "must be greater than low_freq_factor (the smoothing divides by their difference)");
  }
  if (s.original_max_position_embeddings <= 0) fail(source, path + ".original_max_position_embeddings", "must be > 0");
  return s;
}

}  // namespace

int64_t ModelConfig::num_parameters() const {
  int64_t layer =
      2 * hidden_size + hidden_size * qkv_dim() + q_dim() * hidden_size + 3 * hidden_size * intermediate_size;
  return vocab_size * hidden_size * (tie_word_embeddings ? 1 : 2) + hidden_size + num_hidden_layers * layer;
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& source) {
  json root;
  try {
    root = json::parse(json_text, nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    throw zero3::ConfigError(source + ": not valid JSON: " + e.what());
  }
  if (!root.is_object()) throw zero3::ConfigError(source + ": expected a JSON object at the top level");

  if (present(root, "model_type")) {
    const json& mt = root.at("model_type");
    if (!mt.is_string() || mt.get<std::string>() != "llama") {
      fail(source, "model_type", "expected \"llama\", got " + mt.dump());
    }
  }
  if (present(root, "hidden_act")) {
    const json& act = root.at("hidden_act");
    if (!act.is_string() || act.get<std::string>() != "silu") {
      fail(source, "hidden_act", "only \"silu\" (SwiGLU) is supported, got " + act.dump());
    }
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (present(root, key) && read_bool(root, key, source, key)) {
      fail(source, key, "true is not supported: Llama-3 projections have no bias");
    }
  }
  if (present(root, "pretraining_tp") && read_int(root, "pretraining_tp", source, "pretraining_tp") > 1) {
    fail(source, "pretraining_tp", "values above 1 are not supported (they change the rounding of the projections)");
  }

  ModelConfig c;
  c.hidden_size = required_int(root, "hidden_size", source);
  c.intermediate_size = required_int(root, "intermediate_size", source);
  c.num_hidden_layers = required_int(root, "num_hidden_layers", source);
  c.num_attention_heads = required_int(root, "num_attention_heads", source);
  c.vocab_size = required_int(root, "vocab_size", source);
  c.num_key_value_heads = present(root, "num_key_value_heads")
                              ? read_int(root, "num_key_value_heads", source, "num_key_value_heads")
                              : c.num_attention_heads;
  if (present(root, "head_dim")) {
    c.head_dim = read_int(root, "head_dim", source, "head_dim");
  } else {
    if (c.num_attention_heads <= 0) fail(source, "num_attention_heads", "must be > 0");
    if (c.hidden_size % c.num_attention_heads != 0) {
      fail(source, "num_attention_heads",
           "must divide hidden_size (" + std::to_string(c.hidden_size) + ") when head_dim is not given");
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (present(root, "rms_norm_eps")) c.rms_norm_eps = read_double(root, "rms_norm_eps", source, "rms_norm_eps");
  if (present(root, "max_position_embeddings")) {
    c.max_position_embeddings = read_int(root, "max_position_embeddings", source, "max_position_embeddings");
  }
  if (present(root, "tie_word_embeddings")) {
    c.tie_word_embeddings = read_bool(root, "tie_word_embeddings", source, "tie_word_embeddings");
  }
  if (present(root, "initializer_range")) {
    c.initializer_range = read_double(root, "initializer_range", source, "initializer_range");
  }
  if (present(root, "rope_theta")) c.rope_theta = read_double(root, "rope_theta", source, "rope_theta");
  if (present(root, "rope_parameters")) {
    const json& rp = root.at("rope_parameters");
    if (rp.is_object() && present(rp, "rope_theta")) {
      double theta = read_double(rp, "rope_theta", source, "rope_parameters.rope_theta");
      if (present(root, "rope_theta") && theta != c.rope_theta) {
        fail(source, "rope_parameters.rope_theta",
             "disagrees with the top-level rope_theta (" + std::to_string(c.rope_theta) + ")");
      }
      c.rope_theta = theta;
    }
    c.rope_scaling = read_rope_scaling(rp, source, "rope_parameters");
  }
  if (present(root, "rope_scaling")) {
    auto s = read_rope_scaling(root.at("rope_scaling"), source, "rope_scaling");
    if (present(root, "rope_parameters") && s.has_value() != c.rope_scaling.has_value()) {
      fail(source, "rope_scaling", "disagrees with rope_parameters");
    }
    c.rope_scaling = s;
  }
  validate(c, source);
  return c;
}

void validate(const ModelConfig& c, const std::string& source) {
  auto positive = [&](const char* key, int64_t v) {
    if (v <= 0) fail(source, key, "must be > 0, got " + std::to_string(v));
  };
  positive("hidden_size", c.hidden_size);
  positive("intermediate_size", c.intermediate_size);
  positive("num_hidden_layers", c.num_hidden_layers);
  positive("num_attention_heads", c.num_attention_heads);
  positive("num_key_value_heads", c.num_key_value_heads);
  positive("vocab_size", c.vocab_size);
  positive("head_dim", c.head_dim);
  positive("max_position_embeddings", c.max_position_embeddings);
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    fail(source, "num_key_value_heads",
         "must divide num_attention_heads (" + std::to_string(c.num_attention_heads) + "), got " +
             std::to_string(c.num_key_value_heads));
  }
  if (c.head_dim % 2 != 0) {
    fail(source, "head_dim", "must be even (rotary embeddings rotate pairs), got " + std::to_string(c.head_dim));
  }
  if (c.vocab_size > INT32_MAX) fail(source, "vocab_size", "must fit a 32-bit token id");
  if (!(c.rms_norm_eps > 0)) fail(source, "rms_norm_eps", "must be > 0, got " + std::to_string(c.rms_norm_eps));
  if (!(c.rope_theta > 0)) fail(source, "rope_theta", "must be > 0, got " + std::to_string(c.rope_theta));
  if (!(c.initializer_range >= 0)) fail(source, "initializer_range", "must be >= 0");
}

std::string exported_config_json(const std::string& json_text, const std::string& torch_dtype,
                                 const std::string& source) {
  nlohmann::ordered_json root;  // the file's own key order
  try {
    root = nlohmann::ordered_json::parse(json_text, nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const nlohmann::ordered_json::parse_error& e) {
    throw zero3::ConfigError(source + ": not valid JSON: " + e.what());
  }
  if (!root.is_object()) throw zero3::ConfigError(source + ": expected a JSON object at the top level");
  const bool has_dtype = root.contains("dtype");
  if (root.contains("torch_dtype") || !has_dtype) root["torch_dtype"] = torch_dtype;
  if (has_dtype) root["dtype"] = torch_dtype;
  return root.dump(2) + "\n";
}

void write_exported_config(const std::filesystem::path& dir, const std::string& json_text,
                           const std::string& torch_dtype) {
  const std::string text = exported_config_json(json_text, torch_dtype, "the model config");
  std::ofstream out(dir / "config.json", std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.flush()) throw zero3::IoError((dir / "config.json").string() + ": cannot write it");
}

ModelConfig load_model_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw zero3::IoError("cannot open the model config " + path + " for reading");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw zero3::IoError("cannot read the model config " + path);
  return parse_model_config(text.str(), path);
}

std::string describe(const ModelConfig& c) {
  std::ostringstream os;
  os << "hidden " << c.hidden_size << ", " << c.num_hidden_layers << " layers, " << c.num_attention_heads << " heads ("
     << c.num_key_value_heads << " kv, head_dim " << c.head_dim << "), ffn " << c.intermediate_size << ", vocab "
     << c.vocab_size << ", rope_theta " << c.rope_theta;
  if (c.rope_scaling) os << " (llama3 scaling x" << c.rope_scaling->factor << ")";
  double n = static_cast<double>(c.num_parameters());
  os.setf(std::ios::fixed);
  os.precision(2);
  if (n >= 1e9) {
    os << ", " << n / 1e9 << "B params";
  } else {
    os << ", " << n / 1e6 << "M params";
  }
  return os.str();
}

zero3::LlamaDims llama_dims(const ModelConfig& c) {
  zero3::LlamaDims d;
  d.hidden_size = c.hidden_size;
  d.intermediate_size = c.intermediate_size;
  d.num_hidden_layers = c.num_hidden_layers;
  d.num_attention_heads = c.num_attention_heads;
  d.num_key_value_heads = c.num_key_value_heads;
  d.head_dim = c.head_dim;
  d.vocab_size = c.vocab_size;
  d.tie_word_embeddings = c.tie_word_embeddings;
  return d;
}

}  // namespace llama3
