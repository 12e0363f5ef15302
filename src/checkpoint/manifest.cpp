#include "checkpoint/manifest.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
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

std::string crc_hex(uint32_t crc) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%08x", crc);
  return buf;
}

std::string manifest_to_json(const CheckpointInfo& info) {
  ordered_json m = ordered_json::object();
  m["format"] = kFormatName;
  m["format_version"] = kFormatVersion;
  m["zero3_version"] = info.zero3_version;
  m["tag"] = info.tag;
  m["created"] = info.created;
  m["world_size"] = info.world_size;
  m["stage"] = info.stage;
  const TrainingState& s = info.training_state;
  m["training_state"] = {{"micro_steps", s.micro_steps},
                         {"global_steps", s.global_steps},
                         {"skipped_steps", s.skipped_steps},
                         {"applied_steps", s.applied_steps},
                         {"loss_scale", s.loss_scale},
                         {"scaler_iter", s.scaler_iter},
                         {"scaler_last_overflow_iter", s.scaler_last_overflow_iter},
                         {"scaler_hysteresis", s.scaler_hysteresis}};
  ordered_json extras = ordered_json::object();
  for (const auto& [k, v] : info.extras) extras[k] = v;
  m["extras"] = std::move(extras);
  ordered_json units = ordered_json::array();
  for (const CheckpointUnit& u : info.units) {
    ordered_json params = ordered_json::array();
    for (const CheckpointParam& p : u.params) {
      params.push_back({{"name", p.name},
                        {"shape", p.shape},
                        {"dtype", std::string(dtype_name(p.dtype))},
                        {"offset", p.offset},
                        {"numel", p.numel}});
    }
    units.push_back({{"name", u.name},
                     {"dtype", std::string(dtype_name(u.dtype))},
                     {"numel", u.numel},
                     {"slice_numel", u.slice_numel},
                     {"padded_numel", u.padded_numel},
                     {"params", std::move(params)}});
  }
  m["units"] = std::move(units);
  ordered_json files = ordered_json::array();
  for (const CheckpointFile& f : info.files) {
    ordered_json ranges = ordered_json::array();
    for (const CheckpointRange& r : f.ranges) {
      ranges.push_back(
          {{"unit", info.units.at(static_cast<size_t>(r.unit)).name}, {"begin", r.begin}, {"length", r.length}});
    }
    files.push_back({{"name", f.name},
                     {"rank", f.rank},
                     {"bytes", f.bytes},
                     {"crc32c", crc_hex(f.crc32c)},
                     {"ranges", std::move(ranges)}});
  }
  m["files"] = std::move(files);
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
  if (info.format_version > kFormatVersion) {
    r.fail("format_version " + std::to_string(info.format_version) + " is newer than this build reads (" +
           std::to_string(kFormatVersion) + "); use a newer zero3");
  }
  info.zero3_version = r.string(m, "zero3_version", "");
  info.tag = r.string(m, "tag", "");
  info.created = r.string(m, "created", "");
  info.world_size = static_cast<int>(r.integer(m, "world_size", "", 1, 1 << 24));
  info.stage = static_cast<int>(r.integer(m, "stage", "", 0, 3));

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
  if (s.applied_steps + s.skipped_steps != s.global_steps) {
    r.fail("training_state: applied_steps (" + std::to_string(s.applied_steps) + ") + skipped_steps (" +
           std::to_string(s.skipped_steps) + ") != global_steps (" + std::to_string(s.global_steps) + ")");
  }

  const json& extras = r.field(m, "extras", "");
  if (!extras.is_object()) r.fail("extras is not a JSON object");
  for (const auto& [k, v] : extras.items()) {
    if (!v.is_string()) r.fail("extras." + k + " is not a string");
    info.extras[k] = v.get<std::string>();
  }

  const json& units = r.array(m, "units", "");
  std::unordered_map<std::string, int> unit_index;
  for (size_t i = 0; i < units.size(); ++i) {
    const std::string where = "units[" + std::to_string(i) + "]";
    const json& ju = units[i];
    CheckpointUnit u;
    u.name = r.string(ju, "name", where);
    if (u.name.empty()) r.fail(where + ".name is empty");
    if (!unit_index.emplace(u.name, static_cast<int>(i)).second) r.fail("unit '" + u.name + "' appears twice");
    u.dtype = r.dtype(ju, "dtype", where);
    u.numel = r.integer(ju, "numel", where, 1, INT64_MAX);
    u.slice_numel = r.integer(ju, "slice_numel", where, 1, INT64_MAX);
    u.padded_numel = r.integer(ju, "padded_numel", where, 1, INT64_MAX);
    if (u.padded_numel < u.numel || u.padded_numel % u.slice_numel != 0) {
      r.fail(where + " ('" + u.name + "'): padded_numel " + std::to_string(u.padded_numel) +
             " is not a multiple of slice_numel " + std::to_string(u.slice_numel) + " covering numel " +
             std::to_string(u.numel));
    }
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
    info.units.push_back(std::move(u));
  }

  const json& files = r.array(m, "files", "");
  std::set<std::string> file_names;
  // Per unit, the ranges of all files, to check that they tile [0, numel).
  std::vector<std::vector<std::pair<int64_t, int64_t>>> cover(info.units.size());
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string where = "files[" + std::to_string(i) + "]";
    const json& jf = files[i];
    CheckpointFile f;
    f.name = r.string(jf, "name", where);
    if (!safe_file_name(f.name)) r.fail(where + ".name '" + f.name + "' is not a plain file name");
    if (f.name == kManifestName || !file_names.insert(f.name).second) {
      r.fail(where + ".name '" + f.name + "' is repeated or reserved");
    }
    f.rank = static_cast<int>(r.integer(jf, "rank", where, 0, info.world_size - 1));
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
      cover[static_cast<size_t>(range.unit)].emplace_back(range.begin, range.length);
      f.ranges.push_back(range);
    }
    info.files.push_back(std::move(f));
  }
  for (size_t u = 0; u < info.units.size(); ++u) {
    auto& c = cover[u];
    std::sort(c.begin(), c.end());
    int64_t next = 0;
    for (const auto& [begin, length] : c) {
      if (begin != next) {
        r.fail("the files' ranges of unit '" + info.units[u].name + "' " + (begin < next ? "overlap" : "leave a gap") +
               " at element " + std::to_string(std::min(begin, next)));
      }
      next = begin + length;
    }
    if (next != info.units[u].numel) {
      r.fail("the files' ranges of unit '" + info.units[u].name + "' end at element " + std::to_string(next) +
             ", not at its numel " + std::to_string(info.units[u].numel));
    }
  }

  const json& config = r.field(m, "config", "");
  info.config_json = config.is_string() ? config.get<std::string>() : config.dump(2);
  return info;
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
  return n;
}

}  // namespace zero3
