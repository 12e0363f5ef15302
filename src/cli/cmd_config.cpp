// `zero3 config check FILE [flags]`: read a DeepSpeed config, resolve it with the given facts and print
// the result as JSON. `zero3 config docs`: print the config reference (docs/config.md).
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "cli/commands.hpp"
#include "zero3/config.hpp"
#include "zero3/error.hpp"

namespace zero3::cli {
namespace {

constexpr const char* kUsage =
    "usage: zero3 config check FILE [--world-size N] [--hidden-size N] [--micro-batch N] [--grad-accum N]\n"
    "                               [--precision bf16|fp16|fp32] [--lr X] [--weight-decay X] [--max-grad-norm X]\n"
    "                               [--total-steps N] [--warmup-steps N] [--save-16bit-model true|false]\n"
    "                               [--check-paths] [--max-config-bytes N]\n"
    "       zero3 config docs\n"
    "\n"
    "check: reads FILE (DeepSpeed JSON), resolves \"auto\" from the flags, runs every check and prints the\n"
    "       resolved config as JSON on stdout; warnings go to stderr. Exit 1 with a message naming the key\n"
    "       when the file cannot be used. --world-size defaults to 1. --check-paths also checks that NVMe\n"
    "       offload directories exist and are writable, as a run does when it starts. FILE may be at most\n"
    "       --max-config-bytes bytes (default 16777216, 16 MiB).\n"
    "docs:  prints the reference of every key as markdown (docs/config.md).\n";

int usage_error(const std::string& message) {
  std::fprintf(stderr, "zero3 config: %s\n\n%s", message.c_str(), kUsage);
  return 2;
}

bool parse_int(const std::string& text, int64_t& out) {
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && p == end;
}

bool parse_double(const std::string& text, double& out) {
  char* end = nullptr;
  out = std::strtod(text.c_str(), &end);
  return !text.empty() && end == text.c_str() + text.size() && std::isfinite(out);
}

int run_check(const Args& args) {
  std::string file;
  ResolveInputs in;
  bool check_paths = false;
  uint64_t max_bytes = kMaxConfigBytes;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--check-paths") {
      check_paths = true;
      continue;
    }
    if (a.rfind("--", 0) != 0) {
      if (!file.empty()) return usage_error("more than one FILE: '" + file + "' and '" + a + "'");
      file = a;
      continue;
    }
    // --flag VALUE or --flag=VALUE
    std::string flag = a, value;
    if (size_t eq = a.find('='); eq != std::string::npos) {
      flag = a.substr(0, eq);
      value = a.substr(eq + 1);
    } else {
      if (i + 1 >= args.size()) return usage_error(flag + " needs a value");
      value = args[++i];
    }
    auto want_int = [&](std::optional<int64_t>& field, int64_t min) {
      int64_t v;
      if (!parse_int(value, v) || v < min) {
        return usage_error(flag + ": got '" + value + "', expected an integer >= " + std::to_string(min));
      }
      field = v;
      return 0;
    };
    auto want_double = [&](std::optional<double>& field) {
      double v;
      if (!parse_double(value, v) || v < 0) return usage_error(flag + ": got '" + value + "', expected a number >= 0");
      field = v;
      return 0;
    };
    int rc = 0;
    if (flag == "--max-config-bytes") {
      std::optional<int64_t> cap;
      rc = want_int(cap, 1);
      if (!rc) max_bytes = static_cast<uint64_t>(*cap);
    } else if (flag == "--save-16bit-model") {
      if (value == "true" || value == "false") {
        in.save_16bit_model = value == "true";
      } else {
        rc = usage_error("--save-16bit-model: got '" + value + "', expected true or false");
      }
    } else if (flag == "--world-size") {
      rc = want_int(in.world_size, 1);
    } else if (flag == "--hidden-size") {
      rc = want_int(in.hidden_size, 1);
    } else if (flag == "--micro-batch") {
      rc = want_int(in.micro_batch, 1);
    } else if (flag == "--grad-accum") {
      rc = want_int(in.grad_accum, 1);
    } else if (flag == "--total-steps") {
      rc = want_int(in.total_steps, 1);
    } else if (flag == "--warmup-steps") {
      rc = want_int(in.warmup_steps, 1);
    } else if (flag == "--lr") {
      rc = want_double(in.lr);
    } else if (flag == "--weight-decay") {
      rc = want_double(in.weight_decay);
    } else if (flag == "--max-grad-norm") {
      rc = want_double(in.max_grad_norm);
    } else if (flag == "--precision") {
      if (value == "bf16") {
        in.precision = DType::bf16;
      } else if (value == "fp16") {
        in.precision = DType::f16;
      } else if (value == "fp32") {
        in.precision = DType::f32;
      } else {
        rc = usage_error("--precision: got '" + value + "', expected bf16, fp16 or fp32");
      }
    } else {
      rc = usage_error("unknown flag " + flag);
    }
    if (rc) return rc;
  }
  if (file.empty()) return usage_error("check needs a FILE");
  if (!in.world_size) in.world_size = 1;

  // Warnings are logged by the library (stderr) as they are found.
  Config config = load_config(file, max_bytes);
  resolve(config, in);
  if (check_paths) check_runtime_paths(config);
  std::string json = to_json(config);
  std::fwrite(json.data(), 1, json.size(), stdout);
  return 0;
}

}  // namespace

int run_config(const Args& args) {
  if (args.empty()) return usage_error("missing subcommand (check or docs)");
  const std::string& sub = args[0];
  Args rest(args.begin() + 1, args.end());
  if (sub == "check") return run_check(rest);
  if (sub == "docs") {
    if (!rest.empty()) return usage_error("docs takes no arguments");
    std::string md = config_reference_markdown();
    std::fwrite(md.data(), 1, md.size(), stdout);
    return 0;
  }
  if (sub == "--help" || sub == "-h") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  return usage_error("unknown subcommand '" + sub + "' (expected check or docs)");
}

}  // namespace zero3::cli
