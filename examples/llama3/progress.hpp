// A one-line progress bar with ETA for llama3_train, drawn on stdout only when stdout is a terminal (a log file
// or a launcher's pipe gets the per-step lines alone). Not thread-safe: the training thread draws it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace llama3 {

class ProgressBar {
 public:
  // `first` steps were done before this run (resume); the ETA counts only the steps this run does.
  ProgressBar(int64_t total, int64_t first, bool enabled);
  ~ProgressBar();
  bool enabled() const { return enabled_; }
  // Redraws the bar after step `done` (of total) with a short status such as "loss 2.31".
  void update(int64_t done, const std::string& status);
  // Erases the bar so a normal line can be printed; the next update() draws it again.
  void clear();
  // Draws the final state and moves to a new line.
  void finish();

  // "1h02m", "3m05s", "12s".
  static std::string format_duration(double seconds);
  // True when stdout is a terminal.
  static bool stdout_is_terminal();

 private:
  int64_t total_, first_;
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace llama3
