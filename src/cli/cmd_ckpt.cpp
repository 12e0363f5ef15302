// `zero3 ckpt`: look into checkpoints and export them. inspect prints what a checkpoint holds and verifies every
// file; consolidate writes Hugging Face safetensors one unit at a time; list shows the checkpoints of a
// directory.
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "checkpoint/export_names.hpp"
#include "checkpoint/manifest.hpp"
#include "cli/commands.hpp"
#include "zero3/checkpoint.hpp"
#include "zero3/error.hpp"
#include "zero3/safetensors.hpp"

namespace zero3::cli {
namespace {

namespace fs = std::filesystem;

constexpr const char* kUsage =
    "usage: zero3 ckpt inspect CKPT [--tag T] [--no-verify]\n"
    "       zero3 ckpt consolidate CKPT OUT_DIR [--tag T] [--dtype auto|bf16|fp16|fp32] [--max-shard-size 5GB]\n"
    "                              [--names auto|full|local] [--name-map MAP.json] [--no-verify]\n"
    "       zero3 ckpt list DIR\n"
    "\n"
    "CKPT is a checkpoint directory DIR (its checkpoint DIR/latest names, or --tag T) or one checkpoint DIR/TAG.\n"
    "\n"
    "inspect:     prints the tag, world size, stage, steps, extras, units, parameters and files, and checks\n"
    "             every file's size and CRC-32C (exit 1 when one is bad; --no-verify skips reading them).\n"
    "consolidate: writes the fp32 master weights as Hugging Face safetensors into OUT_DIR, one unit in memory\n"
    "             at a time, split into files of at most --max-shard-size (\"5GB\", \"500MB\", \"2GiB\"; default\n"
    "             5GB) with model.safetensors.index.json when there are several. --dtype auto writes each\n"
    "             parameter in the run's compute dtype. Tensor names: --names auto uses the parameters' names\n"
    "             within their units when those are unique over the model (the Llama example's are Hugging\n"
    "             Face's), else \"<unit>.<param>\"; --name-map takes a JSON object {\"<unit>.<param>\": \"name\"}\n"
    "             for the parameters it lists. The files are verified first unless --no-verify.\n"
    "list:        the complete checkpoints in DIR, the one DIR/latest names marked with '*'.\n";

int usage_error(const std::string& message) {
  std::fprintf(stderr, "zero3 ckpt: %s\n\n%s", message.c_str(), kUsage);
  return 2;
}

std::string human_bytes(uint64_t n) {
  char buf[64];
  if (n >= 1'000'000'000)
    std::snprintf(buf, sizeof(buf), "%.2f GB", static_cast<double>(n) / 1e9);
  else if (n >= 1'000'000)
    std::snprintf(buf, sizeof(buf), "%.2f MB", static_cast<double>(n) / 1e6);
  else if (n >= 1'000)
    std::snprintf(buf, sizeof(buf), "%.1f kB", static_cast<double>(n) / 1e3);
  else
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(n));
  return buf;
}

// CKPT as (DIR, TAG): a directory holding manifest.json is one checkpoint, unless a tag is given.
std::pair<fs::path, std::string> locate(const std::string& arg, const std::string& tag) {
  fs::path p = fs::path(arg).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  std::error_code ec;
  if (tag.empty() && fs::is_regular_file(p / ckpt::kManifestName, ec)) {
    fs::path parent = p.parent_path();
    return {parent.empty() ? fs::path(".") : parent, p.filename().string()};
  }
  return {p, tag.empty() ? std::string("latest") : tag};
}

struct Options {
  std::vector<std::string> positional;
  std::string tag;
  bool verify = true;
  std::string dtype = "auto";
  std::string max_shard = "5GB";
  std::string names = "auto";
  std::string name_map;
};

// Parses flags shared by the subcommands; returns an error text or "".
std::string parse(const Args& args, Options& o) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](std::string& out) -> bool {
      if (i + 1 >= args.size()) return false;
      out = args[++i];
      return true;
    };
    if (a == "--no-verify") {
      o.verify = false;
    } else if (a == "--tag" || a == "--dtype" || a == "--max-shard-size" || a == "--names" || a == "--name-map") {
      std::string& target = a == "--tag"              ? o.tag
                            : a == "--dtype"          ? o.dtype
                            : a == "--max-shard-size" ? o.max_shard
                            : a == "--names"          ? o.names
                                                      : o.name_map;
      if (!value(target)) return a + " needs a value";
    } else if (a.rfind("--", 0) == 0) {
      return "unknown option '" + a + "'";
    } else {
      o.positional.push_back(a);
    }
  }
  return "";
}

