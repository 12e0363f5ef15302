// The NVMe parameter read buffers (zero/param_prefetcher.hpp) over a real swap file (zero/param_swap.hpp): reads
// started ahead come back with the bytes last written, with 1, 2 and 4 buffers; a claim with no buffer free
// takes the one read furthest ahead; a read dropped before a rewrite never hands out the old bytes; reads of a
// truncated file or of a never-written slice fail at the claim that needs them, as IoErrors naming the file,
// the offset and the size, and leave the buffer usable; bad buffer settings are ConfigErrors before the file
// exists.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "zero/param_prefetcher.hpp"
#include "zero/param_swap.hpp"
#include "zero3/config.hpp"
#include "zero3/error.hpp"

using namespace zero3;
using namespace zero3::detail;
namespace fs = std::filesystem;

namespace {

// Slices of unaligned sizes, in bytes (bf16: 2 bytes per element).
const std::vector<size_t> kSliceBytes = {2, 8190, 8192, 100'002, 4096, 30'000};

fs::path scratch_dir(const std::string& name) {
  const char* bin = std::getenv("ZERO3_BIN_DIR");
  fs::path base = bin ? fs::path(bin).parent_path() / "test-scratch" : fs::path("/tmp");
  fs::path dir = base / (name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::vector<std::byte> pattern(size_t unit, size_t bytes, int generation) {
  std::vector<std::byte> v(bytes);
  for (size_t j = 0; j < bytes; ++j) v[j] = static_cast<std::byte>((unit * 37 + j * 11 + generation * 101) & 0xff);
  return v;
}

class ParamPrefetcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_dir("param-prefetcher");
    config_.zero.offload_param.device = OffloadDevice::nvme;
    config_.zero.offload_param.nvme_path = dir_.string();
    config_.zero.offload_param.buffer_size = 100'000;
  }
  void TearDown() override {
    swap_.reset();
    fs::remove_all(dir_);
  }

  // Creates the swap and writes generation `generation` of every slice.
  void make_swap(int generation = 0) {
    swap_ = std::make_unique<ParamSwap>(config_, 0, kSliceBytes, 2);
    for (size_t u = 0; u < kSliceBytes.size(); ++u) swap_->write(u, pattern(u, kSliceBytes[u], generation).data());
  }

  static void expect_slice(const ParamPrefetcher::Claim& c, size_t unit, int generation) {
    ASSERT_NE(c.data, nullptr);
    std::vector<std::byte> want = pattern(unit, kSliceBytes[unit], generation);
    EXPECT_EQ(std::memcmp(c.data, want.data(), want.size()), 0) << "unit " << unit << " generation " << generation;
  }

  fs::path dir_;
  Config config_;
  std::unique_ptr<ParamSwap> swap_;
};

}  // namespace

