#include "checkpoint/checkpoint_dir.hpp"

#include <fcntl.h>
#include <stdio.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "checkpoint/crash_point.hpp"
#include "checkpoint/manifest.hpp"
#include "io/atomic_file.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::ckpt {
namespace fs = std::filesystem;

namespace {

constexpr const char* kTempPrefix = ".tmp-";
constexpr const char* kOldPrefix = ".old-";

std::string hex16(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// "<prefix>TAG-<16 hex>" -> TAG, or nullopt for any other name.
std::optional<std::string> tag_of(const std::string& name, const std::string& prefix) {
  if (name.size() < prefix.size() + 18 || name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  const std::string nonce = name.substr(name.size() - 16);
  if (name[name.size() - 17] != '-' || nonce.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return std::nullopt;
  }
  return name.substr(prefix.size(), name.size() - 17 - prefix.size());
}

bool has_manifest(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p / kManifestName, ec);
}

}  // namespace

void validate_tag(const std::string& tag) {
  auto bad = [&](const std::string& why) {
    throw InvalidArgument("checkpoint tag '" + tag + "' " + why +
                          " (a tag names a directory: a plain file name such as \"global_step1000\")");
  };
  if (tag.empty()) bad("is empty");
  if (tag.size() > 200) bad("is longer than 200 bytes");
  if (tag.find('/') != std::string::npos) bad("contains '/'");
  for (unsigned char c : tag) {
    if (c < 0x20 || c == 0x7f) bad("contains a control character");
  }
  if (tag.front() == ' ' || tag.back() == ' ') bad("starts or ends with a space");
  if (tag[0] == '.') bad("starts with '.' (reserved for temporary directories)");
  if (tag == kLatestName) bad("is reserved: DIR/latest names the newest checkpoint");
}

std::string read_latest(const fs::path& dir) {
  const fs::path path = dir / kLatestName;
  std::ifstream in(path);
  if (!in) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      throw CheckpointError("no checkpoint directory " + dir.string() + " (it does not exist)");
    }
    throw CheckpointError(path.string() + " is missing: no checkpoint was completed in " + dir.string() +
                          " (pass a tag to load a specific one)");
  }
  std::ostringstream text;
  text << in.rdbuf();
  std::string tag = text.str();
  while (!tag.empty() && (tag.back() == '\n' || tag.back() == '\r' || tag.back() == ' ' || tag.back() == '\t')) {
    tag.pop_back();
  }
  try {
    validate_tag(tag);
  } catch (const InvalidArgument& e) {
    throw CheckpointError(path.string() + " does not hold a valid tag: " + e.what());
  }
  return tag;
}

void write_latest(const fs::path& dir, const std::string& tag) {
  try {
    io::write_file_atomically(dir / kLatestName, tag + "\n");
  } catch (const IoError& e) {
    throw CheckpointError("cannot update " + (dir / kLatestName).string() + ": " + e.what());
  }
}

fs::path temp_dir_path(const fs::path& dir, const std::string& tag, uint64_t nonce) {
  return dir / (std::string(kTempPrefix) + tag + "-" + hex16(nonce));
}

void remove_quietly(const fs::path& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) log::warn("could not remove ", path.string(), ": ", ec.message());
}

void clean_interrupted_saves(const fs::path& dir) {
  std::error_code ec;
  std::vector<fs::path> temps, olds;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (tag_of(name, kTempPrefix)) temps.push_back(it->path());
    if (tag_of(name, kOldPrefix)) olds.push_back(it->path());
  }
  if (ec) {
    log::warn("could not list ", dir.string(), " to clean interrupted saves: ", ec.message());
    return;
  }
  for (const fs::path& p : temps) {
    log::info("removing ", p.string(), ", left by an interrupted save");
    remove_quietly(p);
  }
  for (const fs::path& p : olds) {
    const std::string tag = *tag_of(p.filename().string(), kOldPrefix);
    const fs::path current = dir / tag;
    if (has_manifest(current) || !has_manifest(p)) {
      log::info("removing ", p.string(), ", replaced by a newer save of tag '", tag, "'");
      remove_quietly(p);
      continue;
    }
    // A replacement stopped between its two renames: this is the only copy of TAG.
    std::error_code rec;
    if (fs::exists(current, rec)) remove_quietly(current);
    try {
      io::durable_rename(p, current);
      log::warn("restored ", current.string(), " from ", p.string(), ", left by an interrupted replacement");
    } catch (const IoError& e) {
      log::warn("could not restore ", current.string(), " from ", p.string(), ": ", e.what());
    }
  }
}

std::optional<fs::path> locate_checkpoint(const fs::path& dir, const std::string& tag) {
  const fs::path direct = dir / tag;
  if (has_manifest(direct)) return direct;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::optional<std::string> t = tag_of(name, kOldPrefix);
    if (t && *t == tag && has_manifest(it->path())) {
      log::warn("checkpoint ", direct.string(), " is missing; using ", it->path().string(),
                ", which an interrupted replacement of it left");
      return it->path();
    }
  }
  return std::nullopt;
}

std::optional<fs::path> commit_directory(const fs::path& temp, const fs::path& dir, const std::string& tag,
                                         uint64_t nonce, bool try_exchange) {
  const fs::path target = dir / tag;
  std::error_code ec;
  const bool replacing = fs::exists(fs::symlink_status(target, ec));
  try {
    if (!replacing) {
      io::durable_rename(temp, target);
      return std::nullopt;
    }
    if (try_exchange && ::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
      // `temp` now holds the old checkpoint.
      io::fsync_directory(dir);
      return temp;
    }
    const int err = errno;
    if (try_exchange && err != EINVAL && err != ENOSYS && err != EOPNOTSUPP) {
      throw IoError("renameat2(RENAME_EXCHANGE) " + temp.string() + " <-> " + target.string() +
                    " failed: " + std::strerror(err));
    }
    const fs::path old = dir / (std::string(kOldPrefix) + tag + "-" + hex16(nonce));
    io::durable_rename(target, old);
    crash_point("replace_between_renames");
    io::durable_rename(temp, target);
    return old;
  } catch (const IoError& e) {
    throw CheckpointError("cannot commit checkpoint " + target.string() + ": " + e.what());
  }
}

}  // namespace zero3::ckpt
