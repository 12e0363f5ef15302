#include "checkpoint/manifest.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>

#include "zero3/error.hpp"

namespace zero3::ckpt {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// Field access with messages that name the field's path in the manifest.
class Reader {
 public:
  explicit Reader(std::string label) : label_(std::move(label)) {}

  [[noreturn]] void fail(const std::string& what) const { throw CheckpointError(label_ + ": " + what); }

  const json& field(const json& obj, const char* key, const std::string& where) const {
    if (!obj.is_object()) fail(where + " is not a JSON object");
    auto it = obj.find(key);
    if (it == obj.end()) fail("missing field " + join(where, key));
    return *it;
  }

  int64_t integer(const json& obj, const char* key, const std::string& where, int64_t lo, int64_t hi) const {
    const json& v = field(obj, key, where);
    if (!v.is_number_integer()) fail(join(where, key) + " is not an integer: " + v.dump());
    const int64_t x =
        v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : v.get<int64_t>();
    if (x < lo || x > hi) {
      fail(join(where, key) + " is " + std::to_string(x) + ", expected " + std::to_string(lo) + ".." +
           std::to_string(hi));
    }
    return x;
  }

  uint64_t unsigned_integer(const json& obj, const char* key, const std::string& where) const {
    const json& v = field(obj, key, where);
    if (!v.is_number_unsigned()) fail(join(where, key) + " is not a non-negative integer: " + v.dump());
    return v.get<uint64_t>();
  }

  double number(const json& obj, const char* key, const std::string& where) const {
    const json& v = field(obj, key, where);
    if (!v.is_number()) fail(join(where, key) + " is not a number: " + v.dump());
    return v.get<double>();
  }

  std::string string(const json& obj, const char* key, const std::string& where) const {
    const json& v = field(obj, key, where);
    if (!v.is_string()) fail(join(where, key) + " is not a string: " + v.dump());
    return v.get<std::string>();
  }

  const json& array(const json& obj, const char* key, const std::string& where) const {
    const json& v = field(obj, key, where);
    if (!v.is_array()) fail(join(where, key) + " is not an array");
    return v;
  }

  DType dtype(const json& obj, const char* key, const std::string& where) const {
    const std::string s = string(obj, key, where);
    std::optional<DType> t = parse_dtype(s);
    if (!t) fail(join(where, key) + " is '" + s + "', not one of f32, bf16, f16");
    return *t;
  }

  static std::string join(const std::string& where, const char* key) {
    return where.empty() ? std::string(key) : where + "." + key;
  }

 private:
  std::string label_;
};

bool safe_file_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name.find('\0') == std::string::npos && name[0] != '.';
}

std::string str(int64_t v) { return std::to_string(v); }

// The step counters and the loss scaler's state, against each other (a fresh engine and every step keep these).
void check_counters(const Reader& r, const TrainingState& s) {
  if (s.applied_steps + s.skipped_steps != s.global_steps) {
    r.fail("training_state: applied_steps (" + str(s.applied_steps) + ") + skipped_steps (" + str(s.skipped_steps) +
           ") != global_steps (" + str(s.global_steps) + ")");
  }
  if (s.micro_steps < s.global_steps) {
    r.fail("training_state.micro_steps " + str(s.micro_steps) + " is below global_steps " + str(s.global_steps) +
           " (every optimizer step ends at least one micro-step)");
  }
  if (s.scaler_iter < 0 || s.scaler_iter > s.global_steps) {
    r.fail("training_state.scaler_iter " + str(s.scaler_iter) + " is outside 0..global_steps (" + str(s.global_steps) +
           "): the loss scaler counts at most one iteration per optimizer step");
  }
  if (s.scaler_last_overflow_iter != -1 &&
      (s.scaler_last_overflow_iter < 0 || s.scaler_last_overflow_iter >= s.scaler_iter)) {
    r.fail("training_state.scaler_last_overflow_iter " + str(s.scaler_last_overflow_iter) +
           " is neither -1 (no overflow) nor an iteration before scaler_iter " + str(s.scaler_iter));
  }
  if (!(s.loss_scale > 0) || !std::isfinite(s.loss_scale)) {
    r.fail("training_state.loss_scale " + std::to_string(s.loss_scale) + " is not a positive finite number");
  }
  if (s.scaler_hysteresis < 1) {
    r.fail("training_state.scaler_hysteresis " + str(s.scaler_hysteresis) + " is below 1");
  }
}

