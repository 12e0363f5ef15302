// `zero3 env`: what this build of zero3 carries and what this machine offers it, like DeepSpeed's ds_report.
// Every line is asked of the running system (the loaded libraries, the kernel, the CPU), never assumed, and
// the report ends with hints for what is missing. Always exits 0 unless the arguments are wrong.
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "cli/commands.hpp"
#include "comm/fabric/efa_decision.hpp"
#include "comm/fabric/fabric_probe.hpp"
#include "comm/fabric/net_plugin.hpp"
#include "core/env.hpp"
#include "device/cuda_report.hpp"
#include "zero3/build_config.hpp"
#include "zero3/version.hpp"

#if ZERO3_HAVE_NCCL
#include "comm/nccl/nccl_version.hpp"
#endif

extern char** environ;

namespace zero3::cli {
namespace {

void section(const char* title) { std::printf("\n[%s]\n", title); }

void row(const std::string& key, const std::string& value) { std::printf("  %-24s %s\n", key.c_str(), value.c_str()); }

std::string yes_no(bool b) { return b ? "yes" : "no"; }

std::string bytes_text(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

std::string build_flags() {
  std::string type = ZERO3_BUILD_TYPE;
  std::string per_type = type == "Debug"            ? ZERO3_CXX_FLAGS_DEBUG
                         : type == "Release"        ? ZERO3_CXX_FLAGS_RELEASE
                         : type == "RelWithDebInfo" ? ZERO3_CXX_FLAGS_RELWITHDEBINFO
                         : type == "MinSizeRel"     ? ZERO3_CXX_FLAGS_MINSIZEREL
                                                    : "";
  std::string flags = ZERO3_CXX_FLAGS;
  if (!per_type.empty()) flags += (flags.empty() ? "" : " ") + per_type;
  if (flags.empty()) flags = "(none)";
  return flags + " (plus the targets' -std=c++20 -fopenmp -fPIC and warnings)";
}

// ----- CPU -------------------------------------------------------------------------------------------

struct CpuFeatures {
  std::string model = "unknown";
  bool x86 = false;
  bool avx2 = false, fma = false, avx512f = false, avx512bw = false, avx512_bf16 = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;
};

CpuFeatures cpu_features() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  f.x86 = true;
  unsigned a, b, c, d;
  if (__get_cpuid(0x80000000, &a, &b, &c, &d) && a >= 0x80000004) {
    char brand[49] = {};
    for (unsigned leaf = 0; leaf < 3; ++leaf) {
      __get_cpuid(0x80000002 + leaf, &a, &b, &c, &d);
      std::memcpy(brand + 16 * leaf, &a, 4);
      std::memcpy(brand + 16 * leaf + 4, &b, 4);
      std::memcpy(brand + 16 * leaf + 8, &c, 4);
      std::memcpy(brand + 16 * leaf + 12, &d, 4);
    }
    std::string s = brand;
    s.erase(0, s.find_first_not_of(' '));
    f.model = s;
  }
  bool osxsave = false, avx = false;
  if (__get_cpuid(1, &a, &b, &c, &d)) {
    f.fma = c & (1u << 12);
    osxsave = c & (1u << 27);
    avx = c & (1u << 28);
  }
  // What the OS saves on a context switch (XCR0): a feature is usable only if its state is enabled.
  unsigned long long xcr0 = 0;
  if (osxsave) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<unsigned long long>(hi) << 32) | lo;
  }
  bool os_avx = (xcr0 & 0x6) == 0x6;
  bool os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;
  bool os_amx = (xcr0 & 0x60000) == 0x60000;
  f.fma = f.fma && os_avx;
  unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = avx && os_avx && (b & (1u << 5));
    f.avx512f = os_avx512 && (b & (1u << 16));
    f.avx512bw = os_avx512 && (b & (1u << 30));
    f.amx_bf16 = os_amx && (d & (1u << 22));
    f.amx_tile = os_amx && (d & (1u << 24));
    f.amx_int8 = os_amx && (d & (1u << 25));
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512_bf16 = os_avx512 && (a & (1u << 5));
  }
#else
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0 || line.rfind("Model", 0) == 0) {
      f.model = line.substr(line.find(':') + 2);
      break;
    }
  }
#endif
  return f;
}

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return static_cast<int>(std::thread::hardware_concurrency());
  return CPU_COUNT(&set);
}

// ----- memory ------------------------------------------------------------------------------------------

