// Writing a model as size-limited shards plus model.safetensors.index.json, the layout of Hugging Face's
// save_pretrained, planned up front from the declared sizes so that every shard's name is final when it is
// written.
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "io/atomic_file.hpp"
#include "io/safetensors_detail.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"
#include "zero3/safetensors.hpp"

namespace zero3::safetensors {

using detail::printable;
namespace fs = std::filesystem;

namespace {

std::string shard_name(const std::string& prefix, size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.safetensors", i + 1, n);
  return prefix + buf;
}

// "<prefix>-<digits>-of-<digits>.safetensors": a shard of some save with this prefix.
bool is_shard_file(const std::string& name, const std::string& prefix) {
  const std::string head = prefix + "-", tail = ".safetensors";
  if (name.size() <= head.size() + tail.size() || name.compare(0, head.size(), head) != 0 ||
      name.compare(name.size() - tail.size(), tail.size(), tail) != 0) {
    return false;
  }
  const std::string mid = name.substr(head.size(), name.size() - head.size() - tail.size());
  const size_t of = mid.find("-of-");
  if (of == std::string::npos || of == 0 || of + 4 == mid.size()) return false;
  for (size_t i = 0; i < mid.size(); ++i) {
    if (i >= of && i < of + 4) continue;
    if (!std::isdigit(static_cast<unsigned char>(mid[i]))) return false;
  }
  return true;
}

}  // namespace

std::vector<ShardPlan> plan_shards(const std::vector<TensorDecl>& tensors, uint64_t max_shard_bytes,
                                   const std::string& prefix) {
  if (max_shard_bytes == 0) throw InvalidArgument("max shard size must be positive, got 0");
  if (prefix.empty() || prefix.find('/') != std::string::npos) {
    throw InvalidArgument("shard file prefix " + printable(prefix) + " must be a non-empty file name");
  }
  std::vector<ShardPlan> plan(1);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t bytes = tensor_bytes(tensors[i]);
    ShardPlan& cur = plan.back();
    // A tensor that would overflow a non-empty shard starts the next one; one larger than the limit stands
    // alone (it cannot be split).
    if (!cur.tensors.empty() && cur.data_bytes + bytes > max_shard_bytes) plan.emplace_back();
    plan.back().tensors.push_back(i);
    plan.back().data_bytes += bytes;
  }
  if (plan.size() == 1) {
    plan[0].file_name = prefix + ".safetensors";
  } else {
    for (size_t i = 0; i < plan.size(); ++i) plan[i].file_name = shard_name(prefix, i, plan.size());
  }
  return plan;
}

uint64_t parse_size(std::string_view text) {
  const std::string shown = printable(text);
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  double number = 0;
  const char* first = text.data();
  auto [end, ec] = std::from_chars(first, first + i, number);
  if (i == 0 || ec != std::errc() || end != first + i || !std::isfinite(number)) {
    throw InvalidArgument("size " + shown + " does not start with a number (expected e.g. 5GB, 500MB, 2GiB)");
  }
  std::string unit;
  for (size_t k = i; k < text.size(); ++k) {
    if (text[k] == ' ') continue;
    unit += static_cast<char>(std::toupper(static_cast<unsigned char>(text[k])));
  }
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1},      {"B", 1},        {"KB", 1e3},        {"MB", 1e6},           {"GB", 1e9},
      {"TB", 1e12}, {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  for (const auto& [name, scale] : kUnits) {
    if (unit == name) {
      const double bytes = std::round(number * scale);
      if (bytes > 9.2e18) throw InvalidArgument("size " + shown + " is too large");
      return static_cast<uint64_t>(bytes);
    }
  }
  throw InvalidArgument("size " + shown + " has an unknown unit; expected B, KB, MB, GB, TB, KiB, MiB, GiB or TiB");
}

