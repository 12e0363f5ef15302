#include "zero3/memory_plan.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/check.hpp"
#include "plan/gather_simulation.hpp"
#include "plan/plan_format.hpp"
#include "zero/reducer.hpp"
#include "zero/topology.hpp"
#include "zero3/error.hpp"

namespace zero3 {

int64_t UnitDesc::numel() const {
  int64_t total = 0;
  for (const auto& shape : params) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    total += n;
  }
  return total;
}

int64_t ModelDesc::numel() const {
  int64_t total = 0;
  for (const auto& u : units) total += u.numel();
  return total;
}

ModelDesc llama_model_desc(const LlamaDims& d, const std::string& name) {
  ZERO3_REQUIRE(d.hidden_size > 0 && d.intermediate_size > 0 && d.num_hidden_layers > 0 && d.num_attention_heads > 0 &&
                    d.vocab_size > 0 && d.num_key_value_heads >= 0 && d.head_dim >= 0,
                InvalidArgument, "llama_model_desc: dimensions must be positive (hidden_size ", d.hidden_size,
                ", intermediate_size ", d.intermediate_size, ", num_hidden_layers ", d.num_hidden_layers,
                ", num_attention_heads ", d.num_attention_heads, ", num_key_value_heads ", d.num_key_value_heads,
                ", vocab_size ", d.vocab_size, ")");
  int64_t kv_heads = d.num_key_value_heads > 0 ? d.num_key_value_heads : d.num_attention_heads;
  ZERO3_REQUIRE(d.num_attention_heads % kv_heads == 0, InvalidArgument, "llama_model_desc: num_attention_heads ",
                d.num_attention_heads, " is not a multiple of num_key_value_heads ", kv_heads);
  int64_t head_dim = d.head_dim;
  if (head_dim == 0) {
    ZERO3_REQUIRE(d.hidden_size % d.num_attention_heads == 0, InvalidArgument, "llama_model_desc: hidden_size ",
                  d.hidden_size, " is not a multiple of num_attention_heads ", d.num_attention_heads);
    head_dim = d.hidden_size / d.num_attention_heads;
  }
  const int64_t h = d.hidden_size, q = d.num_attention_heads * head_dim, kv = kv_heads * head_dim;
  const int64_t ffn = d.intermediate_size;

  ModelDesc m;
  m.name = name;
  m.units.push_back({"embed", {{d.vocab_size, h}}});
  for (int64_t i = 0; i < d.num_hidden_layers; ++i) {
    m.units.push_back({"layer." + std::to_string(i),
                       {{q, h},
                        {kv, h},
                        {kv, h},
                        {h, q},  // q, k, v, o projections
                        {ffn, h},
                        {ffn, h},
                        {h, ffn},  // gate, up, down
                        {h},
                        {h}}});  // input and post-attention RMSNorm
  }
  UnitDesc head{"head", {{h}}};
  if (!d.tie_word_embeddings) head.params.push_back({d.vocab_size, h});
  m.units.push_back(std::move(head));
  return m;
}

namespace {

using nlohmann::json;

int64_t read_positive(const json& j, const char* key, const std::string& source, bool required, int64_t fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    ZERO3_REQUIRE(!required, ConfigError, source, ": ", key, ": missing (a Llama config.json needs it)");
    return fallback;
  }
  ZERO3_REQUIRE(it->is_number(), ConfigError, source, ": ", key, ": expected a number, got ", it->dump());
  double v = it->get<double>();
  ZERO3_REQUIRE(v >= 1 && v == static_cast<double>(static_cast<int64_t>(v)), ConfigError, source, ": ", key,
                ": expected a positive integer, got ", it->dump());
  return static_cast<int64_t>(v);
}