// "[b, e)"
std::string span(int64_t begin, int64_t length) { return "[" + str(begin) + ", " + str(begin + length) + ")"; }

// The files and their ranges against the partition the saving run used: at stages 1-3 rank r of W owns elements
// [r*S, min((r+1)*S, numel)) of every unit, S = ceil(numel / W), and writes one file holding exactly those ranges
// (none when it owns only padding); at stage 0 with several ranks rank 0 alone writes every unit whole. So the
// world size, the units' sizes and the files' ranges must agree, and a file's ranges cannot be another file's.
// A pipelined run's checkpoint holds one such partition per pipeline stage: the stage's units over its
// data_parallel_size ranks, each rank's file named after its stage and rank.
//
// Under MiCS the partition is a shard group of P ranks (P dividing W): the first group's ranks write its slices,
// S = ceil(numel / P). P is read from the stage's first unit (padded_numel / slice_numel) and must hold for every
// unit of the stage.
int saved_partition(const CheckpointInfo& info, int pipeline_stage) {
  const int ranks = info.data_parallel_size();
  if (info.stage == 0) return ranks;
  for (const CheckpointUnit& u : info.units) {
    if (u.pipeline_stage != pipeline_stage) continue;
    if (u.slice_numel <= 0) return ranks;
    const int64_t p = u.padded_numel / u.slice_numel;
    return p >= 1 && p <= ranks && ranks % p == 0 ? static_cast<int>(p) : ranks;
  }
  return ranks;
}

void check_layout(const Reader& r, const CheckpointInfo& info) {
  const int world = info.world_size;
  const int stages = info.pipeline_stages;
  const int ranks = info.data_parallel_size();  // of each stage: the world when not pipelined
  const bool pipelined = stages > 1;
  const bool replicated = info.stage == 0 && ranks > 1;
  // "rank 1 of 4", or in a pipelined checkpoint "rank 1 of pipeline stage 2's 4"
  auto rank_label = [&](int stage, int rank) {
    return "rank " + str(rank) + " of " + (pipelined ? "pipeline stage " + str(stage) + "'s " : "") + str(ranks);
  };
  // owned[stage * ranks + rank]: the ranges that rank of that stage saves.
  std::vector<std::vector<CheckpointRange>> owned(static_cast<size_t>(stages) * static_cast<size_t>(ranks));
  std::vector<int> partition(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) partition[static_cast<size_t>(s)] = saved_partition(info, s);
  for (size_t u = 0; u < info.units.size(); ++u) {
    const CheckpointUnit& unit = info.units[u];
    const int p = partition[static_cast<size_t>(unit.pipeline_stage)];
    const int64_t slice = (unit.numel + p - 1) / p;
    for (int rank = 0; rank < p; ++rank) {
      const int64_t begin = replicated ? 0 : rank * slice;
      const int64_t length =
          replicated ? (rank == 0 ? unit.numel : 0) : std::clamp<int64_t>(unit.numel - begin, 0, slice);
      if (length > 0)
        owned[static_cast<size_t>(unit.pipeline_stage * ranks + rank)].push_back({static_cast<int>(u), begin, length});
    }
  }
  size_t expected_files = 0;
  for (const auto& o : owned) expected_files += o.empty() ? 0 : 1;
  if (info.files.size() != expected_files) {
    std::string listed;
    for (const CheckpointFile& f : info.files) {
      listed += (listed.empty() ? "" : ", ") + (pipelined ? str(f.pipeline_stage) + "/" : "") + str(f.rank);
    }
    const std::string shape = pipelined ? "world_size " + str(world) + " as " + str(stages) +
                                              " pipeline stages x data_parallel_size " + str(ranks)
                                        : "world_size " + str(world);
    r.fail(shape + " at stage " + str(info.stage) + " means " + str(static_cast<int64_t>(expected_files)) +
           " shard file(s), one per rank that holds " +
           (replicated ? (pipelined ? "a stage's units (each stage's rank 0)" : "the model (rank 0)") : "a slice") +
           ", but files lists " + str(static_cast<int64_t>(info.files.size())) +
           (listed.empty() ? "" : (pipelined ? " (stage/rank " : " (ranks ") + listed + ")"));
  }
  for (size_t u = 0; u < info.units.size(); ++u) {
    const CheckpointUnit& unit = info.units[u];
    const int p = partition[static_cast<size_t>(unit.pipeline_stage)];
    const int64_t slice = (unit.numel + p - 1) / p;
    const std::string over =
        pipelined ? str(p) + " of pipeline stage " + str(unit.pipeline_stage) + "'s " + str(ranks) + " ranks"
                  : str(p) + " of world_size " + str(world) + " ranks";
    if (unit.slice_numel != slice || unit.padded_numel != slice * p) {
      r.fail("units[" + str(static_cast<int64_t>(u)) + "] ('" + unit.name + "'): slice_numel " + str(unit.slice_numel) +
             " and padded_numel " + str(unit.padded_numel) + " do not follow from numel " + str(unit.numel) +
             " and a partition over " + over + " (expected ceil(" + str(unit.numel) + " / " + str(p) +
             ") = " + str(slice) + " and " + str(slice * p) + ")");
    }
  }
  auto elements = [&](const CheckpointRange& x) {
    return "elements " + span(x.begin, x.length) + " of unit '" + info.units[static_cast<size_t>(x.unit)].name + "'";
  };
  std::vector<bool> seen(owned.size(), false);
  for (size_t i = 0; i < info.files.size(); ++i) {
    const CheckpointFile& f = info.files[i];
    const std::string where = "files[" + str(static_cast<int64_t>(i)) + "] (" + f.name + ")";
    const size_t slot = static_cast<size_t>(f.pipeline_stage * ranks + f.rank);
    if (seen[slot]) r.fail(where + ": a second file of " + rank_label(f.pipeline_stage, f.rank));
    seen[slot] = true;
    const std::string name = shard_file_name(info, f.pipeline_stage, f.rank);
    if (f.name != name)
      r.fail(where + ": " + rank_label(f.pipeline_stage, f.rank) + " writes '" + name + "', not '" + f.name + "'");
    const std::vector<CheckpointRange>& want = owned[slot];
    for (size_t k = 0; k < std::max(want.size(), f.ranges.size()); ++k) {
      const std::string claim = k < f.ranges.size() ? elements(f.ranges[k]) : "nothing";
      const std::string owns = k < want.size() ? elements(want[k]) : "nothing more";
      const bool same = k < want.size() && k < f.ranges.size() && want[k].unit == f.ranges[k].unit &&
                        want[k].begin == f.ranges[k].begin && want[k].length == f.ranges[k].length;
      if (!same) {
        r.fail(where + ": ranges[" + str(static_cast<int64_t>(k)) + "] is " + claim + ", but " +
               rank_label(f.pipeline_stage, f.rank) + " at stage " + str(info.stage) + " holds " + owns +
               " there (the ranges must be the saving run's partition: were they edited, or swapped between files?)");
      }
    }
  }
}

}  // namespace

