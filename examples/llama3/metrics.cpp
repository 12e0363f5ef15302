#include "metrics.hpp"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>

#include "zero3/error.hpp"

namespace llama3 {
namespace fs = std::filesystem;

namespace {

void make_parent(const fs::path& path) {
  std::error_code ec;
  if (path.has_parent_path()) fs::create_directories(path.parent_path(), ec);
  if (ec) throw zero3::IoError(path.parent_path().string() + ": cannot create the directory: " + ec.message());
}

std::string num(double x) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

}  // namespace

std::string MetricsCsv::header() {
  return "step,samples,tokens,loss,lr,grad_norm,clip_coef,loss_scale,skipped,step_time_s,tokens_per_s,forward_s,"
         "backward_s,optimizer_s,comm_wait_s,mem_params,mem_master,mem_grads,mem_optimizer_state,mem_buffers,"
         "mem_activations,mem_engine_peak,mem_device_peak,mem_host,mem_host_peak,mfu,eval_loss,boundary_step_s,agreement_s";
}

MetricsCsv::MetricsCsv(const fs::path& path, bool append) : path_(path) {
  make_parent(path);
  const bool had = append && fs::exists(path) && fs::file_size(path) > 0;
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  if (!out_) throw zero3::IoError(path.string() + ": cannot open the metrics file for writing");
  if (!had) out_ << header() << "\n" << std::flush;
}

void MetricsCsv::write(const StepMetrics& m) {
  out_ << m.step << ',' << m.samples << ',' << m.tokens << ',' << num(m.loss) << ',' << num(m.lr) << ','
       << num(m.grad_norm) << ',' << num(m.clip_coef) << ',' << num(m.loss_scale) << ',' << (m.skipped ? 1 : 0) << ','
       << num(m.step_time) << ',' << num(m.tokens_per_s) << ',' << num(m.forward) << ',' << num(m.backward) << ','
       << num(m.optimizer) << ',' << num(m.comm_wait) << ',' << m.mem_params << ',' << m.mem_master << ','
       << m.mem_grads << ',' << m.mem_optimizer << ',' << m.mem_buffers << ',' << m.mem_activations << ',' << m.mem_peak
       << ',' << m.mem_device_peak << ',' << m.mem_host << ',' << m.mem_host_peak << ',' << (m.mfu ? num(*m.mfu) : "")
       << ',' << (m.eval_loss ? num(*m.eval_loss) : "") << ',' << num(m.boundary_step) << ','
       << num(m.agreement) << '\n'
       << std::flush;
  if (!out_) throw zero3::IoError(path_.string() + ": writing the metrics failed");
}

fs::path monitor_dir(const std::string& output_path, const std::string& job_name, const char* home_dir) {
  fs::path base = output_path;
  if (base.empty()) {
    const char* home = std::getenv("HOME");
    base = fs::path(home != nullptr ? home : ".") / home_dir / "unknown-job-id" / "logs";
  }
  const fs::path dir = base / job_name;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw zero3::IoError(dir.string() + ": cannot create the " + home_dir + " directory: " + ec.message());
  return dir;
}

CsvMonitor::CsvMonitor(const zero3::CsvMonitorConfig& c) : enabled_(c.enabled) {
  if (enabled_) dir_ = monitor_dir(c.output_path, c.job_name, "csv_monitor");
}

void CsvMonitor::write_event(const std::string& name, double value, int64_t step) {
  if (!enabled_) return;
  std::string file = name;
  for (char& ch : file)
    if (ch == '/' || ch == ' ') ch = '_';
  auto it = files_.find(file);
  if (it == files_.end()) {
    const fs::path path = dir_ / (file + ".csv");
    std::ofstream out(path, std::ios::app);
    if (!out) throw zero3::IoError(path.string() + ": cannot open the csv_monitor file");
    const size_t slash = name.rfind('/');
    out << "step," << (slash == std::string::npos ? name : name.substr(slash + 1)) << "\n";
    it = files_.emplace(file, std::move(out)).first;
  }
  it->second << step << ',' << num(value) << '\n' << std::flush;
}

Monitors::Monitors(const zero3::Config& config) : csv_(config.csv_monitor) {
  const zero3::TensorboardConfig& tb = config.tensorboard;
  if (tb.enabled)
    tensorboard_ = std::make_unique<TensorboardWriter>(monitor_dir(tb.output_path, tb.job_name, "tensorboard"));
}

void Monitors::write_event(const std::string& name, double value, int64_t samples) {
  csv_.write_event(name, value, samples);
  if (tensorboard_) tensorboard_->add_scalar(name, value, samples);
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) v /= 1024.0, ++u;
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%" PRId64 " B", bytes);
  } else {
    std::snprintf(buf, sizeof buf, v < 10 ? "%.2f %s" : v < 100 ? "%.1f %s" : "%.0f %s", v, units[u]);
  }
  return buf;
}

}  // namespace llama3