ModelDesc parse_unit_list(const json& j, const std::string& source) {
  ModelDesc m;
  if (auto n = j.find("name"); n != j.end()) {
    ZERO3_REQUIRE(n->is_string(), ConfigError, source, ": name: expected a string, got ", n->dump());
    m.name = n->get<std::string>();
  }
  const json& units = j.at("units");
  ZERO3_REQUIRE(units.is_array() && !units.empty(), ConfigError, source,
                ": units: expected a non-empty array of {\"name\": ..., \"params\": [[shape]...]}");
  for (size_t u = 0; u < units.size(); ++u) {
    const json& unit = units[u];
    std::string where = source + ": units[" + std::to_string(u) + "]";
    ZERO3_REQUIRE(unit.is_object(), ConfigError, where, ": expected an object, got ", unit.dump());
    for (auto it = unit.begin(); it != unit.end(); ++it) {
      ZERO3_REQUIRE(it.key() == "name" || it.key() == "params", ConfigError, where, ".", it.key(),
                    ": unknown key (a unit has \"name\" and \"params\")");
    }
    UnitDesc desc;
    desc.name = "unit." + std::to_string(u);
    if (auto n = unit.find("name"); n != unit.end()) {
      ZERO3_REQUIRE(n->is_string(), ConfigError, where, ".name: expected a string, got ", n->dump());
      desc.name = n->get<std::string>();
    }
    auto params = unit.find("params");
    ZERO3_REQUIRE(params != unit.end() && params->is_array() && !params->empty(), ConfigError, where,
                  ".params: expected a non-empty array of shapes such as [[4096, 4096], [4096]]");
    for (size_t p = 0; p < params->size(); ++p) {
      const json& shape = (*params)[p];
      std::string pwhere = where + ".params[" + std::to_string(p) + "]";
      ZERO3_REQUIRE(shape.is_array() && !shape.empty(), ConfigError, pwhere,
                    ": expected a shape (a non-empty array of positive integers), got ", shape.dump());
      std::vector<int64_t> dims;
      for (const json& d : shape) {
        ZERO3_REQUIRE(d.is_number_integer() && d.get<int64_t>() > 0, ConfigError, pwhere,
                      ": dimensions must be positive integers, got ", shape.dump());
        dims.push_back(d.get<int64_t>());
      }
      desc.params.push_back(std::move(dims));
    }
    m.units.push_back(std::move(desc));
  }
  return m;
}

}  // namespace

ModelDesc parse_model_desc(const std::string& json_text, const std::string& source, int64_t* hidden_size_out,
                           LlamaDims* dims_out) {
  json j;
  try {
    j = json::parse(json_text, nullptr, true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    throw ConfigError(source + ": not valid JSON: " + e.what());
  }
  ZERO3_REQUIRE(j.is_object(), ConfigError, source, ": expected a JSON object");
  if (hidden_size_out) *hidden_size_out = 0;
  if (dims_out) *dims_out = LlamaDims{};
  if (j.contains("units")) {
    ModelDesc m = parse_unit_list(j, source);
    if (hidden_size_out) *hidden_size_out = read_positive(j, "hidden_size", source, false, 0);
    return m;
  }
  ZERO3_REQUIRE(j.contains("hidden_size"), ConfigError, source,
                ": neither a Hugging Face Llama config.json (no \"hidden_size\") nor a unit list (no \"units\")");
  LlamaDims d;
  d.hidden_size = read_positive(j, "hidden_size", source, true, 0);
  d.intermediate_size = read_positive(j, "intermediate_size", source, true, 0);
  d.num_hidden_layers = read_positive(j, "num_hidden_layers", source, true, 0);
  d.num_attention_heads = read_positive(j, "num_attention_heads", source, true, 0);
  d.num_key_value_heads = read_positive(j, "num_key_value_heads", source, false, 0);
  d.head_dim = read_positive(j, "head_dim", source, false, 0);
  d.vocab_size = read_positive(j, "vocab_size", source, true, 0);
  if (auto t = j.find("tie_word_embeddings"); t != j.end() && !t->is_null()) {
    ZERO3_REQUIRE(t->is_boolean(), ConfigError, source, ": tie_word_embeddings: expected true or false, got ",
                  t->dump());
    d.tie_word_embeddings = t->get<bool>();
  }
  std::string name = "llama";
  if (auto n = j.find("_name_or_path"); n != j.end() && n->is_string() && !n->get<std::string>().empty()) {
    name = n->get<std::string>();
  }
  if (hidden_size_out) *hidden_size_out = d.hidden_size;
  if (dims_out) *dims_out = d;
  try {
    return llama_model_desc(d, name);
  } catch (const InvalidArgument& e) {
    throw ConfigError(source + ": " + e.what());
  }
}

ModelDesc load_model_desc(const std::string& path, int64_t* hidden_size_out, LlamaDims* dims_out) {
  std::ifstream in(path, std::ios::binary);
  ZERO3_REQUIRE(in.good(), ConfigError, path, ": cannot open the model description");
  std::ostringstream text;
  text << in.rdbuf();
  ZERO3_REQUIRE(!in.bad(), ConfigError, path, ": cannot read the model description");
  return parse_model_desc(text.str(), path, hidden_size_out, dims_out);
}

const char* to_string(MemoryTier tier) {
  switch (tier) {
    case MemoryTier::device:
      return "device";
    case MemoryTier::host:
      return "host";
    case MemoryTier::nvme:
      return "nvme";
  }
  return "?";
}

const char* to_string(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::params:
      return "params";
    case MemoryCategory::master:
      return "master";
    case MemoryCategory::grads:
      return "grads";
    case MemoryCategory::optimizer_state:
      return "optimizer";
    case MemoryCategory::buffers:
      return "buffers";
    case MemoryCategory::activations:
      return "activations";
  }
  return "?";
}

