// TensorBoard event files: the bytes must be those tensorboard's own Python writer produces. The expected
// hex strings below were made with tensorboard 2.21 (pip install tensorboard):
//
//   from tensorboard.compat.proto import event_pb2, summary_pb2
//   from tensorboard.summary.writer.record_writer import RecordWriter
//   event_pb2.Event(wall_time=1700000000.25, file_version="brain.Event:2").SerializeToString()
//   event_pb2.Event(wall_time=1700000001.5, step=128, summary=summary_pb2.Summary(value=[
//       summary_pb2.Summary.Value(tag="Train/Samples/train_loss", simple_value=2.5)])).SerializeToString()
//   RecordWriter(f).write(<the first event>)   # the TFRecord frame
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "tensorboard_events.hpp"
#include "zero3/error.hpp"

using llama3::TensorboardWriter;

namespace {

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

std::filesystem::path temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("zero3-tb-" + std::to_string(::getpid()) + "-" + name);
  std::filesystem::remove_all(dir);
  return dir;
}

}  // namespace

TEST(TensorboardEvents, EventsAreTheBytesTensorboardWrites) {
  EXPECT_EQ(hex(TensorboardWriter::file_version_event(1700000000.25)),
            "0900001040fc54d9411a0d627261696e2e4576656e743a32");
  EXPECT_EQ(hex(TensorboardWriter::scalar_event("Train/Samples/train_loss", 2.5f, 128, 1700000001.5)),
            "0900006040fc54d9411080012a210a1f0a18547261696e2f53616d706c65732f747261696e5f6c6f73731500002040");
  EXPECT_EQ(hex(TensorboardWriter::scalar_event("Train/Samples/lr", 1e-4f, 3, 1700000002.0)),
            "0900008040fc54d94110032a190a170a10547261696e2f53616d706c65732f6c721517b7d138");
}

TEST(TensorboardEvents, RecordFrameIsTFRecord) {
  EXPECT_EQ(hex(TensorboardWriter::frame(TensorboardWriter::file_version_event(1700000000.25))),
            "1800000000000000a37f4b220900001040fc54d9411a0d627261696e2e4576656e743a32338d2fe9");
}

TEST(TensorboardEvents, FileHoldsVersionThenEveryScalar) {
  const auto dir = temp_dir("file");
  std::filesystem::path path;
  {
    TensorboardWriter w(dir / "job");
    path = w.path();
    EXPECT_EQ(path.parent_path(), dir / "job");
    EXPECT_EQ(path.filename().string().rfind("events.out.tfevents.", 0), 0u);
    w.add_scalar("Train/Samples/train_loss", 2.5, 128);
    w.add_scalar("Train/Samples/lr", 1e-4, 3);
  }
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Walk the frames: each length must match, and there must be exactly three records.
  size_t pos = 0;
  int records = 0;
  std::string last;
  while (pos < bytes.size()) {
    ASSERT_LE(pos + 12, bytes.size());
    uint64_t len = 0;
    std::memcpy(&len, bytes.data() + pos, 8);
    ASSERT_LE(pos + 12 + len + 4, bytes.size());
    const std::string data = bytes.substr(pos + 12, len);
    EXPECT_EQ(TensorboardWriter::frame(data), bytes.substr(pos, 12 + len + 4)) << "record " << records;
    last = data;
    pos += 12 + len + 4;
    ++records;
  }
  EXPECT_EQ(records, 3);
  // The last record is the lr scalar at step 3 (its wall time differs; the tail after it is fixed).
  EXPECT_NE(hex(last).find("10032a190a170a10547261696e2f53616d706c65732f6c721517b7d138"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(TensorboardEvents, UnwritableDirectoryNamesIt) {
  const auto dir = temp_dir("blocked");
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "file") << "x";  // a file where the directory would go
  try {
    TensorboardWriter w(dir / "file" / "job");
    FAIL() << "expected IoError";
  } catch (const zero3::IoError& e) {
    EXPECT_NE(std::string(e.what()).find("file/job"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}