std::string shape_text(const std::vector<int64_t>& s) { return safetensors::shape_string(s); }

int run_inspect(const Args& args) {
  Options o;
  if (std::string err = parse(args, o); !err.empty()) return usage_error(err);
  if (o.positional.size() != 1) return usage_error("inspect takes one CKPT");
  const auto [dir, tag] = locate(o.positional[0], o.tag);
  const CheckpointInfo info = read_checkpoint_info(dir, tag);
  std::string latest;
  try {
    latest = resolve_checkpoint_tag(dir, "latest");
  } catch (const Error&) {
    latest = "(none)";
  }
  const TrainingState& s = info.training_state;
  int64_t tensors = 0;
  for (const CheckpointUnit& u : info.units) tensors += static_cast<int64_t>(u.params.size());
  std::printf("checkpoint   %s\n", info.path.string().c_str());
  std::printf("tag          %s%s\n", info.tag.c_str(),
              latest == info.tag ? " (DIR/latest names it)" : (" (DIR/latest names " + latest + ")").c_str());
  std::printf("format       %s %d, saved by zero3 %s at %s\n", ckpt::kFormatName, info.format_version,
              info.zero3_version.c_str(), info.created.c_str());
  std::printf("world size   %d, ZeRO stage %d\n", info.world_size, info.stage);
  if (info.pipeline_stages > 1) {
    std::printf("pipeline     %d stages x %d data-parallel ranks\n", info.pipeline_stages, info.data_parallel_size());
  }
  std::printf("steps        global %" PRId64 " (applied %" PRId64 ", skipped %" PRId64 "), micro %" PRId64
              ", loss scale %g\n",
              s.global_steps, s.applied_steps, s.skipped_steps, s.micro_steps, s.loss_scale);
  std::printf("parameters   %" PRId64 " in %zu units, %" PRId64 " tensors\n", info.parameter_count(), info.units.size(),
              tensors);
  if (info.extras.empty()) {
    std::printf("extras       (none)\n");
  } else {
    for (const auto& [k, v] : info.extras) std::printf("extra        %s = %s\n", k.c_str(), v.c_str());
  }
  std::printf("\nunits:\n");
  for (const CheckpointUnit& u : info.units) {
    const std::string stage = info.pipeline_stages > 1 ? " (stage " + std::to_string(u.pipeline_stage) + ")" : "";
    std::printf("  %-24s %-4s %12" PRId64 " elements, %" PRId64 " per rank%s\n", u.name.c_str(),
                std::string(dtype_name(u.dtype)).c_str(), u.numel, u.slice_numel, stage.c_str());
    for (const CheckpointParam& p : u.params) {
      std::printf("    %-40s %s\n", p.name.c_str(), shape_text(p.shape).c_str());
    }
  }
  std::printf("\nfiles (%zu, %s):\n", info.files.size(), human_bytes(info.total_bytes()).c_str());
  std::vector<FileCheck> checks;
  if (o.verify) checks = verify_checkpoint_files(info);
  int bad = 0;
  for (size_t i = 0; i < info.files.size(); ++i) {
    const CheckpointFile& f = info.files[i];
    std::string state = "not verified";
    if (o.verify) {
      state = checks[i].ok ? "ok" : "BAD: " + checks[i].problem;
      bad += checks[i].ok ? 0 : 1;
    }
    std::printf("  %-36s %10s  crc32c %s  %s\n", f.name.c_str(), human_bytes(f.bytes).c_str(),
                ckpt::crc_hex(f.crc32c).c_str(), state.c_str());
  }
  if (!o.verify) return 0;
  if (bad > 0) {
    std::printf("\n%d of %zu files are bad: this checkpoint cannot be loaded\n", bad, info.files.size());
    return 1;
  }
  std::printf("\nverified: every file has its recorded size and CRC-32C\n");
  return 0;
}

