#include "zero3/log.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>

#include "core/env.hpp"

namespace zero3::log {
namespace {

std::atomic<int> g_rank{-1};

LogLevel parse_level(const std::string& s) {
  if (s == "error") return LogLevel::error;
  if (s == "warn" || s == "warning") return LogLevel::warn;
  if (s == "debug") return LogLevel::debug;
  return LogLevel::info;
}

std::atomic<int>& level_storage() {
  static std::atomic<int> level{static_cast<int>(parse_level(env::log_level()))};
  return level;
}

const char* level_tag(LogLevel level) {
  switch (level) {
    case LogLevel::error: return "ERROR";
    case LogLevel::warn: return "WARN ";
    case LogLevel::info: return "INFO ";
    case LogLevel::debug: return "DEBUG";
  }
  return "?";
}

}  // namespace

void set_rank(int r) { g_rank.store(r); }
int rank() { return g_rank.load(); }
LogLevel level() { return static_cast<LogLevel>(level_storage().load()); }
void set_level(LogLevel l) { level_storage().store(static_cast<int>(l)); }
bool enabled(LogLevel l) { return static_cast<int>(l) <= level_storage().load(); }

void write(LogLevel l, std::string_view message) {
  std::string line = "[zero3";
  if (int r = rank(); r >= 0) line += " rank " + std::to_string(r);
  line += "] ";
  line += level_tag(l);
  line += ' ';
  line += message;
  line += '\n';
  // One write(2) per line so lines from threads and processes do not interleave.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace zero3::log
