// The swap file and its preflight: created and preallocated at the documented path, removed at the end and
// when stale; each unusable directory (missing, not a directory, read-only, tmpfs, too small, size limit) a
// clear error before anything is written, with nothing left behind.
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "io/aligned_buffer.hpp"
#include "offload/swap_file.hpp"
#include "zero3/error.hpp"

using namespace zero3;
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

template <typename E>
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("(other error) ") + e.what();
  }
  return "(no error)";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

size_t entries(const fs::path& dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

class SwapFileTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = scratch_dir("swapfile"); }
  void TearDown() override {
    fs::permissions(dir_, fs::perms::owner_all);
    fs::remove_all(dir_);
  }
  SwapFileSpec spec(uint64_t bytes) const {
    SwapFileSpec s;
    s.dir = dir_.string();
    s.tier = "optimizer";
    s.rank = 3;
    s.bytes = bytes;
    return s;
  }
  fs::path dir_;
};

}  // namespace

TEST_F(SwapFileTest, CreatesPreallocatesAndRemoves) {
  std::string path = swap_file_path(dir_.string(), "optimizer", 3);
  EXPECT_EQ(path, (dir_ / "zero3-swap-optimizer-rank3.bin").string());
  {
    SwapFile f(spec(10'000'000));
    EXPECT_EQ(f.path(), path);
    EXPECT_EQ(f.size(), io::align_up(10'000'000, 4096));
    EXPECT_TRUE(f.file().direct());
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), f.size());
    EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, f.size()) << "not preallocated";
    EXPECT_EQ(entries(dir_), 1u) << "the preflight probe file was left behind";
  }
  EXPECT_FALSE(fs::exists(path)) << "the destructor did not remove the swap file";
}

TEST_F(SwapFileTest, StaleFileOfAnEarlierRunIsReplaced) {
  std::string path = swap_file_path(dir_.string(), "param", 0);
  {
    std::ofstream stale(path, std::ios::binary);
    stale << std::string(12345, 'x');
  }
  SwapFileSpec s = spec(1 << 20);
  s.tier = "param";
  s.rank = 0;
  SwapFile f(s);
  EXPECT_EQ(fs::file_size(path), 1u << 20);
  io::AlignedBuffer buf(4096);
  ASSERT_EQ(::pread(f.file().fd(), buf.data(), 4096, 0), 4096);
  for (size_t i = 0; i < 4096; ++i) ASSERT_EQ(buf.data()[i], std::byte{0}) << "stale bytes read back at " << i;
}

TEST_F(SwapFileTest, MissingDirectory) {
  SwapFileSpec s = spec(1 << 20);
  s.dir = (dir_ / "no" / "such").string();
  std::string msg = error_of<IoError>([&] { SwapFile f(s); });
  EXPECT_TRUE(contains(msg, s.dir)) << msg;
  EXPECT_TRUE(contains(msg, "does not exist")) << msg;
}

TEST_F(SwapFileTest, NotADirectory) {
  SwapFileSpec s = spec(1 << 20);
  s.dir = (dir_ / "plain").string();
  std::ofstream(s.dir) << "x";
  std::string msg = error_of<IoError>([&] { SwapFile f(s); });
  EXPECT_TRUE(contains(msg, "is not a directory")) << msg;
}