const char* state_part_name(StatePart part) {
  switch (part) {
    case StatePart::master:
      return "master";
    case StatePart::exp_avg:
      return "exp_avg";
    case StatePart::exp_avg_sq:
      return "exp_avg_sq";
  }
  return "?";
}

float* state_part_data(const ShardView& view, StatePart part) {
  switch (part) {
    case StatePart::master:
      return view.master;
    case StatePart::exp_avg:
      return view.exp_avg;
    case StatePart::exp_avg_sq:
      return view.exp_avg_sq;
  }
  return nullptr;
}

std::string shard_tensor_name(const std::string& unit, StatePart part) { return unit + "." + state_part_name(part); }

std::string rank_file_name(int rank, int world_size) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "rank-%05d-of-%05d.safetensors", rank, world_size);
  return buf;
}

std::string stage_rank_file_name(int stage, int stages, int rank, int data_parallel_size) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "stage-%02d-of-%02d-rank-%05d-of-%05d.safetensors", stage, stages, rank,
                data_parallel_size);
  return buf;
}

std::string shard_file_name(const CheckpointInfo& info, int pipeline_stage, int rank) {
  if (info.pipeline_stages > 1) {
    return stage_rank_file_name(pipeline_stage, info.pipeline_stages, rank, info.data_parallel_size());
  }
  return rank_file_name(rank, info.world_size);
}

std::string crc_hex(uint32_t crc) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%08x", crc);
  return buf;
}