TEST_F(ParamPrefetcherTest, ReadsAheadIntoAFixedPool) {
  make_swap();
  for (size_t buffers : {1u, 2u, 4u}) {
    SCOPED_TRACE("buffer_count " + std::to_string(buffers));
    ParamPrefetcher p(*swap_, buffers);
    EXPECT_EQ(p.buffer_count(), buffers);
    EXPECT_EQ(p.buffer_bytes(), 102'400u);  // the largest slice, 100'002 bytes, padded to 4096
    // Reads ahead for as many units as there are buffers, then no more.
    size_t started = 0;
    for (size_t u = 0; u < kSliceBytes.size(); ++u) started += p.start(u) ? 1 : 0;
    EXPECT_EQ(started, buffers);
    EXPECT_EQ(p.free_buffers(), 0u);
    // The reads complete without anyone waiting for them.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!p.read_done(buffers - 1) && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    EXPECT_TRUE(p.read_done(buffers - 1));
    // Each unit in order, the pool kept full: every slice was read ahead, and comes back as written.
    size_t next = buffers;
    for (size_t u = 0; u < kSliceBytes.size(); ++u) {
      ASSERT_TRUE(p.can_claim(u));
      ParamPrefetcher::Claim c = p.claim(u);
      EXPECT_TRUE(c.read_ahead) << "unit " << u;
      EXPECT_GE(c.wait_seconds, 0.0);
      expect_slice(c, u, 0);
      EXPECT_TRUE(p.claimed(u));
      p.release(u);
      EXPECT_FALSE(p.holds(u));
      if (next < kSliceBytes.size()) {
        EXPECT_TRUE(p.start(next++));
      }
    }
    EXPECT_EQ(p.free_buffers(), buffers);
  }
}

TEST_F(ParamPrefetcherTest, ClaimsTakeTheBufferReadFurthestAheadAndWaitForNone) {
  make_swap();
  ParamPrefetcher p(*swap_, 2);
  ASSERT_TRUE(p.start(1));
  ASSERT_TRUE(p.start(2));
  EXPECT_TRUE(p.start(2));  // already read ahead
  EXPECT_FALSE(p.start(3));
  EXPECT_EQ(p.reading_units(), (std::vector<size_t>{1, 2}));
  EXPECT_FALSE(p.read_done(3));
  // Unit 0 is needed first: unit 2's read (started last) gives way; unit 1's stays.
  ParamPrefetcher::Claim c0 = p.claim(0);
  EXPECT_FALSE(c0.read_ahead);
  expect_slice(c0, 0, 0);
  EXPECT_TRUE(p.holds(1));
  EXPECT_FALSE(p.holds(2));
  // Both buffers claimed: no claim is possible until one is released; the longest-claimed is named first.
  ParamPrefetcher::Claim c1 = p.claim(1);
  EXPECT_TRUE(c1.read_ahead);
  expect_slice(c1, 1, 0);
  EXPECT_FALSE(p.can_claim(3));
  EXPECT_EQ(p.claimed_units(), (std::vector<size_t>{0, 1}));
  EXPECT_THROW(p.claim(3), InvalidArgument);
  EXPECT_THROW(p.discard(0), InvalidArgument);
  p.release(0);
  EXPECT_THROW(p.release(0), InvalidArgument);
  EXPECT_TRUE(p.can_claim(3));
  expect_slice(p.claim(3), 3, 0);
  EXPECT_EQ(p.claimed_units(), (std::vector<size_t>{1, 3}));
}

TEST_F(ParamPrefetcherTest, DiscardedReadsNeverHandOutTheOldSlice) {
  make_swap();
  ParamPrefetcher p(*swap_, 4);
  for (size_t u = 0; u < 4; ++u) ASSERT_TRUE(p.start(u));
  // The step rewrites units 0-3: reads of the old slices are dropped first.
  for (size_t u = 0; u < 4; ++u) {
    p.discard(u);
    swap_->write(u, pattern(u, kSliceBytes[u], 1).data());
  }
  EXPECT_EQ(p.free_buffers(), 4u);
  for (size_t u = 0; u < 4; ++u) {
    ParamPrefetcher::Claim c = p.claim(u);
    EXPECT_FALSE(c.read_ahead);
    expect_slice(c, u, 1);
    p.release(u);
  }
}

TEST_F(ParamPrefetcherTest, TruncatedSwapFailsAtTheClaimWithFileOffsetAndSize) {
  make_swap();
  ParamPrefetcher p(*swap_, 2);
  expect_slice(p.claim(0), 0, 0);
  p.release(0);
  // The file loses everything after unit 2's slice (units 0-2 take 4096 + 8192 + 8192 bytes): reads of units 3
  // on fail, whether started ahead or at the claim.
  ASSERT_EQ(::truncate(swap_->path().c_str(), 20480), 0);
  ASSERT_TRUE(p.start(3));  // never throws
  try {
    p.claim(3);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(swap_->path()), std::string::npos) << msg;
    EXPECT_NE(msg.find("offset 20480"), std::string::npos) << msg;
    EXPECT_NE(msg.find("102400 bytes"), std::string::npos) << msg;  // unit 3's padded slice
  }
  EXPECT_FALSE(p.holds(3));
  EXPECT_EQ(p.free_buffers(), 2u);
  EXPECT_THROW(p.claim(4), IoError);  // read at the claim
  // Units still in the file are read as before.
  expect_slice(p.claim(1), 1, 0);
}

TEST_F(ParamPrefetcherTest, NeverWrittenSliceIsRefusedAtTheClaim) {
  swap_ = std::make_unique<ParamSwap>(config_, 0, kSliceBytes, 2);
  swap_->write(0, pattern(0, kSliceBytes[0], 0).data());
  ParamPrefetcher p(*swap_, 1);
  EXPECT_TRUE(p.start(1));
  try {
    p.claim(1);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("holds no complete data"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(swap_->path()), std::string::npos) << e.what();
  }
  expect_slice(p.claim(0), 0, 0);
}

TEST_F(ParamPrefetcherTest, BufferSettingsAreCheckedBeforeTheFileExists) {
  const std::string file = (dir_ / "zero3-swap-param-rank0.bin").string();
  config_.zero.offload_param.buffer_count = 0;
  try {
    ParamSwap s(config_, 0, kSliceBytes, 2);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.offload_param.buffer_count"), std::string::npos)
        << e.what();
  }
  config_.zero.offload_param.buffer_count = 5;
  config_.zero.offload_param.buffer_size = 50'000;  // the largest slice has 50'001 elements
  try {
    ParamSwap s(config_, 0, kSliceBytes, 2);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.offload_param.buffer_size"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("50001"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(file));
  config_.zero.offload_param.buffer_size = 50'001;
  ParamSwap fits(config_, 0, kSliceBytes, 2);
  EXPECT_TRUE(fs::exists(file));
  EXPECT_THROW(ParamPrefetcher(fits, 0), InvalidArgument);
}
