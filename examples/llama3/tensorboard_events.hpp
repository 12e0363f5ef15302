// TensorBoard event files, written the way TensorFlow and tensorboard's own EventFileWriter write them, so
// TensorBoard (and DeepSpeed users' tooling) reads llama3_train's curves:
//
//   file    <dir>/events.out.tfevents.<unix seconds>.<hostname>
//   records TFRecord framing: uint64 length, uint32 masked CRC-32C of the length, the bytes, uint32 masked
//           CRC-32C of the bytes (little-endian; mask = rotate right 15 + 0xa282ead8)
//   bytes   an Event protocol buffer: wall_time (1, double), step (2, int64), and either file_version (3,
//           "brain.Event:2", the first record) or summary (5) holding one Summary.Value with tag (1) and
//           simple_value (2, float)
//
// Every scalar is flushed at once, so a TensorBoard reading the directory during a run sees every step.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace llama3 {

class TensorboardWriter {
 public:
  // Creates `dir` (and parents) and a new event file in it, starting with the file_version record.
  // Throws zero3::IoError naming the file when it cannot be created or written.
  explicit TensorboardWriter(const std::filesystem::path& dir);

  void add_scalar(const std::string& tag, double value, int64_t step);

  const std::filesystem::path& path() const { return path_; }

  // One serialized Event (exposed for tests): the file_version record and a scalar record.
  static std::string file_version_event(double wall_time);
  static std::string scalar_event(const std::string& tag, float value, int64_t step, double wall_time);
  // The TFRecord frame around `data`.
  static std::string frame(const std::string& data);

 private:
  void write_record(const std::string& data);

  std::filesystem::path path_;
  std::ofstream out_;
};

}  // namespace llama3
