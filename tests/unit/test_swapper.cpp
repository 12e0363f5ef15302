// The swapper: tiles at unaligned logical sizes survive many read-compute-write passes through every
// engine and every pipeline setting; reads run ahead of the compute; a failed write (a full disk injected
// as ENOSPC, or a real EFBIG from the file size limit) leaves the tile untrusted so that nothing
// half-written is read back; bad layouts and too few buffers are clear errors.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "io/aio_engine.hpp"
#include "io/kernel_queue.hpp"
#include "offload/swap_file.hpp"
#include "offload/swapper.hpp"
#include "zero3/error.hpp"

using namespace zero3;
using namespace zero3::io;
using namespace zero3::offload;
namespace fs = std::filesystem;

namespace {

fs::path scratch_dir(const std::string& name) {
  const char* bin = std::getenv("ZERO3_BIN_DIR");
  fs::path base = bin ? fs::path(bin).parent_path() / "test-scratch" : fs::temp_directory_path();
  fs::path dir = base / (name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// Byte j of tile t after `gen` updates.
std::byte pattern(size_t t, size_t j, uint32_t gen) {
  return static_cast<std::byte>((t * 131 + j * 7 + gen * 29 + (j >> 8)) & 0xff);
}

// Passes through to a real engine, but fails writes that touch [fail_from, fail_to) with `err` without
// issuing them: a disk that is full in that range.
class FaultyEngine final : public AioEngine {
 public:
  FaultyEngine(std::unique_ptr<AioEngine> inner, uint64_t fail_from, uint64_t fail_to, int err)
      : AioEngine(inner->kind(), inner->config()),
        inner_(std::move(inner)),
        from_(fail_from),
        to_(fail_to),
        err_(err),
        failing_(std::make_shared<detail::IoRequestState>()) {}

  IoTicket submit(IoOp op, const IoFile& file, void* buffer, size_t bytes, uint64_t offset) override {
    if (op == IoOp::write && offset < to_ && offset + bytes > from_) {
      ++injected;
      return IoTicket(failing_);
    }
    return inner_->submit(op, file, buffer, bytes, offset);
  }
  void wait(const IoTicket& t) override {
    if (t.state() == failing_) {
      throw IoError(std::string("injected write failure: ") + std::strerror(err_) + " (errno " + std::to_string(err_) +
                    ")");
    }
    inner_->wait(t);
  }
  bool ready(const IoTicket& t) const override { return t.state() == failing_ || inner_->ready(t); }
  void drain() override { inner_->drain(); }
  AioStats stats() const override { return inner_->stats(); }

  int injected = 0;

 private:
  std::unique_ptr<AioEngine> inner_;
  uint64_t from_, to_;
  int err_;
  std::shared_ptr<detail::IoRequestState> failing_;
};

const std::vector<size_t> kTileBytes = {1, 4095, 4096, 4097, 100'003, 65'536 * 2 + 17, 3, 250'000, 12'345};

AioConfig test_aio() {
  AioConfig c;
  c.block_size = 64 * 1024;
  c.queue_depth = 4;
  return c;
}

class SwapperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_dir("swapper");
    tiles_ = pack_swap_tiles(kTileBytes);
    SwapFileSpec spec;
    spec.dir = dir_.string();
    spec.tier = "optimizer";
    spec.bytes = swap_tiles_end(tiles_);
    file_ = std::make_unique<SwapFile>(spec);
  }
  void TearDown() override {
    file_.reset();
    fs::remove_all(dir_);
  }

  // Fills every tile with generation 0.
  static void initialize(Swapper& s) {
    s.run(SwapPass::write_only, [](size_t t, std::span<std::byte> data) {
      for (size_t j = 0; j < data.size(); ++j) data[j] = pattern(t, j, 0);
    });
  }
  // One read-compute-write pass: checks generation `gen`, writes `gen + 1`.
  static void step(Swapper& s, uint32_t gen, std::span<const size_t> order, size_t* checked) {
    s.run(SwapPass::read_write, order, [&](size_t t, std::span<std::byte> data) {
      ASSERT_EQ(data.size(), kTileBytes[t]);
      for (size_t j = 0; j < data.size(); ++j) {
        ASSERT_EQ(data[j], pattern(t, j, gen)) << "tile " << t << " byte " << j << " generation " << gen;
        data[j] = pattern(t, j, gen + 1);
      }
      ++*checked;
    });
  }

  fs::path dir_;
  std::vector<SwapTile> tiles_;
  std::unique_ptr<SwapFile> file_;
};

}  // namespace

