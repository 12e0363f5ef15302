// load_checkpoint and the engine-free readers. A load verifies everything it will read before it writes any
// engine state, then fills each rank's slices from the saved files' byte ranges (any saved world size).
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstring>
#include <map>
#include <set>

#include "checkpoint/checkpoint_dir.hpp"
#include "checkpoint/checkpoint_ranks.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/model_buffers.hpp"
#include "checkpoint/rank_reports.hpp"
#include "checkpoint/reshard.hpp"
#include "checkpoint/shard_check.hpp"
#include "core/check.hpp"
#include "zero3/checkpoint.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"
#include "zero3/safetensors.hpp"

namespace zero3 {
namespace {

namespace fs = std::filesystem;
namespace st = safetensors;
using Clock = std::chrono::steady_clock;
using ckpt::RankReport;
using ckpt::StatePart;

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string tags_present(const fs::path& dir) {
  std::vector<std::string> tags = list_checkpoints(dir);
  if (tags.empty()) return "no complete checkpoint is there";
  std::string s = "complete checkpoints there: ";
  for (size_t i = 0; i < tags.size(); ++i) s += (i ? ", " : "") + tags[i];
  return s;
}

fs::path locate_or_throw(const fs::path& dir, const std::string& tag) {
  std::optional<fs::path> where = ckpt::locate_checkpoint(dir, tag);
  if (!where) {
    std::error_code ec;
    const fs::path p = dir / tag;
    if (fs::is_directory(p, ec)) {
      throw CheckpointError("checkpoint " + p.string() + " has no " + ckpt::kManifestName +
                            " (a save of it did not complete, or it is not a zero3 checkpoint); " + tags_present(dir));
    }
    throw CheckpointError("no checkpoint '" + tag + "' in " + dir.string() + "; " + tags_present(dir));
  }
  return *where;
}

std::string shape_text(const std::vector<int64_t>& shape) { return st::shape_string(shape); }

// "a, b, c, ... (N in all)": a few of the names, for messages.
std::string some_names(const std::vector<std::string>& names) {
  constexpr size_t kShown = 8;
  std::string s;
  for (size_t i = 0; i < std::min(names.size(), kShown); ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > kShown) s += ", ... (" + std::to_string(names.size()) + " in all)";
  return s;
}

// The first difference between the engine's parameters of unit `eu` and the checkpoint's unit `cu`, or "".
std::string unit_difference(const CheckpointUnit& cu, const UnitInfo& eu, const Engine& engine) {
  const size_t m = std::min(cu.params.size(), eu.params.size());
  for (size_t j = 0; j < m; ++j) {
    const CheckpointParam& cp = cu.params[j];
    const ParamInfo& ep = engine.param(eu.params[j]);
    const std::string pat = "unit '" + cu.name + "', parameter " + std::to_string(j);
    if (cp.name != ep.local_name) {
      return pat + " is '" + cp.name + "' in the checkpoint, '" + ep.local_name + "' in the engine";
    }
    if (cp.shape != ep.shape) {
      return "parameter '" + cp.full_name + "' has shape " + shape_text(cp.shape) + " in the checkpoint, " +
             shape_text(ep.shape) + " in the engine";
    }
    if (cp.dtype != ep.dtype) {
      return "parameter '" + cp.full_name + "' has dtype " + std::string(dtype_name(cp.dtype)) +
             " in the checkpoint, " + std::string(dtype_name(ep.dtype)) + " in the engine";
    }
  }
  if (cu.params.size() != eu.params.size()) {
    const bool more = cu.params.size() > eu.params.size();
    const std::string extra = more ? cu.params[m].name : engine.param(eu.params[m]).local_name;
    return "unit '" + cu.name + "' has " + std::to_string(cu.params.size()) + " parameters in the checkpoint, " +
           std::to_string(eu.params.size()) + " in the engine (first extra: '" + extra + "' in the " +
           (more ? "checkpoint" : "engine") + ")";
  }
  return "";
}

// Finds each of the engine's units in the checkpoint by name (`index`: the checkpoint's unit of each engine unit)
// and returns the first difference, or "". `whole`: the engine must hold every unit of the checkpoint (one Engine);
// else it may hold a part (a pipeline stage's engine).
std::string model_difference(const CheckpointInfo& info, const Engine& engine, bool whole, std::vector<int>& index) {
  std::map<std::string, int> by_name;
  for (size_t i = 0; i < info.units.size(); ++i) by_name.emplace(info.units[i].name, static_cast<int>(i));
  auto count_difference = [&](const std::string& extra, bool in_checkpoint) {
    return "the checkpoint has " + std::to_string(info.units.size()) + " units, the engine " +
           std::to_string(engine.num_units()) + " (first extra: '" + extra + "' in the " +
           (in_checkpoint ? "checkpoint" : "engine") + ")";
  };
  index.assign(engine.num_units(), -1);
  std::vector<bool> used(info.units.size(), false);
  for (size_t i = 0; i < engine.num_units(); ++i) {
    const UnitInfo& eu = engine.unit(UnitId{static_cast<int32_t>(i)});
    const auto it = by_name.find(eu.name);
    if (it == by_name.end()) {
      if (whole && info.units.size() != engine.num_units()) return count_difference(eu.name, false);
      std::vector<std::string> names;
      for (const CheckpointUnit& u : info.units) names.push_back(u.name);
      return "the engine's unit '" + eu.name + "' is not in the checkpoint (its units: " + some_names(names) + ")";
    }
    const std::string diff = unit_difference(info.units[static_cast<size_t>(it->second)], eu, engine);
    if (!diff.empty()) return diff;
    index[i] = it->second;
    used[static_cast<size_t>(it->second)] = true;
  }
  if (whole) {
    for (size_t c = 0; c < info.units.size(); ++c) {
      if (!used[c]) return count_difference(info.units[c].name, true);
    }
  }
  return "";
}

// A pipelined load: the checkpoint's units that no stage's engine holds (`stage_units`: every rank's unit names,
// one per line, from each stage's first data-parallel rank), or "".
std::string units_of_no_stage(const CheckpointInfo& info, const std::vector<std::string>& stage_units) {
  std::set<std::string> held;
  for (const std::string& text : stage_units) {
    size_t from = 0;
    for (size_t nl; (nl = text.find('\n', from)) != std::string::npos; from = nl + 1)
      held.insert(text.substr(from, nl - from));
  }
  std::vector<std::string> missing;
  for (const CheckpointUnit& u : info.units) {
    if (!held.count(u.name)) missing.push_back(u.name);
  }
  if (missing.empty()) return "";
  return "the checkpoint's unit(s) " + some_names(missing) +
         " are in no pipeline stage's engine (the stages' units together must be the checkpoint's)";
}

struct UnitPlan {
  UnitId id;
  int saved = 0;  // the checkpoint's unit
  ShardView view;
  std::vector<ckpt::RangeRead> reads;
  int64_t filled = 0;  // elements of the view the reads fill; the rest is padding
};

}  // namespace

int64_t LoadedCheckpoint::extra_int(const std::string& key) const {
  const std::string where = (path / ckpt::kManifestName).string() + ": extras." + key;
  const auto it = extras.find(key);
  if (it == extras.end()) throw CheckpointError(where + " is missing (the program that saved it did not write it)");
  const std::string& text = it->second;
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    throw CheckpointError(where + " is '" + text + "', expected a decimal integer" +
                          (ec == std::errc::result_out_of_range ? " that fits 64 bits" : ""));
  }
  return value;
}