// /proc/meminfo fields in bytes (0 when absent).
double meminfo(const std::string& field) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      std::istringstream ss(line.substr(field.size() + 1));
      double v = 0;
      std::string unit;
      ss >> v >> unit;
      return unit == "kB" ? v * 1024.0 : v;
    }
  }
  return 0;
}

std::string memlock_text(bool* unlimited) {
  rlimit lim{};
  if (getrlimit(RLIMIT_MEMLOCK, &lim) != 0) return std::string("unknown (") + std::strerror(errno) + ")";
  *unlimited = lim.rlim_cur == RLIM_INFINITY;
  if (*unlimited) return "unlimited";
  return bytes_text(static_cast<double>(lim.rlim_cur));
}

double shm_bytes() {
  struct statvfs s {};
  if (statvfs("/dev/shm", &s) != 0) return -1;
  return static_cast<double>(s.f_blocks) * static_cast<double>(s.f_frsize);
}

// ----- async I/O -----------------------------------------------------------------------------------------

// Tries the kernel interface itself (what io_uring_queue_init and io_setup do first): a container's seccomp
// profile or an old kernel refuses it even when the library is installed.
std::string try_io_uring() {
#ifdef __NR_io_uring_setup
  unsigned char params[120] = {};  // struct io_uring_params, zeroed: the kernel picks the defaults
  long fd = syscall(__NR_io_uring_setup, 8, params);
  if (fd < 0) return std::string("unavailable: io_uring_setup failed: ") + std::strerror(errno);
  close(static_cast<int>(fd));
  return "usable (io_uring_setup succeeded)";
#else
  return "unavailable: no io_uring_setup system call on this platform";
#endif
}

std::string try_libaio() {
#ifdef __NR_io_setup
  unsigned long ctx = 0;
  if (syscall(__NR_io_setup, 8, &ctx) != 0) return std::string("unavailable: io_setup failed: ") + std::strerror(errno);
  syscall(__NR_io_destroy, ctx);
  return "usable (io_setup succeeded)";
#else
  return "unavailable: no io_setup system call on this platform";
#endif
}

// ----- the report --------------------------------------------------------------------------------------