TEST(SwapTiles, PackedAlignedAndPadded) {
  std::vector<size_t> bytes = {1, 4096, 4097, 0, 10};
  auto tiles = pack_swap_tiles(bytes, 8192);
  ASSERT_EQ(tiles.size(), 5u);
  EXPECT_EQ(tiles[0].offset, 8192u);
  EXPECT_EQ(tiles[1].offset, 8192u + 4096);
  EXPECT_EQ(tiles[2].offset, 8192u + 8192);
  EXPECT_EQ(tiles[3].offset, 8192u + 16384);
  EXPECT_EQ(tiles[4].offset, 8192u + 16384);
  EXPECT_EQ(swap_tiles_end(tiles), 8192u + 20480);
  EXPECT_THROW(pack_swap_tiles(bytes, 100), InvalidArgument);
}

// Every engine, every pipeline setting, forward and reverse order: the data of each tile comes back intact
// after several passes.
TEST_F(SwapperTest, RoundTripThroughEveryEngineAndPipeline) {
  for (AioEngineKind kind : usable_aio_engines(test_aio())) {
    auto engine = make_aio_engine(test_aio(), kind);
    for (int pipe = 0; pipe < 4; ++pipe) {
      SwapperOptions o;
      o.pipeline_read = pipe & 1;
      o.pipeline_write = pipe & 2;
      o.buffer_count = 1 + o.pipeline_read + o.pipeline_write;  // the minimum
      SCOPED_TRACE(::testing::Message() << aio_engine_name(kind) << " pipeline_read=" << o.pipeline_read
                                        << " pipeline_write=" << o.pipeline_write);
      Swapper s(*engine, *file_, tiles_, o);
      initialize(s);
      for (size_t t = 0; t < tiles_.size(); ++t) EXPECT_TRUE(s.tile_trusted(t));
      std::vector<size_t> forward(tiles_.size()), reverse(tiles_.size());
      for (size_t i = 0; i < tiles_.size(); ++i) forward[i] = i, reverse[i] = tiles_.size() - 1 - i;
      size_t checked = 0;
      for (uint32_t gen = 0; gen < 4; ++gen) step(s, gen, gen % 2 ? reverse : forward, &checked);
      EXPECT_EQ(checked, 4 * tiles_.size());
      // A read-only pass sees the last generation and writes nothing.
      uint64_t written = s.stats().bytes_written;
      s.run(SwapPass::read_only, [&](size_t t, std::span<std::byte> data) {
        for (size_t j = 0; j < data.size(); ++j) ASSERT_EQ(data[j], pattern(t, j, 4));
      });
      EXPECT_EQ(s.stats().bytes_written, written);
      // Reads run ahead of the compute exactly when pipelined.
      if (o.pipeline_read) {
        EXPECT_GT(s.stats().reads_ahead, 0u);
      } else {
        EXPECT_EQ(s.stats().reads_ahead, 0u);
      }
    }
  }
}

// The look-ahead is buffer_count - 1 (computing) - 1 (writing back): when tile k reaches the callback, the
// reads of tiles k+1 .. k+lookahead have been issued.
TEST_F(SwapperTest, ReadsRunAheadByTheFreeBuffers) {
  auto engine = make_aio_engine(test_aio());
  for (size_t buffers : {3, 4, 6}) {
    SwapperOptions o;
    o.buffer_count = buffers;
    Swapper s(*engine, *file_, tiles_, o);
    initialize(s);
    s.reset_stats();
    size_t lookahead = buffers - 2;
    s.run(SwapPass::read_write, [&](size_t k, std::span<std::byte>) {
      uint64_t expect = 0;
      for (size_t i = 0; i <= std::min(k + lookahead, tiles_.size() - 1); ++i) expect += align_up(kTileBytes[i], 4096);
      EXPECT_EQ(s.stats().bytes_read, expect) << buffers << " buffers, tile " << k;
    });
    EXPECT_EQ(s.stats().reads_ahead, tiles_.size() - 1);
  }
}

