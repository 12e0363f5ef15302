// The AIO engines (io_uring, libaio, psync) against real files: round trips at aligned and unaligned sizes,
// many requests in flight, and each failure as an IoError that names the file, offset, size and errno.
#include <gtest/gtest.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "io/aio_engine.hpp"
#include "io/aligned_buffer.hpp"
#include "zero3/build_config.hpp"
#include "zero3/error.hpp"

using namespace zero3;
using namespace zero3::io;
namespace fs = std::filesystem;

namespace {

// A fresh directory on a disk-backed file system: beside the build tree when the tests run from it (TMPDIR
// may be a tmpfs), else under the system temporary directory.
fs::path scratch_dir(const std::string& name) {
  const char* bin = std::getenv("ZERO3_BIN_DIR");
  fs::path base = bin ? fs::path(bin).parent_path() / "test-scratch" : fs::temp_directory_path();
  fs::path dir = base / (name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void fill_random(std::byte* p, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<std::byte>(rng());
}

AioConfig small_config() {
  AioConfig c;
  c.block_size = 64 * 1024;  // several pieces per request
  c.queue_depth = 4;         // fewer slots than pieces: exercises the refill path
  c.intra_op_parallelism = 2;
  return c;
}

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const IoError& e) {
    return e.what();
  }
  return "(no IoError)";
}

class AioEngineTest : public ::testing::TestWithParam<AioEngineKind> {
 protected:
  void SetUp() override {
    if (!aio_engine_compiled(GetParam())) GTEST_SKIP() << aio_engine_name(GetParam()) << " not compiled in";
    try {
      engine_ = make_aio_engine(small_config(), GetParam());
    } catch (const IoError& e) {
      GTEST_SKIP() << "the kernel refuses " << aio_engine_name(GetParam()) << ": " << e.what();
    }
    dir_ = scratch_dir(std::string("aio-") + std::string(aio_engine_name(GetParam())));
  }
  void TearDown() override {
    engine_.reset();
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::unique_ptr<AioEngine> engine_;
  fs::path dir_;
};

}  // namespace

TEST(AioEngineNames, ParseAndName) {
  EXPECT_EQ(parse_aio_engine("io_uring"), AioEngineKind::io_uring);
  EXPECT_EQ(parse_aio_engine("libaio"), AioEngineKind::libaio);
  EXPECT_EQ(parse_aio_engine("psync"), AioEngineKind::psync);
  EXPECT_FALSE(parse_aio_engine("posix").has_value());
  EXPECT_EQ(aio_engine_name(AioEngineKind::libaio), "libaio");
  EXPECT_TRUE(aio_engine_compiled(AioEngineKind::psync));
}

TEST(AioEngineConfig, OutOfRangeValuesNameTheKey) {
  AioConfig c;
  c.block_size = 1000;
  try {
    make_aio_engine(c);
    FAIL() << "block_size 1000 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("aio.block_size"), std::string::npos) << e.what();
  }
  c = AioConfig{};
  c.queue_depth = 0;
  EXPECT_THROW(make_aio_engine(c), ConfigError);
  c = AioConfig{};
  c.intra_op_parallelism = 0;
  EXPECT_THROW(make_aio_engine(c), ConfigError);
}

TEST(AioEngineSelection, DefaultIsTheFirstUsable) {
  auto usable = usable_aio_engines();
  ASSERT_FALSE(usable.empty());
  EXPECT_EQ(usable.back(), AioEngineKind::psync);
  auto engine = make_aio_engine(AioConfig{});
  EXPECT_EQ(engine->kind(), usable.front());
  std::printf("engines usable here:");
  for (auto k : usable) std::printf(" %s", std::string(aio_engine_name(k)).c_str());
  std::printf("\n");
}

// io_uring_setup refused by a seccomp filter (what Docker's default profile does on some versions): the
// default engine falls back to the next one, and asking for io_uring by name is an IoError that says why.
TEST(AioEngineSelection, FallsBackWhenSeccompRefusesIoUring) {
  if (!aio_engine_compiled(AioEngineKind::io_uring)) GTEST_SKIP() << "io_uring not compiled in";
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog prog{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) ::_exit(10);
    if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) ::_exit(11);
    try {
      make_aio_engine(AioConfig{}, AioEngineKind::io_uring);
      ::_exit(12);  // io_uring was made despite the filter
    } catch (const IoError& e) {
      if (std::string(e.what()).find("io_uring_queue_init") == std::string::npos) ::_exit(13);
    }
    auto engine = make_aio_engine(AioConfig{});
    ::_exit(engine->kind() == AioEngineKind::io_uring ? 14 : 0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10/11: seccomp setup failed, 12: io_uring made, 13: unclear error, "
                                       "14: no fallback";
}

TEST_P(AioEngineTest, DirectRoundTripAtUnalignedLogicalSizes) {
  IoFile file = IoFile::open((dir_ / "data.bin").string(), IoFile::Mode::read_write, /*direct=*/true, true);
  const size_t sizes[] = {1, 4095, 4097, 65536 * 3 + 5, (1u << 20) + 13, 3 * 4096 + 7};
  uint64_t offset = 0;
  std::vector<std::pair<uint64_t, size_t>> placed;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    size_t n = sizes[i];
    size_t padded = align_up(n, kDirectIoAlignment);
    AlignedBuffer out(padded);
    fill_random(out.data(), n, static_cast<uint32_t>(i));
    engine_->write(file, out.data(), padded, offset);
    placed.emplace_back(offset, n);
    offset += padded;
  }
  for (size_t i = 0; i < placed.size(); ++i) {
    auto [off, n] = placed[i];
    AlignedBuffer in(align_up(n, kDirectIoAlignment));
    engine_->read(file, in.data(), in.size(), off);
    std::vector<std::byte> want(n);
    fill_random(want.data(), n, static_cast<uint32_t>(i));
    ASSERT_EQ(std::memcmp(in.data(), want.data(), n), 0) << "size " << n;
  }
  AioStats s = engine_->stats();
  EXPECT_GT(s.pieces, placed.size());
  EXPECT_EQ(s.bytes_written, s.bytes_read);
}