namespace {

ordered_json training_state_json(const TrainingState& s) {
  return {{"micro_steps", s.micro_steps},
          {"global_steps", s.global_steps},
          {"skipped_steps", s.skipped_steps},
          {"applied_steps", s.applied_steps},
          {"loss_scale", s.loss_scale},
          {"scaler_iter", s.scaler_iter},
          {"scaler_last_overflow_iter", s.scaler_last_overflow_iter},
          {"scaler_hysteresis", s.scaler_hysteresis}};
}

}  // namespace

std::string ranges_metadata(const std::vector<std::string>& unit_names, const std::vector<CheckpointRange>& ranges) {
  ordered_json out = ordered_json::array();
  for (const CheckpointRange& r : ranges) {
    out.push_back({unit_names.at(static_cast<size_t>(r.unit)), r.begin, r.length});
  }
  return out.dump();
}

std::string training_state_metadata(const TrainingState& state) { return training_state_json(state).dump(); }

namespace {

ordered_json units_json(const std::vector<CheckpointUnit>& units, bool pipelined) {
  ordered_json out = ordered_json::array();
  for (const CheckpointUnit& u : units) {
    ordered_json params = ordered_json::array();
    for (const CheckpointParam& p : u.params) {
      params.push_back({{"name", p.name},
                        {"shape", p.shape},
                        {"dtype", std::string(dtype_name(p.dtype))},
                        {"offset", p.offset},
                        {"numel", p.numel}});
    }
    ordered_json unit = {{"name", u.name},
                         {"dtype", std::string(dtype_name(u.dtype))},
                         {"numel", u.numel},
                         {"slice_numel", u.slice_numel},
                         {"padded_numel", u.padded_numel}};
    if (pipelined) unit["pipeline_stage"] = u.pipeline_stage;
    unit["params"] = std::move(params);
    out.push_back(std::move(unit));
  }
  return out;
}

// The units of a manifest (`units` is its "units" array); a pipelined one's carry their stage.
std::vector<CheckpointUnit> read_units(const Reader& r, const json& units, int pipeline_stages) {
  std::vector<CheckpointUnit> out;
  std::set<std::string> unit_names;
  for (size_t i = 0; i < units.size(); ++i) {
    const std::string where = "units[" + std::to_string(i) + "]";
    const json& ju = units[i];
    CheckpointUnit u;
    u.name = r.string(ju, "name", where);
    if (u.name.empty()) r.fail(where + ".name is empty");
    if (!unit_names.insert(u.name).second) r.fail("unit '" + u.name + "' appears twice");
    u.dtype = r.dtype(ju, "dtype", where);
    u.numel = r.integer(ju, "numel", where, 1, INT64_MAX);
    u.slice_numel = r.integer(ju, "slice_numel", where, 1, INT64_MAX);
    u.padded_numel = r.integer(ju, "padded_numel", where, 1, INT64_MAX);
    if (pipeline_stages > 1)
      u.pipeline_stage = static_cast<int>(r.integer(ju, "pipeline_stage", where, 0, pipeline_stages - 1));
    const json& params = r.array(ju, "params", where);
    std::set<std::string> names;
    int64_t offset = 0;
    for (size_t j = 0; j < params.size(); ++j) {
      const std::string pw = where + ".params[" + std::to_string(j) + "]";
      const json& jp = params[j];
      CheckpointParam p;
      p.name = r.string(jp, "name", pw);
      if (p.name.empty() || !names.insert(p.name).second) {
        r.fail(pw + ": parameter name '" + p.name + "' is empty or repeated in unit '" + u.name + "'");
      }
      p.full_name = u.name + "." + p.name;
      const json& shape = r.array(jp, "shape", pw);
      int64_t numel = 1;
      for (const json& d : shape) {
        if (!d.is_number_integer() || d.get<int64_t>() < 1) r.fail(pw + ".shape has a dimension that is not >= 1");
        const int64_t dim = d.get<int64_t>();
        if (numel > INT64_MAX / dim) r.fail(pw + ".shape overflows 64 bits");
        numel *= dim;
        p.shape.push_back(dim);
      }
      p.dtype = r.dtype(jp, "dtype", pw);
      p.offset = r.integer(jp, "offset", pw, 0, INT64_MAX);
      p.numel = r.integer(jp, "numel", pw, 1, INT64_MAX);
      if (p.numel != numel) {
        r.fail(pw + " ('" + p.full_name + "'): numel " + std::to_string(p.numel) + " does not match its shape");
      }
      if (p.offset != offset) {
        r.fail(pw + " ('" + p.full_name + "'): offset " + std::to_string(p.offset) + ", expected " +
               std::to_string(offset) + " (parameters lie back to back in declaration order)");
      }
      offset += p.numel;
      u.params.push_back(std::move(p));
    }
    if (offset != u.numel) {
      r.fail(where + " ('" + u.name + "'): its parameters hold " + std::to_string(offset) + " elements, numel is " +
             std::to_string(u.numel));
    }
    out.push_back(std::move(u));
  }
  return out;
}

}  // namespace

