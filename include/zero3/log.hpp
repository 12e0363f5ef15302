// Rank-prefixed, levelled logging to stderr: "[zero3 rank 3] WARN  message".
//
// The level comes from ZERO3_LOG_LEVEL (error|warn|info|debug, default info). The rank prefix is set once
// the process knows its rank (the bootstrap does it). Thread-safe: one line is written with one call.
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace zero3 {

enum class LogLevel : int { error = 0, warn = 1, info = 2, debug = 3 };

namespace log {

void set_rank(int rank);  // -1: no rank known yet
int rank();
LogLevel level();
void set_level(LogLevel level);
bool enabled(LogLevel level);
void write(LogLevel level, std::string_view message);

template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

template <typename... Args>
void error(const Args&... args) {
  if (enabled(LogLevel::error)) write(LogLevel::error, concat(args...));
}
template <typename... Args>
void warn(const Args&... args) {
  if (enabled(LogLevel::warn)) write(LogLevel::warn, concat(args...));
}
template <typename... Args>
void info(const Args&... args) {
  if (enabled(LogLevel::info)) write(LogLevel::info, concat(args...));
}
template <typename... Args>
void debug(const Args&... args) {
  if (enabled(LogLevel::debug)) write(LogLevel::debug, concat(args...));
}
// Only rank 0 (or a process with no rank yet) writes.
template <typename... Args>
void info_rank0(const Args&... args) {
  if (rank() <= 0) info(args...);
}
template <typename... Args>
void warn_rank0(const Args&... args) {
  if (rank() <= 0) warn(args...);
}

}  // namespace log
}  // namespace zero3