TEST_F(SwapperTest, SingleTileTransfers) {
  auto engine = make_aio_engine(test_aio());
  Swapper s(*engine, *file_, tiles_, SwapperOptions{});
  std::vector<std::byte> out(kTileBytes[4]), in(kTileBytes[4]);
  for (size_t j = 0; j < out.size(); ++j) out[j] = pattern(4, j, 9);
  EXPECT_FALSE(s.tile_trusted(4));
  s.write_tile(4, out);
  EXPECT_TRUE(s.tile_trusted(4));
  s.read_tile(4, in);
  EXPECT_EQ(in, out);
  EXPECT_THROW(s.read_tile(4, std::span<std::byte>(in.data(), 10)), InvalidArgument);
}

TEST_F(SwapperTest, LayoutAndOptionErrors) {
  auto engine = make_aio_engine(test_aio());
  SwapperOptions o;
  o.buffer_count = 2;  // pipelined both ways needs 3
  o.config_key = "zero_optimization.offload_optimizer";
  try {
    Swapper s(*engine, *file_, tiles_, o);
    FAIL() << "2 buffers accepted with both pipelines";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.offload_optimizer.buffer_count"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("at least 3"), std::string::npos) << e.what();
  }
  o = SwapperOptions{};
  o.buffer_bytes = 4096;  // the largest tile is 250000 bytes
  EXPECT_THROW(Swapper(*engine, *file_, tiles_, o), ConfigError);
  auto bad = tiles_;
  bad[2].offset += 512;
  EXPECT_THROW(Swapper(*engine, *file_, bad, SwapperOptions{}), InvalidArgument);
  bad = tiles_;
  bad[3].offset = bad[2].offset;  // overlap
  EXPECT_THROW(Swapper(*engine, *file_, bad, SwapperOptions{}), InvalidArgument);
  bad = tiles_;
  bad.push_back({file_->size(), 1});  // beyond the file
  EXPECT_THROW(Swapper(*engine, *file_, bad, SwapperOptions{}), InvalidArgument);
  Swapper s(*engine, *file_, tiles_, SwapperOptions{});
  EXPECT_THROW(s.run(SwapPass::write_only, std::vector<size_t>{1, 1}, [](size_t, std::span<std::byte>) {}),
               InvalidArgument);
  EXPECT_THROW(s.run(SwapPass::write_only, std::vector<size_t>{99}, [](size_t, std::span<std::byte>) {}),
               InvalidArgument);
}