std::string units_to_json(const std::vector<CheckpointUnit>& units) { return units_json(units, false).dump(); }

std::vector<CheckpointUnit> units_from_json(std::string_view text, const std::string& label) {
  const Reader r(label);
  const json units = json::parse(text, nullptr, false);
  if (units.is_discarded() || !units.is_array()) r.fail("the units are not a JSON array");
  return read_units(r, units, 1);
}

std::string manifest_to_json(const CheckpointInfo& info) {
  ordered_json m = ordered_json::object();
  m["format"] = kFormatName;
  const bool pipelined = info.pipeline_stages > 1;
  m["format_version"] = pipelined ? kPipelineFormatVersion : kFormatVersion;
  m["zero3_version"] = info.zero3_version;
  m["tag"] = info.tag;
  m["created"] = info.created;
  m["world_size"] = info.world_size;
  m["stage"] = info.stage;
  if (pipelined) {
    m["pipeline"] = {{"stages", info.pipeline_stages}, {"data_parallel_size", info.data_parallel_size()}};
  }
  m["training_state"] = training_state_json(info.training_state);
  ordered_json extras = ordered_json::object();
  for (const auto& [k, v] : info.extras) extras[k] = v;
  m["extras"] = std::move(extras);
  ordered_json units = units_json(info.units, pipelined);
  m["units"] = std::move(units);
  ordered_json files = ordered_json::array();
  for (const CheckpointFile& f : info.files) {
    ordered_json ranges = ordered_json::array();
    for (const CheckpointRange& r : f.ranges) {
      ranges.push_back(
          {{"unit", info.units.at(static_cast<size_t>(r.unit)).name}, {"begin", r.begin}, {"length", r.length}});
    }
    ordered_json file = {{"name", f.name}, {"rank", f.rank}};
    if (pipelined) file["pipeline_stage"] = f.pipeline_stage;
    file["bytes"] = f.bytes;
    file["crc32c"] = crc_hex(f.crc32c);
    file["ranges"] = std::move(ranges);
    files.push_back(std::move(file));
  }
  m["files"] = std::move(files);
  if (!info.buffers.empty()) {
    ordered_json tensors = ordered_json::array();
    for (const CheckpointBuffer& b : info.buffers) {
      tensors.push_back(
          {{"name", b.name}, {"dtype", std::string(safetensors::dtype_name(b.dtype))}, {"shape", b.shape}});
    }
    m["buffers"] = {{"file", info.buffers_file.name},
                    {"bytes", info.buffers_file.bytes},
                    {"crc32c", crc_hex(info.buffers_file.crc32c)},
                    {"tensors", std::move(tensors)}};
  }
  // The config last: it is long, and a person reading the manifest wants the layout first.
  ordered_json config = ordered_json::parse(info.config_json, nullptr, false);
  m["config"] = config.is_discarded() ? ordered_json(info.config_json) : std::move(config);
  return m.dump(2) + "\n";
}