int64_t MemoryPlan::rank_bytes(MemoryTier tier) const {
  int64_t total = 0;
  for (const auto& e : entries) total += e.tier == tier ? e.bytes : 0;
  return total;
}

int64_t MemoryPlan::rank_bytes(MemoryCategory category) const {
  int64_t total = 0;
  for (const auto& e : entries) total += e.category == category ? e.bytes : 0;
  return total;
}

int64_t MemoryPlan::rank_bytes() const {
  int64_t total = 0;
  for (const auto& e : entries) total += e.bytes;
  return total;
}

namespace {

MemoryTier tier_of(OffloadDevice device) {
  switch (device) {
    case OffloadDevice::none:
      return MemoryTier::device;
    case OffloadDevice::cpu:
      return MemoryTier::host;
    case OffloadDevice::nvme:
      return MemoryTier::nvme;
  }
  return MemoryTier::device;
}

const char* dtype_label(DType t) { return t == DType::f32 ? "fp32" : t == DType::bf16 ? "bf16" : "fp16"; }

void check_plan_inputs(const ModelDesc& model, const Config& config, const MemoryPlanOptions& options) {
  ZERO3_REQUIRE(options.world_size >= 1, InvalidArgument, "plan_memory: world_size ", options.world_size,
                " must be >= 1");
  ZERO3_REQUIRE(options.ranks_per_node >= 1, InvalidArgument, "plan_memory: ranks_per_node ", options.ranks_per_node,
                " must be >= 1");
  ZERO3_REQUIRE(options.activation_bytes >= 0, InvalidArgument, "plan_memory: activation_bytes ",
                options.activation_bytes, " must be >= 0");
  ZERO3_REQUIRE(!model.units.empty(), InvalidArgument, "plan_memory: model '", model.name, "' has no units");
  const ZeroConfig& z = config.zero;
  ZERO3_REQUIRE(z.stage >= 0 && z.stage <= 3, ConfigError, "zero_optimization.stage: ", z.stage,
                " is not 0, 1, 2 or 3");
  ZERO3_REQUIRE(z.offload_param.device == OffloadDevice::none || z.stage == 3, ConfigError,
                "zero_optimization.offload_param.device: offloading parameters needs stage 3 (stage is ", z.stage, ")");
  ZERO3_REQUIRE(z.offload_optimizer.device == OffloadDevice::none || z.stage >= 1, ConfigError,
                "zero_optimization.offload_optimizer.device: offloading the optimizer needs stage 1, 2 or 3 "
                "(stage is 0)");
  ZERO3_REQUIRE(z.reduce_bucket_size.has_value(), ConfigError,
                "zero_optimization.reduce_bucket_size: still \"auto\"; pass --hidden-size to zero3 plan (or "
                "hidden_size to resolve())");
  ZERO3_REQUIRE(*z.reduce_bucket_size >= 0, ConfigError,
                "zero_optimization.reduce_bucket_size: ", *z.reduce_bucket_size,
                " is negative, expected a number of elements (0: the largest unit)");
}

// What every part of the plan reads: the config, the partition, the dtypes' sizes and where the state lives.
struct PlanInputs {
  PlanInputs(const Config& c, detail::ShardLayout l) : config(c), z(c.zero), layout(std::move(l)) {}