int run_consolidate(const Args& args) {
  Options o;
  if (std::string err = parse(args, o); !err.empty()) return usage_error(err);
  if (o.positional.size() != 2) return usage_error("consolidate takes CKPT and OUT_DIR");
  ExportOptions options;
  options.verify = o.verify;
  if (o.dtype != "auto") {
    const std::optional<DType> t = o.dtype == "fp32"   ? DType::f32
                                   : o.dtype == "fp16" ? DType::f16
                                                       : parse_dtype(o.dtype);
    if (!t) return usage_error("--dtype '" + o.dtype + "': expected auto, bf16, fp16 or fp32");
    options.dtype = *t;
  }
  try {
    options.max_shard_bytes = safetensors::parse_size(o.max_shard);
  } catch (const InvalidArgument& e) {
    return usage_error(std::string("--max-shard-size: ") + e.what());
  }
  const std::optional<TensorNaming> naming = ckpt::parse_tensor_naming(o.names);
  if (!naming) return usage_error("--names '" + o.names + "': expected auto, full or local");
  options.naming = *naming;
  if (!o.name_map.empty()) {
    std::ifstream in(o.name_map);
    if (!in) throw IoError("cannot read the name map " + o.name_map);
    std::stringstream text;
    text << in.rdbuf();
    const nlohmann::json m = nlohmann::json::parse(text.str(), nullptr, false);
    if (m.is_discarded() || !m.is_object()) {
      throw InvalidArgument(o.name_map + ": a name map is a JSON object {\"<unit>.<param>\": \"output name\"}");
    }
    for (const auto& [k, v] : m.items()) {
      if (!v.is_string()) throw InvalidArgument(o.name_map + ": the value of '" + k + "' is not a string");
      options.name_map[k] = v.get<std::string>();
    }
  }
  const auto [dir, tag] = locate(o.positional[0], o.tag);
  const ExportedModel m = consolidate_checkpoint(dir, tag, o.positional[1], options);
  std::printf("%s\n", m.summary().c_str());
  return 0;
}

int run_list(const Args& args) {
  Options o;
  if (std::string err = parse(args, o); !err.empty()) return usage_error(err);
  if (o.positional.size() != 1) return usage_error("list takes one DIR");
  const fs::path dir = o.positional[0];
  std::string latest;
  try {
    latest = resolve_checkpoint_tag(dir, "latest");
  } catch (const Error&) {
  }
  const std::vector<std::string> tags = list_checkpoints(dir);
  if (tags.empty()) {
    std::printf("no complete checkpoint in %s\n", dir.string().c_str());
    return 0;
  }
  for (const std::string& t : tags) {
    try {
      const CheckpointInfo info = read_checkpoint_info(dir, t);
      const std::string pipeline =
          info.pipeline_stages > 1 ? " (" + std::to_string(info.pipeline_stages) + " pipeline stages)" : "";
      std::printf("%c %-32s global step %-8" PRId64 " %d ranks%s, stage %d, %s, %s\n", t == latest ? '*' : ' ',
                  t.c_str(), info.training_state.global_steps, info.world_size, pipeline.c_str(), info.stage,
                  human_bytes(info.total_bytes()).c_str(), info.created.c_str());
    } catch (const Error& e) {
      std::printf("%c %-32s unreadable manifest: %s\n", t == latest ? '*' : ' ', t.c_str(), e.what());
    }
  }
  return 0;
}

}  // namespace

int run_ckpt(const Args& args) {
  if (args.empty()) return usage_error("missing subcommand (inspect, consolidate or list)");
  const std::string& sub = args[0];
  const Args rest(args.begin() + 1, args.end());
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  if (sub == "inspect") return run_inspect(rest);
  if (sub == "consolidate") return run_consolidate(rest);
  if (sub == "list") return run_list(rest);
  return usage_error("unknown subcommand '" + sub + "' (expected inspect, consolidate or list)");
}

}  // namespace zero3::cli