std::string resolve_checkpoint_tag(const fs::path& dir, const std::string& tag) {
  if (tag == ckpt::kLatestName) return ckpt::read_latest(dir);
  ckpt::validate_tag(tag);
  return tag;
}

bool checkpoint_exists(const fs::path& dir) {
  try {
    return ckpt::locate_checkpoint(dir, ckpt::read_latest(dir)).has_value();
  } catch (const Error&) {
    return false;
  }
}

std::vector<std::string> list_checkpoints(const fs::path& dir) {
  std::vector<std::string> tags;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code e2;
    if (name.empty() || name[0] == '.' || !fs::is_directory(it->path(), e2)) continue;
    if (fs::is_regular_file(it->path() / ckpt::kManifestName, e2)) tags.push_back(name);
  }
  std::sort(tags.begin(), tags.end());
  return tags;
}

CheckpointInfo read_checkpoint_info(const fs::path& dir, const std::string& tag) {
  const std::string resolved = resolve_checkpoint_tag(dir, tag);
  CheckpointInfo info = ckpt::read_manifest(locate_or_throw(dir, resolved));
  if (info.tag != resolved) {
    log::warn("checkpoint directory '", resolved, "' holds a manifest saved under tag '", info.tag,
              "' (renamed by hand?); using it");
  }
  return info;
}

