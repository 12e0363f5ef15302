// `zero3 env` tells the truth about this machine. The program (ZERO3_BIN_DIR/zero3) is run as a user runs
// it, and each line is checked against a source that does not go through zero3: the build's own
// configuration, /proc/cpuinfo, the device nodes of the NVIDIA driver, the kernel's RDMA devices, the kernel's
// answer to io_uring_setup and io_setup, getrlimit, and the libfabric.so.1 the dynamic linker finds.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "zero3/build_config.hpp"
#include "zero3/version.hpp"

namespace fs = std::filesystem;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

struct EnvRun {
  int status = -1;
  std::string out;
};

EnvRun run_env(const std::string& env_prefix = "", const std::string& args = "") {
  const char* bin = std::getenv("ZERO3_BIN_DIR");
  EnvRun r;
  if (!bin) return r;
  std::string cmd = env_prefix + " '" + std::string(bin) + "/zero3' env " + args + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) r.out.append(buf, n);
  int st = pclose(f);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// The value printed after `key` on its line ("  key   value").
std::string value_of(const std::string& out, const std::string& key) {
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    size_t start = line.find_first_not_of(' ');
    if (start == std::string::npos || line.compare(start, key.size(), key) != 0) continue;
    size_t v = line.find_first_not_of(' ', start + key.size());
    if (v != std::string::npos && v > start + key.size()) return line.substr(v);
  }
  return "<no line '" + key + "'>";
}

std::set<std::string> cpuinfo_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  std::set<std::string> flags;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream ss(line.substr(line.find(':') + 1));
    std::string f;
    while (ss >> f) flags.insert(f);
    break;
  }
  return flags;
}

class EnvCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::getenv("ZERO3_BIN_DIR")) GTEST_SKIP() << "ZERO3_BIN_DIR is not set (run through ctest)";
    run_ = run_env();
    ASSERT_EQ(run_.status, 0) << run_.out;
  }
  EnvRun run_;
};

}  // namespace

TEST_F(EnvCommand, VersionAndBuild) {
  EXPECT_EQ(value_of(run_.out, "version"), zero3::version());
  EXPECT_EQ(value_of(run_.out, "build type"), ZERO3_BUILD_TYPE);
  EXPECT_TRUE(contains(value_of(run_.out, "compiler"), ZERO3_CXX_COMPILER)) << run_.out;
  EXPECT_TRUE(contains(run_.out, "compiler flags")) << run_.out;
}

TEST_F(EnvCommand, BackendsAreTheBuildsOwn) {
  auto expect = [&](const char* name, bool on) {
    EXPECT_EQ(value_of(run_.out, name), on ? "compiled in" : "not compiled") << name;
  };
  expect("cuda", ZERO3_HAVE_CUDA);
  expect("nccl", ZERO3_HAVE_NCCL);
  expect("gloo", ZERO3_HAVE_GLOO);
  expect("libfabric", ZERO3_HAVE_LIBFABRIC);
  expect("io_uring", ZERO3_HAVE_URING);
  expect("libaio", ZERO3_HAVE_LIBAIO);
  expect("openblas", ZERO3_HAVE_BLAS);
}

TEST_F(EnvCommand, CudaDevicesAsTheDriverShowsThem) {
  if (!ZERO3_HAVE_CUDA) {
    EXPECT_EQ(value_of(run_.out, "CUDA devices"), "none (CUDA not compiled in)");
    EXPECT_TRUE(contains(run_.out, "CUDA is not compiled in")) << run_.out;
    return;
  }
  EXPECT_TRUE(contains(value_of(run_.out, "CUDA toolkit"), "(compiled against)")) << run_.out;
  EXPECT_NE(value_of(run_.out, "cuBLAS"), "unknown");
  if (!fs::exists("/dev/nvidiactl")) {
    // No NVIDIA driver: CUDA's own message, and the CPU-only hint.
    EXPECT_TRUE(contains(value_of(run_.out, "CUDA devices"), "no CUDA device: ")) << run_.out;
    EXPECT_GT(value_of(run_.out, "CUDA devices").size(), std::string("no CUDA device: ").size());
    EXPECT_EQ(value_of(run_.out, "CUDA driver"), "none installed");
    EXPECT_TRUE(contains(run_.out, "no GPU: CPU backend only")) << run_.out;
  } else {
    int nodes = 0;
    for (const auto& e : fs::directory_iterator("/dev")) {
      std::string n = e.path().filename().string();
      if (n.rfind("nvidia", 0) == 0 && n.size() > 6 && std::isdigit(static_cast<unsigned char>(n[6]))) ++nodes;
    }
    std::string v = value_of(run_.out, "CUDA devices");
    if (!contains(v, "no CUDA device") && !std::getenv("CUDA_VISIBLE_DEVICES")) {
      EXPECT_EQ(v, std::to_string(nodes)) << run_.out;
    }
  }
}

TEST_F(EnvCommand, NcclVersionIsReported) {
  if (!ZERO3_HAVE_NCCL) {
    EXPECT_EQ(value_of(run_.out, "NCCL"), "not compiled");
    return;
  }
  auto v = value_of(run_.out, "NCCL");
  EXPECT_TRUE(contains(v, " (loaded), ")) << v;
  EXPECT_TRUE(contains(v, "(compiled against)")) << v;
}

