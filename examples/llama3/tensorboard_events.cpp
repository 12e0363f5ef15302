#include "tensorboard_events.hpp"

#include <unistd.h>

#include <chrono>
#include <cstring>

#include "zero3/crc32c.hpp"
#include "zero3/error.hpp"

namespace llama3 {
namespace {

// Protocol-buffer wire types.
constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, uint32_t field, uint32_t wire_type) { put_varint(out, (field << 3) | wire_type); }

template <typename T>
void put_le(std::string& out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // x86-64 and AArch64 are little-endian, as the format is
  out.append(bytes, sizeof(T));
}

void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

uint32_t masked_crc(const std::string& s) {
  const uint32_t crc = zero3::crc32c(s.data(), s.size());
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string event_head(double wall_time, int64_t step) {
  std::string e;
  put_key(e, 1, kFixed64);
  put_le(e, wall_time);
  if (step != 0) {  // proto3 leaves default values out
    put_key(e, 2, kVarint);
    put_varint(e, static_cast<uint64_t>(step));
  }
  return e;
}

}  // namespace

std::string TensorboardWriter::file_version_event(double wall_time) {
  std::string e = event_head(wall_time, 0);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}

std::string TensorboardWriter::scalar_event(const std::string& tag, float value, int64_t step, double wall_time) {
  std::string v;  // Summary.Value
  put_bytes(v, 1, tag);
  put_key(v, 2, kFixed32);
  put_le(v, value);
  std::string summary;
  put_bytes(summary, 1, v);
  std::string e = event_head(wall_time, step);
  put_bytes(e, 5, summary);
  return e;
}

std::string TensorboardWriter::frame(const std::string& data) {
  std::string len;
  put_le(len, static_cast<uint64_t>(data.size()));
  std::string out = len;
  put_le(out, masked_crc(len));
  out += data;
  put_le(out, masked_crc(data));
  return out;
}

TensorboardWriter::TensorboardWriter(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw zero3::IoError(dir.string() + ": cannot create the TensorBoard directory: " + ec.message());
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
  const double t = now_seconds();
  path_ = dir / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(t)) + "." + host);
  out_.open(path_, std::ios::binary | std::ios::app);
  if (!out_) throw zero3::IoError(path_.string() + ": cannot create the TensorBoard event file");
  write_record(file_version_event(t));
}

void TensorboardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  write_record(scalar_event(tag, static_cast<float>(value), step, now_seconds()));
}

void TensorboardWriter::write_record(const std::string& data) {
  const std::string rec = frame(data);
  out_.write(rec.data(), static_cast<std::streamsize>(rec.size()));
  out_.flush();
  if (!out_) throw zero3::IoError(path_.string() + ": cannot write a TensorBoard event (disk full?)");
}

}  // namespace llama3