std::vector<FileCheck> verify_checkpoint_files(const CheckpointInfo& info) {
  std::vector<FileCheck> out;
  for (size_t f = 0; f < info.files.size(); ++f) {
    FileCheck c;
    c.file = info.files[f].name;
    c.problem = ckpt::check_shard_file(info, f);
    c.ok = c.problem.empty();
    out.push_back(std::move(c));
  }
  if (!info.buffers_file.name.empty()) {
    FileCheck c;
    c.file = info.buffers_file.name;
    c.problem = ckpt::check_buffers_file(info);
    c.ok = c.problem.empty();
    out.push_back(std::move(c));
  }
  return out;
}

CheckpointInfo verify_checkpoint(const fs::path& dir, const std::string& tag) {
  CheckpointInfo info = read_checkpoint_info(dir, tag);
  for (const FileCheck& c : verify_checkpoint_files(info)) {
    if (!c.ok) throw CheckpointError((info.path / c.file).string() + ": " + c.problem);
  }
  return info;
}

LoadedCheckpoint load_checkpoint(Engine& engine, const fs::path& dir, const std::string& tag) {
  return ckpt::load_checkpoint_on(ckpt::engine_ranks(engine), dir, tag);
}

LoadedCheckpoint ckpt::load_checkpoint_on(const CheckpointRanks& ranks, const fs::path& dir,
                                          const std::string& tag_arg) {
  const auto t0 = Clock::now();
  Engine& engine = ranks.engine;
  ZERO3_REQUIRE(engine.materialized(), InvalidArgument,
                "load_checkpoint: materialize() the engine first (the checkpoint fills its slices)");
  const int rank = engine.rank();
  const std::string what = "load of checkpoint '" + tag_arg + "' from " + dir.string();
  auto exchange = [&](const RankReport& report, const std::string& phase) {
    return exchange_reports(ranks.comm, engine.device(), report, phase);
  };

  // 1. Verify: manifest, model, and every file this rank reads. Nothing in the engine changes.
  LoadedCheckpoint result;
  CheckpointInfo info;
  std::map<int, std::optional<st::SafetensorsReader>> readers;
  std::vector<UnitPlan> plans;
  RankReport mine;
  try {
    result.tag = resolve_checkpoint_tag(dir, tag_arg);
    info = ckpt::read_manifest(locate_or_throw(dir, result.tag));
    result.path = info.path;
    std::vector<int> saved_unit;
    std::string diff = model_difference(info, engine, !ranks.pipelined(), saved_unit);
    if (diff.empty()) diff = ckpt::buffers_difference(info, engine.buffers());
    if (!diff.empty()) {
      throw CheckpointError("checkpoint " + info.path.string() + " does not match the engine's model: " + diff);
    }
    const std::string buffers_problem = ckpt::check_buffers_file(info);
    if (!buffers_problem.empty()) {
      throw CheckpointError((info.path / info.buffers_file.name).string() + ": " + buffers_problem);
    }
    result.bytes_read += info.buffers_file.bytes;
    for (size_t i = 0; i < engine.num_units(); ++i) {
      UnitPlan p;
      p.id = UnitId{static_cast<int32_t>(i)};
      p.saved = saved_unit[i];
      p.view = engine.local_shard(p.id);
      p.reads = ckpt::plan_reads(info, p.saved, p.view.begin, p.view.length);
      p.filled = std::clamp<int64_t>(engine.unit(p.id).numel - p.view.begin, 0, p.view.length);
      for (const ckpt::RangeRead& r : p.reads) readers[r.file];
      plans.push_back(std::move(p));
    }
    for (auto& [f, reader] : readers) {
      const std::string problem = ckpt::check_shard_file(info, static_cast<size_t>(f), &reader);
      if (!problem.empty()) {
        std::string hint;
        if (problem.rfind("missing", 0) == 0 && engine.config().checkpoint.use_node_local_storage) {
          hint =
              " (checkpoint.use_node_local_storage: each node holds only the files of its own ranks, so a rank "
              "can load only slices saved on its node; load with the same ranks on every node, or copy every "
              "node's files into each node's checkpoint directory)";
        }
        throw CheckpointError((info.path / info.files[static_cast<size_t>(f)].name).string() + ": " + problem + hint);
      }
      result.bytes_read += info.files[static_cast<size_t>(f)].bytes;
    }
    // The manifest text (tag, creation time, layout, checksums): equal on every rank that found the same checkpoint,
    // whatever path it reached it by.
    mine.a = fnv1a(ckpt::manifest_to_json(info));
  } catch (const std::exception& e) {
    mine.ok = false;
    mine.message = e.what();
  }
  std::vector<RankReport> reports = exchange(mine, what + " (verifying)");
  ckpt::throw_if_any_failed(reports, what);
  for (const RankReport& r : reports) {
    if (r.a != reports[0].a) {
      throw CheckpointError(what +
                            ": the ranks found different checkpoints (was DIR/latest rewritten while "
                            "loading, or do the ranks see different directories?)");
    }
  }
  if (ranks.pipelined()) {
    // Every unit of the checkpoint must be some stage's: the same decision on every rank (the same manifest and
    // the same names).
    std::string names;
    if (engine.rank() == 0) {
      for (size_t i = 0; i < engine.num_units(); ++i) names += engine.unit(UnitId{static_cast<int32_t>(i)}).name + "\n";
    }
    const std::string missing = units_of_no_stage(
        info, exchange_texts(ranks.comm, engine.device(), names, what + " (matching the stages' units)"));
    if (!missing.empty())
      throw CheckpointError(what + ": checkpoint " + info.path.string() +
                            " does not match the pipeline's model: " + missing);
  }

  // 2. Fill every slice. From here on a failure leaves the engine's state partly overwritten.
  mine = RankReport{};
  try {
    Device& device = engine.device();
    const bool host = device.type() == DeviceType::cpu;
    std::vector<float> staging;
    for (const UnitPlan& p : plans) {
      const std::string& unit = engine.unit(p.id).name;
      for (StatePart part : ckpt::kStateParts) {
        float* dst = ckpt::state_part_data(p.view, part);
        if (dst == nullptr) {
          throw CheckpointError("unit '" + unit + "' has no " + ckpt::state_part_name(part) + " on rank " +
                                std::to_string(rank));
        }
        const std::string name = ckpt::shard_tensor_name(unit, part);
        for (const ckpt::RangeRead& r : p.reads) {
          const st::SafetensorsReader& reader = *readers.at(r.file);
          if (host) {
            reader.read_range(name, r.src_offset, r.src_offset + r.count, dst + r.dst_offset);
          } else {
            constexpr int64_t kChunk = int64_t{16} << 20;  // elements
            for (int64_t off = 0; off < r.count; off += kChunk) {
              const int64_t n = std::min(kChunk, r.count - off);
              staging.resize(static_cast<size_t>(n));
              reader.read_range(name, r.src_offset + off, r.src_offset + off + n, staging.data());
              device.copy(dst + r.dst_offset + off, staging.data(), static_cast<size_t>(n) * sizeof(float));
            }
          }
          result.bytes_read += static_cast<uint64_t>(r.count) * sizeof(float);
        }
        if (p.filled < p.view.length) {
          const auto rest = static_cast<size_t>(p.view.length - p.filled);
          if (host) {
            device.fill_zero(dst + p.filled, rest * sizeof(float));
          } else {
            // With optimizer offload on a GPU the state is in host memory: copy() reaches both, fill_zero does not.
            staging.assign(rest, 0.0f);
            device.copy(dst + p.filled, staging.data(), rest * sizeof(float));
          }
        }
      }
      // zero_optimization.load_from_fp32_weights = false: the master weights start from the 16-bit weights, as
      // DeepSpeed's do then (the checkpoint's fp32 copy rounded to the unit's compute dtype).
      const DType ct = engine.unit(p.id).dtype;
      if (!engine.config().zero.load_from_fp32_weights && ct != DType::f32 && p.filled > 0) {
        staging.resize(static_cast<size_t>(p.filled));
        device.copy(staging.data(), p.view.master, staging.size() * sizeof(float));
        for (float& x : staging) x = ct == DType::bf16 ? bf16_to_f32(f32_to_bf16(x)) : f16_to_f32(f32_to_f16(x));
        device.copy(p.view.master, staging.data(), staging.size() * sizeof(float));
      }
    }
    ckpt::read_buffers(info, engine.buffers());
  } catch (const std::exception& e) {
    mine.ok = false;
    mine.message = e.what();
  }
  reports = exchange(mine, what + " (filling the slices)");
  ckpt::throw_if_any_failed(reports, what +
                                         " while filling the slices, after every file had verified (the "
                                         "engine's weights and optimizer state are now partly overwritten: load "
                                         "again or rebuild the engine)");

  // 3. Counters, loss scaler, and the compute-dtype parameters.
  const TrainingState state = ckpt::engine_training_state(info, engine);
  engine.restore_training_state(state);
  engine.refresh_params();

  result.saved_world_size = info.world_size;
  result.saved_stage = info.stage;
  result.saved_pipeline_stages = info.pipeline_stages;
  result.training_state = engine.training_state();
  result.extras = info.extras;
  // Stages 1-3 partition alike; stage 0 holds whole units on every rank; MiCS partitions over a shard group.
  result.resharded = info.data_parallel_size() != engine.world_size() || ((info.stage == 0) != (engine.stage() == 0));
  for (const UnitPlan& p : plans) {
    result.resharded |= info.units[static_cast<size_t>(p.saved)].slice_numel != engine.unit(p.id).slice_numel;
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::string saved_by = info.pipeline_stages > 1 ? std::to_string(info.pipeline_stages) + " pipeline stages x " +
                                                              std::to_string(info.data_parallel_size()) + " ranks"
                                                        : std::to_string(info.world_size) + " ranks";
  const std::string loaded_by = ranks.pipelined() ? std::to_string(ranks.pipeline_stages) + " pipeline stages x " +
                                                        std::to_string(engine.world_size()) + " ranks"
                                                  : std::to_string(engine.world_size()) + " ranks";
  log::info_rank0("loaded checkpoint ", result.path.string(), " (global step ", state.global_steps, ", saved by ",
                  saved_by, " at stage ", info.stage, ", loaded by ", loaded_by, " at stage ", engine.stage(),
                  result.resharded ? ", resharded" : "", ") in ", result.seconds, " s");
  return result;
}

}  // namespace zero3