CheckpointInfo manifest_from_json(std::string_view text, const std::filesystem::path& path) {
  const Reader r(path.string());
  json m = json::parse(text, nullptr, false);
  if (m.is_discarded()) r.fail("not valid JSON");
  if (!m.is_object()) r.fail("not a JSON object");
  CheckpointInfo info;
  info.path = path.parent_path();
  const std::string format = r.string(m, "format", "");
  if (format != kFormatName) r.fail("format is '" + format + "', expected '" + kFormatName + "'");
  info.format_version = static_cast<int>(r.integer(m, "format_version", "", 1, INT32_MAX));
  if (info.format_version > kPipelineFormatVersion) {
    r.fail("format_version " + std::to_string(info.format_version) + " is newer than this build reads (" +
           std::to_string(kPipelineFormatVersion) + "); use a newer zero3");
  }
  info.zero3_version = r.string(m, "zero3_version", "");
  info.tag = r.string(m, "tag", "");
  info.created = r.string(m, "created", "");
  info.world_size = static_cast<int>(r.integer(m, "world_size", "", 1, 1 << 24));
  info.stage = static_cast<int>(r.integer(m, "stage", "", 0, 3));
  if (m.contains("pipeline")) {
    if (info.format_version < kPipelineFormatVersion) {
      r.fail("a pipeline section in a format_version " + std::to_string(info.format_version) + " manifest (it needs " +
             std::to_string(kPipelineFormatVersion) + ")");
    }
    const json& jp = r.field(m, "pipeline", "");
    info.pipeline_stages = static_cast<int>(r.integer(jp, "stages", "pipeline", 2, info.world_size));
    const int64_t ranks = r.integer(jp, "data_parallel_size", "pipeline", 1, info.world_size);
    if (ranks * info.pipeline_stages != info.world_size) {
      r.fail("pipeline.stages " + std::to_string(info.pipeline_stages) + " x pipeline.data_parallel_size " +
             std::to_string(ranks) + " is not world_size " + std::to_string(info.world_size));
    }
  } else if (info.format_version >= kPipelineFormatVersion) {
    r.fail("format_version " + std::to_string(info.format_version) + " without a pipeline section");
  }

  const json& st = r.field(m, "training_state", "");
  TrainingState& s = info.training_state;
  s.micro_steps = r.integer(st, "micro_steps", "training_state", 0, INT64_MAX);
  s.global_steps = r.integer(st, "global_steps", "training_state", 0, INT64_MAX);
  s.skipped_steps = r.integer(st, "skipped_steps", "training_state", 0, INT64_MAX);
  s.applied_steps = r.integer(st, "applied_steps", "training_state", 0, INT64_MAX);
  s.loss_scale = r.number(st, "loss_scale", "training_state");
  s.scaler_iter = r.integer(st, "scaler_iter", "training_state", INT64_MIN, INT64_MAX);
  s.scaler_last_overflow_iter = r.integer(st, "scaler_last_overflow_iter", "training_state", INT64_MIN, INT64_MAX);
  s.scaler_hysteresis = r.integer(st, "scaler_hysteresis", "training_state", INT64_MIN, INT64_MAX);
  check_counters(r, s);

  const json& extras = r.field(m, "extras", "");
  if (!extras.is_object()) r.fail("extras is not a JSON object");
  for (const auto& [k, v] : extras.items()) {
    if (!v.is_string()) r.fail("extras." + k + " is not a string");
    info.extras[k] = v.get<std::string>();
  }

  info.units = read_units(r, r.array(m, "units", ""), info.pipeline_stages);
  std::unordered_map<std::string, int> unit_index;
  for (size_t i = 0; i < info.units.size(); ++i) unit_index.emplace(info.units[i].name, static_cast<int>(i));

  const json& files = r.array(m, "files", "");
  std::set<std::string> file_names;
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string where = "files[" + std::to_string(i) + "]";
    const json& jf = files[i];
    CheckpointFile f;
    f.name = r.string(jf, "name", where);
    if (!safe_file_name(f.name)) r.fail(where + ".name '" + f.name + "' is not a plain file name");
    if (f.name == kManifestName || !file_names.insert(f.name).second) {
      r.fail(where + ".name '" + f.name + "' is repeated or reserved");
    }
    f.rank = static_cast<int>(r.integer(jf, "rank", where, 0, info.data_parallel_size() - 1));
    if (info.pipeline_stages > 1) {
      f.pipeline_stage = static_cast<int>(r.integer(jf, "pipeline_stage", where, 0, info.pipeline_stages - 1));
    }
    f.bytes = r.unsigned_integer(jf, "bytes", where);
    const std::string crc = r.string(jf, "crc32c", where);
    if (crc.size() != 8 || crc.find_first_not_of("0123456789abcdef") != std::string::npos) {
      r.fail(where + ".crc32c '" + crc + "' is not 8 lowercase hex digits");
    }
    f.crc32c = static_cast<uint32_t>(std::stoul(crc, nullptr, 16));
    const json& ranges = r.array(jf, "ranges", where);
    for (size_t k = 0; k < ranges.size(); ++k) {
      const std::string rw = where + ".ranges[" + std::to_string(k) + "]";
      const std::string unit = r.string(ranges[k], "unit", rw);
      auto it = unit_index.find(unit);
      if (it == unit_index.end()) r.fail(rw + ".unit '" + unit + "' is not a unit of the manifest");
      const CheckpointUnit& u = info.units[static_cast<size_t>(it->second)];
      CheckpointRange range;
      range.unit = it->second;
      range.begin = r.integer(ranges[k], "begin", rw, 0, u.numel - 1);
      range.length = r.integer(ranges[k], "length", rw, 1, u.numel - range.begin);
      f.ranges.push_back(range);
    }
    info.files.push_back(std::move(f));
  }
  check_layout(r, info);

  if (m.contains("buffers")) {
    const json& jb = r.field(m, "buffers", "");
    CheckpointFile& f = info.buffers_file;
    f.name = r.string(jb, "file", "buffers");
    if (!safe_file_name(f.name) || file_names.count(f.name) || f.name == kManifestName) {
      r.fail("buffers.file '" + f.name + "' is not a plain file name, or is another file's");
    }
    f.bytes = r.unsigned_integer(jb, "bytes", "buffers");
    const std::string crc = r.string(jb, "crc32c", "buffers");
    if (crc.size() != 8 || crc.find_first_not_of("0123456789abcdef") != std::string::npos) {
      r.fail("buffers.crc32c '" + crc + "' is not 8 lowercase hex digits");
    }
    f.crc32c = static_cast<uint32_t>(std::stoul(crc, nullptr, 16));
    const json& tensors = r.array(jb, "tensors", "buffers");
    std::set<std::string> names;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const std::string where = "buffers.tensors[" + std::to_string(i) + "]";
      CheckpointBuffer b;
      b.name = r.string(tensors[i], "name", where);
      if (b.name.empty() || !names.insert(b.name).second) r.fail(where + ".name '" + b.name + "' is empty or repeated");
      const std::string dtype = r.string(tensors[i], "dtype", where);
      const std::optional<safetensors::Dtype> t = safetensors::dtype_from_name(dtype);
      if (!t) r.fail(where + ".dtype '" + dtype + "' is not a safetensors dtype");
      b.dtype = *t;
      for (const json& d : r.array(tensors[i], "shape", where)) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0) r.fail(where + ".shape has a negative dimension");
        b.shape.push_back(d.get<int64_t>());
      }
      info.buffers.push_back(std::move(b));
    }
  }

  const json& config = r.field(m, "config", "");
  info.config_json = config.is_string() ? config.get<std::string>() : config.dump(2);
  // A save happens only at the end of an accumulation window of the run that saved.
  const json* gas = config.is_object() && config.contains("gradient_accumulation_steps")
                        ? &config["gradient_accumulation_steps"]
                        : nullptr;
  if (gas != nullptr && gas->is_number_integer() && gas->get<int64_t>() >= 1 &&
      s.micro_steps % gas->get<int64_t>() != 0) {
    r.fail("training_state.micro_steps " + std::to_string(s.micro_steps) +
           " is not a multiple of config.gradient_accumulation_steps " + std::to_string(gas->get<int64_t>()) +
           " (checkpoints are saved only at the end of an accumulation window)");
  }
  return info;
}

