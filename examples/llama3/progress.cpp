#include "progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace llama3 {

ProgressBar::ProgressBar(int64_t total, int64_t first, bool enabled)
    : total_(total), first_(first), enabled_(enabled && total > 0), start_(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() {
  if (drawn_) std::fputs("\n", stdout);
}

bool ProgressBar::stdout_is_terminal() { return isatty(STDOUT_FILENO) == 1; }

std::string ProgressBar::format_duration(double s) {
  if (!(s >= 0)) return "?";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  char buf[32];
  if (t >= 3600) {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(t / 3600),
                  static_cast<long long>(t / 60 % 60));
  } else if (t >= 60) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(t / 60), static_cast<long long>(t % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(t));
  }
  return buf;
}

void ProgressBar::update(int64_t done, const std::string& status) {
  if (!enabled_) return;
  constexpr int kWidth = 30;
  const double frac = std::clamp(static_cast<double>(done) / static_cast<double>(total_), 0.0, 1.0);
  const int filled = static_cast<int>(frac * kWidth);
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t run_done = done - first_;
  const double eta = run_done > 0 ? elapsed / static_cast<double>(run_done) * static_cast<double>(total_ - done) : -1;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(kWidth - filled), '.');
  std::printf("\r\033[K[%s] %lld/%lld  %s  elapsed %s  ETA %s", bar.c_str(), static_cast<long long>(done),
              static_cast<long long>(total_), status.c_str(), format_duration(elapsed).c_str(),
              run_done > 0 ? format_duration(eta).c_str() : "?");
  std::fflush(stdout);
  drawn_ = true;
}

void ProgressBar::clear() {
  if (!enabled_ || !drawn_) return;
  std::fputs("\r\033[K", stdout);
  std::fflush(stdout);
  drawn_ = false;
}

void ProgressBar::finish() {
  if (!enabled_ || !drawn_) return;
  std::fputs("\n", stdout);
  std::fflush(stdout);
  drawn_ = false;
}

}  // namespace llama3