// Permission bits do not stop root, so as root the check runs with the effective uid of "nobody". "nobody" must
// be able to reach the directory: a checkout under a private (0700) directory would make the failure "cannot be
// reached" instead of "not writable", so as root the directory lives in the system's temporary directory.
TEST_F(SwapFileTest, ReadOnlyDirectory) {
  bool root = ::geteuid() == 0;
  fs::path ro = (root ? fs::temp_directory_path() : dir_) / ("zero3-swaptest-readonly-" + std::to_string(::getpid()));
  fs::remove_all(ro);
  fs::create_directory(ro);
  struct RemoveAtEnd {
    fs::path dir;
    ~RemoveAtEnd() {
      std::error_code ignored;
      fs::permissions(dir, fs::perms::owner_all, ignored);
      fs::remove_all(dir, ignored);
    }
  } remove_at_end{ro};
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read | fs::perms::group_exec |
                          fs::perms::others_read | fs::perms::others_exec);
  SwapFileSpec s = spec(1 << 20);
  s.dir = ro.string();
  if (root) {
    ASSERT_EQ(::seteuid(65534), 0);
  }
  std::string msg = error_of<IoError>([&] { SwapFile f(s); });
  if (root) {
    ASSERT_EQ(::seteuid(0), 0);
  }
  EXPECT_TRUE(contains(msg, "is not writable")) << msg;
  EXPECT_TRUE(contains(msg, ro.string())) << msg;
  EXPECT_EQ(entries(ro), 0u);
}

TEST_F(SwapFileTest, MemoryFileSystemIsRefused) {
  struct statfs fs_info {};
  if (::statfs("/dev/shm", &fs_info) != 0 || fs_info.f_type != TMPFS_MAGIC) GTEST_SKIP() << "no tmpfs at /dev/shm";
  fs::path shm = fs::path("/dev/shm") / ("zero3-swaptest-" + std::to_string(::getpid()));
  fs::create_directories(shm);
  SwapFileSpec s = spec(1 << 20);
  s.dir = shm.string();
  std::string msg = error_of<IoError>([&] { SwapFile f(s); });
  size_t left = entries(shm);
  fs::remove_all(shm);
  EXPECT_TRUE(contains(msg, "tmpfs")) << msg;
  EXPECT_TRUE(contains(msg, "O_DIRECT")) << msg;
  EXPECT_EQ(left, 0u);
}

TEST_F(SwapFileTest, NotEnoughFreeSpace) {
  SwapFileSpec s = spec(uint64_t{1} << 52);  // 4 PiB
  std::string msg = error_of<IoError>([&] { SwapFile f(s); });
  EXPECT_TRUE(contains(msg, "free")) << msg;
  EXPECT_TRUE(contains(msg, "needs 4503599627370496 bytes")) << msg;
  EXPECT_TRUE(contains(msg, "rank 3")) << msg;
  EXPECT_EQ(entries(dir_), 0u);
}

// Preallocation refused by the kernel (a full disk behaves the same with ENOSPC): the file size limit makes
// fallocate fail with EFBIG once the swap is larger than it.
TEST_F(SwapFileTest, PreallocationFailureLeavesNothing) {
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  rlimit lim = old;
  lim.rlim_cur = 1 << 20;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  std::string msg = error_of<IoError>([&] { SwapFile f(spec(8 << 20)); });
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_TRUE(contains(msg, "cannot preallocate")) << msg;
  EXPECT_TRUE(contains(msg, std::strerror(EFBIG))) << msg;
  EXPECT_EQ(entries(dir_), 0u);
}

TEST_F(SwapFileTest, BuffersSmallerThanTheLargestTile) {
  SwapFileSpec s = spec(1 << 20);
  s.largest_tile = 100'000;
  s.buffer_bytes = 65536;
  s.buffer_key = "zero_optimization.offload_param.buffer_size";
  std::string msg = error_of<ConfigError>([&] { swap_preflight(s); });
  EXPECT_TRUE(contains(msg, "zero_optimization.offload_param.buffer_size")) << msg;
  EXPECT_TRUE(contains(msg, "100000")) << msg;
  s.buffer_bytes = 102400;  // 100000 padded to 4096
  EXPECT_NO_THROW(swap_preflight(s));
  EXPECT_EQ(entries(dir_), 0u);
}

TEST_F(SwapFileTest, BadTierName) {
  SwapFileSpec s = spec(1 << 20);
  s.tier = "../x";
  EXPECT_THROW(swap_preflight(s), ConfigError);
}