std::optional<int64_t> saved_gradient_accumulation_steps(const CheckpointInfo& info) {
  const json config = json::parse(info.config_json, nullptr, false);
  if (!config.is_object() || !config.contains("gradient_accumulation_steps")) return std::nullopt;
  const json& gas = config["gradient_accumulation_steps"];
  if (!gas.is_number_integer()) return std::nullopt;
  return gas.get<int64_t>();
}

CheckpointInfo read_manifest(const std::filesystem::path& checkpoint_dir) {
  const std::filesystem::path path = checkpoint_dir / kManifestName;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::error_code ec;
    if (!std::filesystem::is_directory(checkpoint_dir, ec)) {
      throw CheckpointError("no checkpoint at " + checkpoint_dir.string() + ": the directory does not exist");
    }
    throw CheckpointError(path.string() + ": missing or unreadable (an incomplete or foreign checkpoint directory)");
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw CheckpointError(path.string() + ": read error");
  return manifest_from_json(text.str(), path);
}

}  // namespace zero3::ckpt

namespace zero3 {

int64_t CheckpointInfo::parameter_count() const {
  int64_t n = 0;
  for (const CheckpointUnit& u : units) n += u.numel;
  return n;
}

uint64_t CheckpointInfo::total_bytes() const {
  uint64_t n = 0;
  for (const CheckpointFile& f : files) n += f.bytes;
  return n + buffers_file.bytes;
}

}  // namespace zero3