int report() {
  std::vector<std::string> hints;
  std::printf("zero3 environment report\n");

  section("zero3");
  row("version", version());
  row("build type", ZERO3_BUILD_TYPE);
  row("compiler", ZERO3_CXX_COMPILER);
  row("compiler flags", build_flags());
  if (ZERO3_HAVE_CUDA) row("CUDA architectures", ZERO3_CUDA_ARCHITECTURES);

  section("backends");
  auto backend = [](const char* name, bool on) { row(name, on ? "compiled in" : "not compiled"); };
  backend("cuda", ZERO3_HAVE_CUDA);
  backend("nccl", ZERO3_HAVE_NCCL);
  backend("gloo", ZERO3_HAVE_GLOO);
  backend("libfabric", ZERO3_HAVE_LIBFABRIC);
  backend("io_uring", ZERO3_HAVE_URING);
  backend("libaio", ZERO3_HAVE_LIBAIO);
  backend("openblas", ZERO3_HAVE_BLAS);

  section("libraries");
  CudaReport cuda = query_cuda();
  if (cuda.compiled) {
    row("CUDA toolkit", cuda_version_string(cuda.toolkit_version) + " (compiled against)");
    row("CUDA runtime", cuda_version_string(cuda.runtime_version));
    row("CUDA driver", cuda.driver_version > 0 ? cuda_version_string(cuda.driver_version) : "none installed");
    row("cuBLAS", cuda.cublas_version.empty() ? "unknown" : cuda.cublas_version);
  } else {
    row("CUDA", "not compiled");
    hints.push_back("CUDA is not compiled in: install the CUDA toolkit and rebuild with -DZERO3_CUDA=ON to use GPUs");
  }
#if ZERO3_HAVE_NCCL
  try {
    row("NCCL", comm::nccl_runtime_version() + " (loaded), " + comm::nccl_build_version() + " (compiled against)");
  } catch (const std::exception& e) {
    row("NCCL", std::string("error: ") + e.what());
  }
#else
  row("NCCL", "not compiled");
  if (ZERO3_HAVE_CUDA) hints.push_back("NCCL was not found: install libnccl-dev (or set NCCL_HOME) and rebuild");
#endif
  if (ZERO3_HAVE_GLOO) {
    std::string v = ZERO3_GLOO_CMAKE_VERSION;
    row("Gloo",
        (v.empty() ? std::string("version unknown") : v) + " (the CMake package's version; the library exposes none)");
  } else {
    row("Gloo", "not compiled");
    hints.push_back("Gloo is not compiled in: install libgloo-dev and rebuild for multi-process CPU runs");
  }
  fabric::FabricProbe probe = fabric::probe_fabric();
  if (probe.compiled) {
    row("libfabric library", probe.version_string() + " (loaded), " + std::to_string(probe.build_major) + "." +
                                 std::to_string(probe.build_minor) + " (compiled against)");
  } else {
    row("libfabric library", "not compiled");
    hints.push_back("libfabric is not compiled in: install libfabric-dev and rebuild to have EFA probed");
  }
  row("io_uring kernel", std::string(ZERO3_HAVE_URING ? "compiled in, " : "not compiled, ") + try_io_uring());
  row("libaio kernel", std::string(ZERO3_HAVE_LIBAIO ? "compiled in, " : "not compiled, ") + try_libaio());
  utsname u{};
  if (uname(&u) == 0) row("kernel", std::string(u.sysname) + " " + u.release);
  if (!ZERO3_HAVE_URING && !ZERO3_HAVE_LIBAIO) {
    hints.push_back("no async I/O engine: install liburing-dev and libaio-dev and rebuild (NVMe offload uses psync)");
  } else if (ZERO3_HAVE_URING && try_io_uring().rfind("usable", 0) != 0) {
    hints.push_back("io_uring is compiled in but the kernel refuses it here (" + try_io_uring() +
                    "): NVMe offload falls back to libaio or psync");
  }
  if (!ZERO3_HAVE_BLAS) hints.push_back("install libopenblas-dev and rebuild for fast CPU GEMMs in the Llama example");

  section("devices");
  if (!cuda.compiled) {
    row("CUDA devices", "none (CUDA not compiled in)");
  } else if (!cuda.no_device.empty()) {
    row("CUDA devices", "no CUDA device: " + cuda.no_device);
  } else {
    row("CUDA devices", std::to_string(cuda.device_count));
    for (const auto& d : cuda.devices) {
      row("  cuda:" + std::to_string(d.index),
          d.name + ", compute capability " + std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor) + ", " +
              bytes_text(static_cast<double>(d.total_bytes)) + ", " + std::to_string(d.multiprocessors) + " SMs" +
              (d.pci_bus_id.empty() ? "" : ", PCI " + d.pci_bus_id));
    }
  }
  if (cuda.device_count == 0) hints.push_back("no GPU: CPU backend only (the cpu device, Gloo between processes)");

  section("network");
  if (probe.compiled) {
    row("providers", fabric::join_providers(probe.providers));
    if (!probe.error.empty()) row("probe error", probe.error);
    row("efa provider", probe.has_provider("efa") ? "present" : "absent");
    row(
        "EFA devices", probe.efa_devices == 0 ? "0" : std::to_string(probe.efa_devices) + " (" + [&] {
          std::string s;
          for (const auto& dmn : probe.efa_domains) s += (s.empty() ? "" : ", ") + dmn;
          return s;
        }() + ")");
    if (probe.efa_devices > 0) row("GPUDirect RDMA", yes_no(probe.efa_hmem) + " (efa provider with FI_HMEM)");
    if (!probe.fi_provider_env.empty()) row("FI_PROVIDER", probe.fi_provider_env);
  }
  fabric::NetPluginCheck plugin = fabric::check_net_plugin();
  if (plugin.disabled) {
    row("aws-ofi-nccl plugin", "disabled (NCCL_NET_PLUGIN=none)");
  } else if (plugin.loaded) {
    row("aws-ofi-nccl plugin", "'" + plugin.net_name + "' from " + plugin.path + " (net interface v" +
                                   std::to_string(plugin.interface_version) + ")" +
                                   (plugin.set_env.empty() ? ""
                                                           : "; NCCL needs NCCL_NET_PLUGIN=" + plugin.set_env +
                                                                 " to load it, which zero3 sets"));
  } else {
    std::string tried;
    for (const auto& f : plugin.failures) tried += (tried.empty() ? "" : "; ") + f;
    row("aws-ofi-nccl plugin", "not found (" + tried + ")");
  }
  if (!plugin.other.empty()) row("other net plugin", plugin.other);
  auto auto_choice = fabric::decide_network(fabric::NetworkMode::automatic, probe, plugin);
  auto efa_choice = fabric::decide_network(fabric::NetworkMode::efa, probe, plugin);
  row("zero3.network auto", auto_choice.message);
  row("zero3.network efa", efa_choice.error ? "would stop: " + efa_choice.message : "usable: " + efa_choice.message);
  if (probe.compiled && probe.efa_devices == 0) {
    hints.push_back(
        "no EFA device: NCCL between nodes would use TCP sockets (fine on one node; on EFA instances "
        "attach the EFA interface and use the EFA installer's libfabric)");
  } else if (probe.efa_devices > 0 && efa_choice.error) {
    hints.push_back("EFA devices are present but cannot be used; see 'zero3.network efa' above and docs/efa.md");
  }
  if (probe.compiled && !probe.version_at_least(fabric::kMinLibfabricMajor, fabric::kMinLibfabricMinor)) {
    hints.push_back("libfabric " + probe.version_string() +
                    " is older than 1.18, the minimum of aws-ofi-nccl: on EFA nodes put /opt/amazon/efa/lib first");
  }

  section("cpu");
  CpuFeatures cpu = cpu_features();
  row("model", cpu.model);
  row("cores", std::to_string(usable_cpus()) + " usable of " + std::to_string(std::thread::hardware_concurrency()));
  if (cpu.x86) {
    row("SIMD", "avx2=" + yes_no(cpu.avx2) + " fma=" + yes_no(cpu.fma) + " avx512f=" + yes_no(cpu.avx512f) +
                    " avx512bw=" + yes_no(cpu.avx512bw) + " avx512_bf16=" + yes_no(cpu.avx512_bf16) +
                    " amx=" + yes_no(cpu.amx_tile) + " (amx_bf16=" + yes_no(cpu.amx_bf16) +
                    " amx_int8=" + yes_no(cpu.amx_int8) + ")");
    if (!cpu.avx2) hints.push_back("no AVX2: the CPU optimizer runs its scalar path");
  } else {
    row("SIMD", "not an x86 CPU; the CPU optimizer runs its scalar path");
  }

  section("memory");
  row("total", bytes_text(meminfo("MemTotal")));
  row("available", bytes_text(meminfo("MemAvailable")));
  bool unlimited = false;
  std::string memlock = memlock_text(&unlimited);
  row("memlock limit", memlock);
  if (!unlimited) {
    hints.push_back("memlock limit is " + memlock +
                    ": EFA and pinned host memory want it unlimited (ulimit -l unlimited; in Kubernetes the "
                    "container runtime's default)");
  }
  double shm = shm_bytes();
  row("/dev/shm", shm < 0 ? "absent" : bytes_text(shm));
  if (shm >= 0 && shm < 1024.0 * 1024 * 1024) {
    hints.push_back("/dev/shm is " + bytes_text(shm) +
                    ": NCCL's shared-memory transport needs more; in Kubernetes mount an emptyDir with medium "
                    "Memory at /dev/shm (the seed's job uses 64Gi)");
  }
  double huge_total = meminfo("HugePages_Total");  // a count, not bytes (no unit)
  row("hugepages", std::to_string(static_cast<long long>(huge_total)) + " x " + bytes_text(meminfo("Hugepagesize")));

  section("environment");
  for (const auto& k : env::all_knobs()) {
    std::string value = k.current.empty() ? std::string("(unset, default ") + k.default_value + ")" : k.current;
    row(k.name, value + "  - " + k.doc);
  }
  std::vector<std::string> related;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    if (kv.rfind("NCCL_", 0) == 0 || kv.rfind("FI_", 0) == 0 || kv.rfind("CUDA_VISIBLE_DEVICES=", 0) == 0 ||
        kv.rfind("OMP_NUM_THREADS=", 0) == 0) {
      related.push_back(kv);
    }
  }
  row("NCCL_*, FI_*, CUDA_*", related.empty() ? "(none set)" : "");
  for (const auto& kv : related) row("", kv);

  section("hints");
  if (hints.empty()) {
    std::printf("  nothing is missing\n");
  } else {
    for (const auto& h : hints) std::printf("  - %s\n", h.c_str());
  }
  return 0;
}

}  // namespace

int run_env(const Args& args) {
  for (const auto& a : args) {
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: zero3 env\n\nReports zero3's version and build, the backends compiled in and the library "
          "versions\nloaded, the CUDA devices, libfabric and EFA, the CPU's SIMD features, memory limits,\nthe "
          "ZERO3_* environment variables, and hints for what is missing.\n");
      return 0;
    }
    std::fprintf(stderr, "zero3 env: unexpected argument '%s' (zero3 env takes none)\n", a.c_str());
    return 2;
  }
  return report();
}

}  // namespace zero3::cli