  const Config& config;
  const ZeroConfig& z;
  detail::ShardLayout layout;
  int64_t w = 1;  // ranks of the partition
  int64_t c = 4;  // bytes per compute-dtype element
  DType accum = DType::f32;
  int64_t g = 4;  // bytes per accumulated gradient element
  DType comm = DType::f32;
  std::string cl, gl;  // the compute and gradient dtypes' labels
  MemoryTier opt_tier = MemoryTier::device;
  int64_t full = 0;   // padded elements, all units
  int64_t owned = 0;  // the optimizer's range, all units
  // Offload from a GPU (on the cpu device everything is host memory already): the optimizer's state and the
  // parameter slices move, the step stages gradients and compute copies through pinned host memory.
  bool gpu = false;
  bool optimizer_off = false;
  bool param_off = false;
  // With fp32 compute the parameters are the master, unless offload on a GPU puts them in different places.
  bool separate_master = false;
  std::vector<detail::SimulatedUnit> units;
  int64_t largest_slice = 0, largest_numel = 0;
};

void add_entry(MemoryPlan& plan, MemoryCategory cat, MemoryTier tier, int64_t bytes, std::string what) {
  if (bytes > 0) plan.entries.push_back({cat, tier, bytes, std::move(what)});
}

// Each unit's slice and padded size over the partition, and the plan's totals of them.
void size_units(const ModelDesc& model, PlanInputs& in, MemoryPlan& plan) {
  const int64_t w = in.w;
  for (const auto& u : model.units) {
    int64_t p = u.numel();
    ZERO3_REQUIRE(p > 0, InvalidArgument, "plan_memory: unit '", u.name, "' has no elements");
    int64_t slice = (p + w - 1) / w;
    plan.total_params += p;
    plan.shard_params += slice;
    plan.padded_params += slice * w;
    plan.largest_unit = std::max(plan.largest_unit, slice * w);
    in.largest_slice = std::max(in.largest_slice, slice);
    in.largest_numel = std::max(in.largest_numel, p);
    in.units.push_back({p, slice * w, false});
  }
}

// The scratch of the gathers in flight (gather_scratch_bytes: qwZ's int8 messages, the hierarchical gather's
// inter-node stage). A non-persistent unit holds its scratch only while it is live, so the live units' is at
// most that of the units with the most scratch per padded element filling live_params (the last one in part);
// a persistent unit's gather (unquantized) after the step may run beside it.
void add_gather_scratch(const PlanInputs& in, MemoryPlan& plan) {
  const ZeroConfig& z = in.z;
  const detail::ShardLayout& layout = in.layout;
  const int64_t w = in.w, c = in.c;
  const int staged = layout.hierarchical ? layout.shard_size / layout.nodes.ranks_per_node : 0;
  const QuantFormat fmt{8, in.config.zero3.qwz_block_size};
  auto scratch_of = [&](int64_t piece, int pieces, bool quantized) {
    return detail::gather_scratch_bytes(piece, pieces, staged, quantized && pieces > 1, fmt, c);
  };
  int64_t scratch = 0;
  std::vector<std::pair<int64_t, int64_t>> live;  // scratch, padded elements
  for (const auto& u : in.units) {
    int64_t b = scratch_of(u.padded / w, static_cast<int>(w), z.quantized_weights && !u.persistent);
    if (layout.kind == detail::LayoutKind::hpz && !u.persistent) {  // the later gathers read the secondary copy
      b = std::max(b, scratch_of(u.padded / layout.hpz_size, layout.hpz_size, z.quantized_weights));
    }
    if (u.persistent) {
      scratch += b;
    } else {
      live.emplace_back(b, u.padded);
    }
  }
  std::sort(live.begin(), live.end(), [](const auto& x, const auto& y) {
    return static_cast<long double>(x.first) * y.second > static_cast<long double>(y.first) * x.second;
  });
  int64_t room = plan.live_params;
  for (const auto& [b, padded] : live) {
    const int64_t taken = std::min(room, padded);
    scratch += taken == padded ? b : static_cast<int64_t>(std::ceil(static_cast<long double>(b) * taken / padded));
    room -= taken;
  }
  const std::string parts = z.quantized_weights && layout.hierarchical ? "qwZ int8 messages, hierarchical staging"
                            : z.quantized_weights                      ? "qwZ int8 messages"
                                                                       : "hierarchical staging";
  add_entry(plan, MemoryCategory::buffers, MemoryTier::device, scratch,
            "gather scratch, worst case (" + parts + (layout.hierarchical ? ", " + in.cl : std::string()) + ")");
}

// Stage 3: the slices, the persistent units, the worst micro-step's gathered units (by the engine's gather rules),
// hpZ's secondary partition and the gathers' scratch.
void add_stage3_parameters(PlanInputs& in, MemoryPlan& plan) {
  const ZeroConfig& z = in.z;
  const int64_t c = in.c;
  const std::string& cl = in.cl;
  ZERO3_REQUIRE(z.prefetch_bucket_size.has_value(), ConfigError,
                "zero_optimization.stage3_prefetch_bucket_size: still \"auto\"; pass --hidden-size to zero3 plan "
                "(or hidden_size to resolve())");
  ZERO3_REQUIRE(z.param_persistence_threshold.has_value(), ConfigError,
                "zero_optimization.stage3_param_persistence_threshold: still \"auto\"; pass --hidden-size to zero3 "
                "plan (or hidden_size to resolve())");
  for (auto& u : in.units) {
    if (u.numel <= *z.param_persistence_threshold && plan.persistent_numel + u.numel <= z.model_persistence_threshold) {
      u.persistent = true;
      plan.persistent_numel += u.numel;
      plan.persistent_params += u.padded;
    }
  }
  // The worst micro-step: the window's last, or one within it that keeps the next one's first units. What
  // step() leaves gathered (those first units) is within both: they are gathered together after the first entry.
  const detail::SimulatedGathers sim =
      detail::simulate_gathers(in.units, *z.prefetch_bucket_size, z.max_live_parameters, z.max_reuse_distance);
  const detail::SimulatedGathers window = detail::simulate_gathers(
      in.units, *z.prefetch_bucket_size, z.max_live_parameters, z.max_reuse_distance, /*keep_first_units=*/true);
  plan.live_params = std::max(sim.peak_padded, window.peak_padded);
  plan.live_numel = std::max(sim.peak_numel, window.peak_numel);
  const MemoryTier slice_tier = tier_of(z.offload_param.device);
  if (in.separate_master) {
    add_entry(plan, MemoryCategory::params, slice_tier, plan.shard_params * c, "parameter slices (" + cl + ")");
    add_entry(plan, MemoryCategory::master, in.opt_tier, plan.shard_params * 4, "master weight slices (fp32)");
  } else {
    add_entry(plan, MemoryCategory::params, slice_tier, plan.shard_params * 4, "parameter slices, the master (fp32)");
  }
  add_entry(plan, MemoryCategory::params, MemoryTier::device, plan.persistent_params * c,
            "persistent units, kept gathered (" + cl + ")");
  add_entry(plan, MemoryCategory::params, MemoryTier::device, plan.live_params * c,
            "gathered units, worst case (" + cl + ")");
  const detail::ShardLayout& layout = in.layout;
  if (layout.kind == detail::LayoutKind::hpz) {
    int64_t secondary = 0;
    for (const auto& u : in.units) secondary += u.persistent ? 0 : u.padded / layout.hpz_size;
    // On the device, or in host memory where zero3.hpz_secondary_memory says so (on a GPU; on the cpu device the
    // device is host memory).
    const MemoryTier tier = in.gpu && in.config.zero3.hpz_secondary_on_host ? MemoryTier::host : MemoryTier::device;
    add_entry(plan, MemoryCategory::params, tier, secondary * c,
              "hpZ secondary partition, 1/" + std::to_string(layout.hpz_size) + " of each unit (" + cl + ")");
  }
  if (layout.hierarchical || z.quantized_weights) add_gather_scratch(in, plan);
}

// Parameters in the compute dtype, and the fp32 master.
void add_parameters(PlanInputs& in, MemoryPlan& plan) {
  const ZeroConfig& z = in.z;
  if (z.stage < 3) {
    add_entry(plan, MemoryCategory::params, MemoryTier::device, in.full * in.c,
              "parameters, replicated (" + in.cl + ")");
    if (in.separate_master) {
      add_entry(plan, MemoryCategory::master, in.opt_tier, in.owned * 4,
                z.stage == 0 ? "master weights, replicated (fp32)" : "master weight slices (fp32)");
    }
  } else {
    add_stage3_parameters(in, plan);
  }
}

// Gradients: the accumulator, and one open backward scope's buffer; then Adam's m and v.
void add_gradients_and_moments(const PlanInputs& in, MemoryPlan& plan) {
  const ZeroConfig& z = in.z;
  const int64_t g = in.g;
  const std::string& gl = in.gl;
  add_entry(plan, MemoryCategory::grads, MemoryTier::device, plan.largest_unit * g,
            "backward scope buffer, largest unit (" + gl + ")");
  // The accumulator stays on the device with offload too: the step copies it to the host tile by tile.
  if (z.stage < 2) {
    add_entry(plan, MemoryCategory::grads, MemoryTier::device, in.full * g,
              "gradient accumulator, replicated (" + gl + ")");
  } else {
    add_entry(plan, MemoryCategory::grads, MemoryTier::device, plan.shard_params * g,
              "gradient accumulator slices (" + gl + ")");
  }
  add_entry(plan, MemoryCategory::optimizer_state, in.opt_tier, in.owned * 8,
            z.stage == 0 ? "Adam m, v, replicated (fp32)" : "Adam m, v slices (fp32)");
}

// The reducer's ring of buckets: enough to hold the largest unit's reduction in flight (reduce_buckets_in_flight,
// reducer.hpp).
void add_reduce_buckets(const PlanInputs& in, MemoryPlan& plan) {
  const ZeroConfig& z = in.z;
  const detail::ShardLayout& layout = in.layout;
  const int64_t w = in.w;
  const int64_t largest_slice = in.largest_slice, largest_numel = in.largest_numel;
  const int64_t cb = static_cast<int64_t>(dtype_size(in.comm));
  const std::string comm_label = dtype_label(in.comm);
  // reduce_bucket_size 0: a bucket holds the largest unit (as the engine reads it).
  const int64_t bucket = *z.reduce_bucket_size > 0 ? *z.reduce_bucket_size
                         : z.stage >= 2            ? largest_slice * w
                                                   : largest_numel;
  if (z.stage >= 2) {
    int64_t chunk = std::max<int64_t>(1, std::min(std::max<int64_t>(1, bucket / w), plan.shard_params));
    const int64_t n = detail::reduce_buckets_in_flight(largest_slice * w, chunk * w);
    if (z.quantized_gradients) {
      // qgZ: each bucket's output holds the two all-to-alls' int4 messages and their fp32 sums (qgz_layout).
      const int local = layout.qgz_intra_group(0).size(), across = layout.qgz_inter_group(0).size();
      const auto out = static_cast<int64_t>(
          detail::qgz_layout(chunk, local, across, QuantFormat{4, in.config.zero3.qgz_block_size}).total);
      add_entry(plan, MemoryCategory::buffers, MemoryTier::device, n * (chunk * w * cb + out),
                "qgZ buckets, " + std::to_string(n) + " x " + std::to_string(chunk * w) + " (" + comm_label +
                    " in, int4 + fp32 out)");
    } else {
      add_entry(
          plan, MemoryCategory::buffers, MemoryTier::device, n * (chunk * w + chunk) * cb,
          "reduce-scatter buckets, " + std::to_string(n) + " x " + std::to_string(chunk * w) + " (" + comm_label + ")");
    }
    if (layout.replicas() > 1) {
      int64_t across = std::max<int64_t>(1, std::min(*z.reduce_bucket_size, plan.shard_params));
      const int64_t na = detail::reduce_buckets_in_flight(largest_slice, across);
      add_entry(plan, MemoryCategory::buffers, MemoryTier::device, na * across * cb,
                "all-reduce buckets across the replicas, " + std::to_string(na) + " x " + std::to_string(across) +
                    " (" + comm_label + ")");
    }
  } else {
    int64_t chunk = std::max<int64_t>(1, std::min(bucket, plan.total_params));
    const int64_t n = detail::reduce_buckets_in_flight(largest_numel, chunk);
    add_entry(plan, MemoryCategory::buffers, MemoryTier::device, n * chunk * cb,
              "all-reduce buckets, " + std::to_string(n) + " x " + std::to_string(chunk) + " (" + comm_label + ")");
  }
}

// The optimizer step's tiles (offload needs stage >= 1, where the owned ranges are slices), and with offload from a
// GPU the staging of the tiles between the device and host memory.
void add_step_buffers(const PlanInputs& in, MemoryPlan& plan) {
  const ZeroConfig& z = in.z;
  const int64_t c = in.c, g = in.g;
  const int64_t step_tile = std::min(z.sub_group_size, z.stage == 0 ? in.largest_numel : in.largest_slice);
  if (in.accum != DType::f32) {
    add_entry(plan, MemoryCategory::buffers, in.gpu && in.optimizer_off ? MemoryTier::host : MemoryTier::device,
              step_tile * 4, "optimizer step tile (fp32)");
  }
  if (in.gpu && in.optimizer_off) {
    // Two pinned slots for gradients coming down and, unless Adam writes the host slices, two for the
    // compute copies going up.
    const int64_t up = in.param_off ? 0 : c;
    add_entry(plan, MemoryCategory::buffers, MemoryTier::host, 2 * step_tile * (g + up),
              "step staging, 2 x " + std::to_string(step_tile) + " (" + in.gl + " grads" +
                  (up > 0 ? " + " + in.cl + " params" : "") + ")");
  }
  if (in.gpu && in.param_off && !in.optimizer_off) {
    add_entry(plan, MemoryCategory::buffers, MemoryTier::device, step_tile * c,
              "step tile of parameters for the host slices (" + in.cl + ")");
  }
}

// Staging buffers of the NVMe tiers.
void add_nvme_staging(const PlanInputs& in, MemoryPlan& plan) {
  const ZeroConfig& z = in.z;
  if (z.offload_param.device == OffloadDevice::nvme) {
    add_entry(plan, MemoryCategory::buffers, MemoryTier::host,
              z.offload_param.buffer_count * z.offload_param.buffer_size * in.c,
              "NVMe staging, params: " + std::to_string(z.offload_param.buffer_count) + " x " +
                  std::to_string(z.offload_param.buffer_size) + " (" + in.cl + ")");
  }
  if (z.offload_optimizer.device == OffloadDevice::nvme) {
    int64_t elems = std::min(z.sub_group_size, plan.shard_params);
    add_entry(plan, MemoryCategory::buffers, MemoryTier::host, z.offload_optimizer.buffer_count * elems * 4,
              "NVMe staging, optimizer: " + std::to_string(z.offload_optimizer.buffer_count) + " x " +
                  std::to_string(elems) + " (fp32)");
  }
}

}  // namespace