TEST_F(EnvCommand, LibfabricAndEfaAsTheSystemShowsThem) {
  if (!ZERO3_HAVE_LIBFABRIC) {
    EXPECT_EQ(value_of(run_.out, "libfabric library"), "not compiled");
    EXPECT_TRUE(contains(run_.out, "install libfabric-dev")) << run_.out;
    return;
  }
  void* lib = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  auto fi_version_fn = reinterpret_cast<uint32_t (*)()>(dlsym(lib, "fi_version"));
  ASSERT_NE(fi_version_fn, nullptr);
  uint32_t v = fi_version_fn();
  dlclose(lib);
  std::string want = std::to_string(v >> 16) + "." + std::to_string(v & 0xffff) + " (loaded)";
  EXPECT_TRUE(contains(value_of(run_.out, "libfabric library"), want)) << run_.out;
  EXPECT_NE(value_of(run_.out, "providers"), "none") << "libfabric always has tcp/udp/shm";

  int kernel_efa = 0;
  std::error_code ec;
  for (const auto& dev : fs::directory_iterator("/sys/class/infiniband", ec)) {
    std::error_code ec2;
    if (fs::read_symlink(dev.path() / "device" / "driver", ec2).filename() == "efa") ++kernel_efa;
  }
  if (kernel_efa == 0) {
    EXPECT_EQ(value_of(run_.out, "efa provider"), "absent");
    EXPECT_EQ(value_of(run_.out, "EFA devices"), "0");
    EXPECT_TRUE(contains(value_of(run_.out, "zero3.network auto"), "no EFA device")) << run_.out;
    EXPECT_TRUE(contains(value_of(run_.out, "zero3.network efa"), "would stop: ")) << run_.out;
    EXPECT_TRUE(contains(run_.out, "2441 s over EFA and 5409 s over TCP")) << run_.out;
  } else {
    EXPECT_EQ(value_of(run_.out, "efa provider"), "present");
    EXPECT_TRUE(contains(value_of(run_.out, "EFA devices"), std::to_string(kernel_efa) + " (")) << run_.out;
  }
  EXPECT_TRUE(contains(run_.out, "aws-ofi-nccl plugin")) << run_.out;
}

TEST_F(EnvCommand, SimdFeaturesMatchProcCpuinfo) {
  auto flags = cpuinfo_flags();
  if (flags.empty()) GTEST_SKIP() << "no flags line in /proc/cpuinfo (not x86)";
  std::string simd = value_of(run_.out, "SIMD");
  for (const char* f : {"avx2", "fma", "avx512f", "avx512bw", "avx512_bf16"}) {
    std::string want = std::string(f) + "=" + (flags.count(f) ? "yes" : "no");
    EXPECT_TRUE(contains(simd, want)) << "want " << want << " in: " << simd;
  }
  std::string amx = std::string("amx=") + (flags.count("amx_tile") ? "yes" : "no");
  EXPECT_TRUE(contains(simd, amx)) << "want " << amx << " in: " << simd;
  EXPECT_NE(value_of(run_.out, "model"), "unknown");
}

TEST_F(EnvCommand, AsyncIoAsTheKernelAnswers) {
  unsigned char params[120] = {};
  long fd = syscall(__NR_io_uring_setup, 8, params);
  bool uring = fd >= 0;
  if (uring) close(static_cast<int>(fd));
  EXPECT_TRUE(contains(value_of(run_.out, "io_uring kernel"), uring ? "usable" : "unavailable")) << run_.out;
  unsigned long ctx = 0;
  bool aio = syscall(__NR_io_setup, 8, &ctx) == 0;
  if (aio) syscall(__NR_io_destroy, ctx);
  EXPECT_TRUE(contains(value_of(run_.out, "libaio kernel"), aio ? "usable" : "unavailable")) << run_.out;
}

TEST_F(EnvCommand, MemlockLimit) {
  rlimit lim{};
  ASSERT_EQ(getrlimit(RLIMIT_MEMLOCK, &lim), 0);
  std::string v = value_of(run_.out, "memlock limit");
  if (lim.rlim_cur == RLIM_INFINITY) {
    EXPECT_EQ(v, "unlimited");
    EXPECT_FALSE(contains(run_.out, "memlock limit is ")) << "no hint when unlimited";
  } else {
    EXPECT_NE(v, "unlimited");
    EXPECT_TRUE(contains(run_.out, "memlock limit is " + v)) << "the hint names the limit";
  }
}

TEST_F(EnvCommand, EveryKnobIsListedWithItsValue) {
  for (const char* knob :
       {"ZERO3_LOG_LEVEL", "ZERO3_STORE_PORT_OFFSET", "ZERO3_STORE_PORT", "ZERO3_COMM_TIMEOUT_S", "ZERO3_SWAP_DIR"}) {
    EXPECT_TRUE(contains(run_.out, knob)) << knob;
  }
  EnvRun with = run_env("ZERO3_SWAP_DIR=/tmp/zero3-env-test NCCL_DEBUG=WARN");
  ASSERT_EQ(with.status, 0) << with.out;
  EXPECT_TRUE(contains(value_of(with.out, "ZERO3_SWAP_DIR"), "/tmp/zero3-env-test")) << with.out;
  EXPECT_TRUE(contains(with.out, "NCCL_DEBUG=WARN")) << with.out;
  EXPECT_TRUE(contains(run_.out, "[hints]")) << run_.out;
}

TEST_F(EnvCommand, RejectsArguments) {
  EnvRun bad = run_env("", "--bogus");
  EXPECT_EQ(bad.status, 2);
  EXPECT_TRUE(contains(bad.out, "unexpected argument '--bogus'")) << bad.out;
  EnvRun help = run_env("", "--help");
  EXPECT_EQ(help.status, 0);
  EXPECT_TRUE(contains(help.out, "usage: zero3 env")) << help.out;
}