TEST_F(SwapperTest, NeverWrittenTilesAreNotRead) {
  auto engine = make_aio_engine(test_aio());
  Swapper s(*engine, *file_, tiles_, SwapperOptions{});
  bool called = false;
  try {
    s.run(SwapPass::read_write, [&](size_t, std::span<std::byte>) { called = true; });
    FAIL() << "read of never-written tiles accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("holds no complete data"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(called) << "the check must come before any compute";
}

// A full disk, injected: writes to tile 5's range fail with ENOSPC. The pass reports it, tile 5 is no longer
// trusted (its on-disk bytes may be half old, half new), every other tile keeps its new data.
TEST_F(SwapperTest, FailedWriteLeavesTheTileUntrusted) {
  for (AioEngineKind kind : usable_aio_engines(test_aio())) {
    SCOPED_TRACE(aio_engine_name(kind));
    FaultyEngine engine(make_aio_engine(test_aio(), kind), 0, 0, ENOSPC);
    Swapper s(engine, *file_, tiles_, SwapperOptions{});
    initialize(s);
    FaultyEngine failing(make_aio_engine(test_aio(), kind), tiles_[5].offset, tiles_[5].offset + 1, ENOSPC);
    Swapper s2(failing, *file_, tiles_, SwapperOptions{});
    // s2 starts with nothing trusted; give it the data s wrote through single-tile copies.
    for (size_t t = 0; t < tiles_.size(); ++t) {
      std::vector<std::byte> buf(kTileBytes[t]);
      s.read_tile(t, buf);
      if (t != 5) s2.write_tile(t, buf);
    }
    EXPECT_EQ(failing.injected, 0);
    std::vector<std::byte> five(kTileBytes[5]);
    s.read_tile(5, five);
    try {
      s2.write_tile(5, five);
      FAIL() << "injected ENOSPC not reported";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(std::strerror(ENOSPC)), std::string::npos) << e.what();
    }
    EXPECT_FALSE(s2.tile_trusted(5));
    for (size_t t = 0; t < tiles_.size(); ++t) {
      if (t != 5) {
        EXPECT_TRUE(s2.tile_trusted(t)) << t;
      }
    }
    EXPECT_THROW(s2.read_tile(5, five), IoError);
    std::vector<size_t> others = {0, 1, 2, 3, 4, 6, 7, 8};
    size_t checked = 0;
    step(s2, 0, others, &checked);
    EXPECT_EQ(checked, others.size());
  }
}

// The same with a real kernel error: RLIMIT_FSIZE below tile 7's offset makes its write fail with EFBIG
// inside a pipelined read-write pass.
TEST_F(SwapperTest, KernelWriteErrorMidPass) {
  for (AioEngineKind kind : usable_aio_engines(test_aio())) {
    SCOPED_TRACE(aio_engine_name(kind));
    auto engine = make_aio_engine(test_aio(), kind);
    Swapper s(*engine, *file_, tiles_, SwapperOptions{});
    initialize(s);
    rlimit old{};
    ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
    auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
    rlimit lim = old;
    lim.rlim_cur = tiles_[7].offset;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
    std::string msg;
    size_t checked = 0;
    try {
      step(s, 0, std::vector<size_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}, &checked);
    } catch (const IoError& e) {
      msg = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &old);
    ::signal(SIGXFSZ, old_handler);
    EXPECT_NE(msg.find(std::strerror(EFBIG)), std::string::npos) << msg;
    EXPECT_NE(msg.find(file_->path()), std::string::npos) << msg;
    EXPECT_FALSE(s.tile_trusted(7));
    EXPECT_FALSE(s.tile_trusted(8));  // beyond the limit too
    for (size_t t = 0; t < 7; ++t) EXPECT_TRUE(s.tile_trusted(t)) << t;
    // The trusted tiles hold generation 1; the untrusted ones are refused.
    s.run(SwapPass::read_only, std::vector<size_t>{0, 1, 2, 3, 4, 5, 6}, [&](size_t t, std::span<std::byte> data) {
      for (size_t j = 0; j < data.size(); ++j) ASSERT_EQ(data[j], pattern(t, j, 1));
    });
    EXPECT_THROW(s.run(SwapPass::read_only, std::vector<size_t>{7}, [](size_t, std::span<std::byte>) {}), IoError);
  }
}

TEST_F(SwapperTest, ComputeErrorKeepsTheOldData) {
  auto engine = make_aio_engine(test_aio());
  Swapper s(*engine, *file_, tiles_, SwapperOptions{});
  initialize(s);
  EXPECT_THROW(s.run(SwapPass::read_write,
                     [](size_t t, std::span<std::byte> data) {
                       if (t == 4) throw std::runtime_error("compute failed");
                       for (size_t j = 0; j < data.size(); ++j) data[j] = pattern(t, j, 1);
                     }),
               std::runtime_error);
  for (size_t t = 0; t < tiles_.size(); ++t) EXPECT_TRUE(s.tile_trusted(t)) << t;
  s.run(SwapPass::read_only, [&](size_t t, std::span<std::byte> data) {
    uint32_t gen = t < 4 ? 1 : 0;
    for (size_t j = 0; j < data.size(); ++j) ASSERT_EQ(data[j], pattern(t, j, gen)) << t;
  });
}