MemoryPlan plan_memory(const ModelDesc& model, const Config& config, const MemoryPlanOptions& options) {
  check_plan_inputs(model, config, options);
  const ZeroConfig& z = config.zero;
  MemoryPlan plan;
  plan.stage = z.stage;
  plan.compute_dtype = config.compute_dtype();
  plan.world_size = options.world_size;
  plan.ranks_per_node = options.ranks_per_node;
  plan.nodes = (options.world_size + options.ranks_per_node - 1) / options.ranks_per_node;
  plan.device_is_host = config.zero3.device == "cpu";

  // The partition: every rank, or MiCS's shard group (whose replicas hold the same slices).
  PlanInputs in(config, detail::plan_layout(z, options.world_size, options.ranks_per_node));
  plan.partition_size = in.layout.shard_size;
  plan.layout = in.layout.describe();
  in.w = in.layout.shard_size;
  in.c = static_cast<int64_t>(dtype_size(plan.compute_dtype));
  in.accum = config.grad_accum_dtype.value_or(DType::f32);
  in.g = static_cast<int64_t>(dtype_size(in.accum));
  in.comm = config.communication_dtype();
  in.cl = dtype_label(plan.compute_dtype);
  in.gl = dtype_label(in.accum);
  in.opt_tier = tier_of(z.offload_optimizer.device);
  size_units(model, in, plan);
  plan.checkpoint_bytes = checkpoint_bytes(model, in.w);
  in.full = plan.padded_params;
  in.owned = z.stage == 0 ? in.full : plan.shard_params;
  in.gpu = !plan.device_is_host;
  in.optimizer_off = z.offload_optimizer.device != OffloadDevice::none;
  in.param_off = z.offload_param.device != OffloadDevice::none;
  in.separate_master = plan.compute_dtype != DType::f32 || (in.gpu && (in.optimizer_off || in.param_off));

  add_parameters(in, plan);
  add_gradients_and_moments(in, plan);
  add_reduce_buckets(in, plan);
  add_step_buffers(in, plan);
  add_nvme_staging(in, plan);
  add_entry(plan, MemoryCategory::activations, MemoryTier::device, options.activation_bytes,
            "activations (estimate given)");
  return plan;
}