ShardedSafetensorsWriter::ShardedSafetensorsWriter(fs::path dir, std::vector<TensorDecl> tensors,
                                                   uint64_t max_shard_bytes,
                                                   std::map<std::string, std::string> metadata, std::string prefix)
    : dir_(std::move(dir)), decls_(std::move(tensors)), metadata_(std::move(metadata)), prefix_(std::move(prefix)) {
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) throw IoError("output directory " + dir_.string() + " does not exist");
  plan_ = plan_shards(decls_, max_shard_bytes, prefix_);
  for (size_t s = 0; s < plan_.size(); ++s) {
    for (size_t i : plan_[s].tensors) {
      if (!shard_of_.emplace(decls_[i].name, s).second) {
        throw InvalidArgument("sharded save to " + dir_.string() + ": tensor " + printable(decls_[i].name) +
                              " is declared twice");
      }
    }
  }
  std::vector<TensorDecl> first;
  for (size_t i : plan_[0].tensors) first.push_back(decls_[i]);
  writer_ = std::make_unique<SafetensorsWriter>(dir_ / plan_[0].file_name, std::move(first), metadata_);
}

ShardedSafetensorsWriter::~ShardedSafetensorsWriter() = default;

SafetensorsWriter& ShardedSafetensorsWriter::writer_for(std::string_view name) {
  if (finished_) throw InvalidArgument("sharded save to " + dir_.string() + ": write after finish()");
  auto it = shard_of_.find(std::string(name));
  if (it == shard_of_.end()) {
    throw InvalidArgument("sharded save to " + dir_.string() + ": tensor " + printable(name) + " was not declared");
  }
  const size_t target = it->second;
  if (target < current_) {
    throw InvalidArgument("sharded save to " + dir_.string() + ": tensor " + printable(name) + " belongs to shard " +
                          plan_[target].file_name +
                          ", which is already complete; tensors are written in "
                          "declaration order");
  }
  while (current_ < target) {
    writer_->finish();  // throws, naming the tensor, if the shard is incomplete
    ++current_;
    std::vector<TensorDecl> decls;
    for (size_t i : plan_[current_].tensors) decls.push_back(decls_[i]);
    writer_ = std::make_unique<SafetensorsWriter>(dir_ / plan_[current_].file_name, std::move(decls), metadata_);
  }
  return *writer_;
}

void ShardedSafetensorsWriter::write(std::string_view name, const void* data, size_t bytes) {
  writer_for(name).write(name, data, bytes);
}

void ShardedSafetensorsWriter::write_from_f32(std::string_view name, const float* data, int64_t count) {
  writer_for(name).write_from_f32(name, data, count);
}

void ShardedSafetensorsWriter::finish() {
  if (finished_) throw InvalidArgument("sharded save to " + dir_.string() + ": finish() called twice");
  while (true) {
    writer_->finish();
    if (current_ + 1 == plan_.size()) break;
    ++current_;
    std::vector<TensorDecl> decls;
    for (size_t i : plan_[current_].tensors) decls.push_back(decls_[i]);
    writer_ = std::make_unique<SafetensorsWriter>(dir_ / plan_[current_].file_name, std::move(decls), metadata_);
  }
  writer_.reset();
  finished_ = true;

  const fs::path index_path = dir_ / (prefix_ + ".safetensors.index.json");
  if (plan_.size() > 1) {
    uint64_t total = 0;
    for (const ShardPlan& s : plan_) total += s.data_bytes;
    nlohmann::json weight_map = nlohmann::json::object();  // sorted by name, as transformers writes it
    for (const ShardPlan& s : plan_) {
      for (size_t i : s.tensors) weight_map[decls_[i].name] = s.file_name;
    }
    nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", std::move(weight_map)}};
    io::write_file_atomically(index_path, index.dump(2) + "\n");
  }

  // Remove what an earlier save with this prefix left and this one did not overwrite, so that the
  // directory describes one model.
  std::set<std::string> keep;
  for (const ShardPlan& s : plan_) keep.insert(s.file_name);
  if (plan_.size() > 1) keep.insert(index_path.filename().string());
  std::error_code ec;
  std::vector<fs::path> stale;
  for (const fs::directory_entry& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    const bool ours =
        is_shard_file(name, prefix_) || name == prefix_ + ".safetensors" || name == index_path.filename().string();
    if (ours && !keep.count(name)) stale.push_back(e.path());
  }
  for (const fs::path& p : stale) {
    std::error_code rm;
    if (fs::remove(p, rm)) {
      log::info("removed ", p.string(), ", left by an earlier save");
    } else if (rm) {
      log::warn("could not remove ", p.string(), " (left by an earlier save): ", rm.message());
    }
  }
  if (!stale.empty()) io::fsync_directory(dir_);
}

}  // namespace zero3::safetensors