TEST_P(AioEngineTest, BufferedFileAtOddOffsetsAndSizes) {
  IoFile file = IoFile::open((dir_ / "odd.bin").string(), IoFile::Mode::read_write, /*direct=*/false, true);
  std::vector<std::byte> out(200'001), in(200'001);
  fill_random(out.data(), out.size(), 99);
  engine_->write(file, out.data(), out.size(), 777);
  engine_->read(file, in.data(), in.size(), 777);
  EXPECT_EQ(std::memcmp(in.data(), out.data(), out.size()), 0);
}

TEST_P(AioEngineTest, ManyRequestsInFlight) {
  IoFile file = IoFile::open((dir_ / "many.bin").string(), IoFile::Mode::read_write, true, true);
  constexpr size_t kRequests = 24, kBytes = 256 * 1024;
  std::vector<AlignedBuffer> bufs;
  std::vector<IoTicket> tickets;
  for (size_t i = 0; i < kRequests; ++i) {
    bufs.emplace_back(kBytes);
    fill_random(bufs.back().data(), kBytes, static_cast<uint32_t>(1000 + i));
    tickets.push_back(engine_->submit_write(file, bufs.back().data(), kBytes, i * kBytes));
  }
  for (auto& t : tickets) engine_->wait(t);
  tickets.clear();
  for (auto& b : bufs) std::memset(b.data(), 0, kBytes);
  for (size_t i = kRequests; i-- > 0;)
    tickets.push_back(engine_->submit_read(file, bufs[i].data(), kBytes, i * kBytes));
  engine_->drain();
  for (auto& t : tickets) EXPECT_TRUE(engine_->ready(t));
  for (size_t i = 0; i < kRequests; ++i) {
    std::vector<std::byte> want(kBytes);
    fill_random(want.data(), kBytes, static_cast<uint32_t>(1000 + i));
    ASSERT_EQ(std::memcmp(bufs[i].data(), want.data(), kBytes), 0) << "request " << i;
  }
}

TEST_P(AioEngineTest, ReadPastTheEndNamesFileAndOffset) {
  std::string path = (dir_ / "short.bin").string();
  IoFile file = IoFile::open(path, IoFile::Mode::read_write, true, true);
  AlignedBuffer buf(3 * 65536);
  engine_->write(file, buf.data(), 65536, 0);
  std::string msg = what_of([&] { engine_->read(file, buf.data(), buf.size(), 0); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("read"), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset 65536"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ends"), std::string::npos) << msg;
}

TEST_P(AioEngineTest, KernelErrorsCarryErrnoText) {
  std::string path = (dir_ / "ro.bin").string();
  { IoFile::open(path, IoFile::Mode::read_write, false, true); }
  IoFile ro = IoFile::open(path, IoFile::Mode::read, false);
  std::vector<std::byte> buf(5000);
  std::string msg = what_of([&] { engine_->write(ro, buf.data(), buf.size(), 4096); });
  EXPECT_NE(msg.find(std::string(aio_engine_name(GetParam())) + " write of " + path), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset 4096, 5000 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::strerror(EBADF)), std::string::npos) << msg;
}

TEST_P(AioEngineTest, TicketsBelongToTheirEngine) {
  IoFile file = IoFile::open((dir_ / "owner.bin").string(), IoFile::Mode::read_write, false, true);
  std::vector<std::byte> buf(100);
  IoTicket t = engine_->submit_write(file, buf.data(), buf.size(), 0);
  auto other = make_aio_engine(small_config(), AioEngineKind::psync);
  EXPECT_THROW(other->wait(t), InvalidArgument);
  EXPECT_FALSE(other->ready(t));
  EXPECT_THROW(engine_->wait(IoTicket{}), InvalidArgument);
  engine_->wait(t);
  EXPECT_TRUE(engine_->ready(t));
}

TEST_P(AioEngineTest, MisalignedDirectTransferIsRejected) {
  IoFile file = IoFile::open((dir_ / "align.bin").string(), IoFile::Mode::read_write, true, true);
  AlignedBuffer buf(8192);
  EXPECT_THROW(engine_->submit_write(file, buf.data() + 512, 4096, 0), InvalidArgument);
  EXPECT_THROW(engine_->submit_write(file, buf.data(), 4096, 100), InvalidArgument);
  EXPECT_THROW(engine_->submit_write(file, buf.data(), 4000, 0), InvalidArgument);
}

// A full disk, by a file size limit: with SIGXFSZ ignored, writes beyond RLIMIT_FSIZE fail with EFBIG the
// way writes to a full disk fail with ENOSPC (a short write first, then the error), through the same path.
TEST_P(AioEngineTest, WriteBeyondTheSizeLimitFailsWithTheErrno) {
  std::string path = (dir_ / "limited.bin").string();
  IoFile file = IoFile::open(path, IoFile::Mode::read_write, true, true);
  AlignedBuffer buf(1 << 20);
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  rlimit lim = old;
  lim.rlim_cur = 256 * 1024;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  std::string msg = what_of([&] { engine_->write(file, buf.data(), buf.size(), 0); });
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::strerror(EFBIG)), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(Engines, AioEngineTest,
                         ::testing::Values(AioEngineKind::io_uring, AioEngineKind::libaio, AioEngineKind::psync),
                         [](const auto& info) { return std::string(aio_engine_name(info.param)); });