namespace {

using detail::with_commas;

// "0 B", "512 B", "2.50 KiB", "1.87 GiB"
std::string human(int64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[u]);
  return buf;
}

}  // namespace

int64_t checkpoint_bytes(const ModelDesc& model, int64_t world_size) {
  ZERO3_REQUIRE(world_size >= 1, InvalidArgument, "checkpoint_bytes: world_size ", world_size, " must be >= 1");
  return 12 * model.numel() + static_cast<int64_t>(model.units.size()) * world_size * 4096 + 65536;
}

std::string format_memory_plan(const MemoryPlan& p) {
  std::ostringstream os;
  os << "zero3 memory plan: ZeRO stage " << p.stage << ", " << dtype_label(p.compute_dtype) << ", world size "
     << p.world_size << " (" << p.nodes << (p.nodes == 1 ? " node" : " nodes") << " x " << p.ranks_per_node
     << " ranks)\n";
  if (p.stage == 3) os << "layout: " << p.layout << "\n";
  os << "parameters: " << with_commas(p.total_params) << " (padded " << with_commas(p.padded_params) << ", "
     << with_commas(p.shard_params) << " owned per rank)";
  os << "\ncheckpoint: " << with_commas(p.checkpoint_bytes) << " bytes (" << human(p.checkpoint_bytes)
     << ") per save, all ranks' files (fp32 master weights and Adam moments, 12 bytes per parameter)";
  if (p.stage == 3) {
    os << "\nstage 3: persistent units " << with_commas(p.persistent_numel)
       << " elements; gathered at once, worst case " << with_commas(p.live_numel) << " elements ("
       << with_commas(p.live_params) << " padded)";
  }
  os << "\n\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-12s %-56s %-7s %20s %11s\n", "category", "what", "tier", "bytes/rank", "");
  os << line;
  for (const auto& e : p.entries) {
    std::snprintf(line, sizeof line, "%-12s %-56s %-7s %20s %11s\n", to_string(e.category), e.what.c_str(),
                  to_string(e.tier), with_commas(e.bytes).c_str(), human(e.bytes).c_str());
    os << line;
  }
  os << "\n";
  std::snprintf(line, sizeof line, "%-12s %-7s %20s %11s %22s %11s\n", "total", "tier", "bytes/rank", "", "bytes/node",
                "");
  os << line;
  for (MemoryTier t : {MemoryTier::device, MemoryTier::host, MemoryTier::nvme}) {
    std::snprintf(line, sizeof line, "%-12s %-7s %20s %11s %22s %11s\n", "", to_string(t),
                  with_commas(p.rank_bytes(t)).c_str(), human(p.rank_bytes(t)).c_str(),
                  with_commas(p.node_bytes(t)).c_str(), human(p.node_bytes(t)).c_str());
    os << line;
  }
  if (p.device_is_host) {
    int64_t host = p.node_bytes(MemoryTier::device) + p.node_bytes(MemoryTier::host);
    os << "zero3.device is cpu: the device tier is host memory; host memory per node " << with_commas(host) << " ("
       << human(host) << ")\n";
  }
  return os.str();
}

}  // namespace zero3
