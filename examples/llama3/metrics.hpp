// Where llama3_train writes its numbers: one CSV row per optimizer step (the run's metrics file), and
// DeepSpeed's csv_monitor files when the config enables that section. Written by rank 0 only; every row is
// flushed at once, so a file read during the run is complete up to its last line.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "tensorboard_events.hpp"
#include "zero3/config.hpp"

namespace llama3 {

// One optimizer step, as the program measured it (times in seconds, memory in bytes on this rank).
struct StepMetrics {
  int64_t step = 0;     // optimizer steps done, this one included
  int64_t samples = 0;  // sequences consumed by all ranks so far
  int64_t tokens = 0;   // tokens consumed by all ranks so far
  double loss = 0;      // mean over every target of the step, all ranks and micro-batches
  double lr = 0;
  double grad_norm = 0;
  double clip_coef = 1;
  double loss_scale = 1;
  bool skipped = false;  // overflow: the optimizer did not update
  double step_time = 0;  // wall clock of the whole step
  double tokens_per_s = 0;
  double forward = 0, backward = 0, optimizer = 0, comm_wait = 0;
  int64_t mem_params = 0, mem_master = 0, mem_grads = 0, mem_optimizer = 0, mem_buffers = 0;
  int64_t mem_activations = 0, mem_peak = 0;
  int64_t mem_device_peak = 0;              // the device's peak: engine, model buffers and kernel workspaces
  int64_t mem_host = 0, mem_host_peak = 0;  // the engine's host memory (offload from a GPU), now and at its peak
  std::optional<double> mfu;                // model FLOPs utilisation (mfu.hpp); nullopt: n/a (CPU, or an unknown GPU)
  std::optional<double> eval_loss;          // the held-out loss after this step, when it was evaluated
  double boundary_step = 0;  // of optimizer, the window's last step() (the boundary's: reductions, optimizer)
  double agreement = 0;      // of comm_wait, the comparisons of the ranks' scope events (ScheduleStats)
};

// The run's metrics CSV: a header line, then one line per step.
class MetricsCsv {
 public:
  // Creates (or, with append, continues) `path`; its directory is created. Throws zero3::IoError.
  MetricsCsv(const std::filesystem::path& path, bool append);
  void write(const StepMetrics& m);
  const std::filesystem::path& path() const { return path_; }
  static std::string header();

 private:
  std::filesystem::path path_;
  std::ofstream out_;
};

// Where DeepSpeed's monitors write: <output_path>/<job_name>, or ~/<home_dir>/unknown-job-id/logs/<job_name>
// when output_path is empty (home_dir "csv_monitor" or "tensorboard"). Created; throws zero3::IoError.
std::filesystem::path monitor_dir(const std::string& output_path, const std::string& job_name, const char* home_dir);

// DeepSpeed's csv_monitor: <monitor_dir>/<event with '/' -> '_'>.csv, each "step,<last part of the event
// name>" then "samples,value" rows, events Train/Samples/train_loss, lr, loss_scale (fp16) and, with
// wall_clock_breakdown, elapsed_time_ms_forward/backward/step.
class CsvMonitor {
 public:
  explicit CsvMonitor(const zero3::CsvMonitorConfig& config);
  bool enabled() const { return enabled_; }
  const std::filesystem::path& dir() const { return dir_; }
  void write_event(const std::string& name, double value, int64_t step);

 private:
  bool enabled_ = false;
  std::filesystem::path dir_;
  std::map<std::string, std::ofstream> files_;
};

// The config's monitor sections as one sink, as DeepSpeed's MonitorMaster: every event goes to csv_monitor
// and to TensorBoard event files (tensorboard_events.hpp) in <monitor_dir>, whichever are enabled.
class Monitors {
 public:
  explicit Monitors(const zero3::Config& config);
  void write_event(const std::string& name, double value, int64_t samples);
  const CsvMonitor& csv() const { return csv_; }
  const TensorboardWriter* tensorboard() const { return tensorboard_.get(); }

 private:
  CsvMonitor csv_;
  std::unique_ptr<TensorboardWriter> tensorboard_;
};

// "1.25 GiB", "3.0 MiB", "512 B".
std::string format_bytes(int64_t bytes);

}  // namespace llama3
