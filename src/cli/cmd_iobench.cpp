// `zero3 iobench`: sequential O_DIRECT write and read throughput of a directory through the same AIO engine
// the NVMe swapper uses (like DeepSpeed's ds_io). tests/bench/iobench_vs_fio.sh runs it beside fio.
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "io/aio_engine.hpp"
#include "io/aligned_buffer.hpp"
#include "zero3/error.hpp"

namespace zero3::cli {
namespace {

constexpr const char* kUsage =
    "usage: zero3 iobench --path DIR [--size BYTES] [--block-size BYTES] [--queue-depth N]\n"
    "                     [--engine io_uring|libaio|psync] [--mode read|write|both] [--threads N] [--loops N]\n"
    "                     [--buffer BYTES]\n"
    "\n"
    "Writes then reads one file of --size bytes (default 1G) in DIR sequentially with O_DIRECT, in\n"
    "--block-size pieces (default 1M) with --queue-depth pieces in flight (default 8) on each of --threads\n"
    "engine threads (aio.intra_op_parallelism, default 1), and prints GB/s (10^9 bytes/s), best and mean of\n"
    "--loops runs (default 3). The file is preallocated and written once, untimed, before the timed passes\n"
    "(the steady state of a swap file), and removed at the end.\n"
    "The transfers cycle through a buffer of --buffer bytes (default block-size x queue-depth x threads,\n"
    "the memory fio uses for the same job). Sizes accept K, M, G, T suffixes (powers of 1024). --engine\n"
    "defaults to the first usable one.\n";

// "4096", "64K", "1M", "2G", "1GiB"
std::optional<uint64_t> parse_bytes(const std::string& s) {
  size_t pos = 0;
  uint64_t v = 0;
  try {
    v = std::stoull(s, &pos);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  std::string suffix = s.substr(pos);
  if (suffix.size() > 1 && (suffix.ends_with("iB") || suffix.ends_with("B"))) {
    suffix = suffix.substr(0, suffix.ends_with("iB") ? suffix.size() - 2 : suffix.size() - 1);
  }
  int shift = 0;
  if (suffix.empty())
    shift = 0;
  else if (suffix == "K" || suffix == "k")
    shift = 10;
  else if (suffix == "M" || suffix == "m")
    shift = 20;
  else if (suffix == "G" || suffix == "g")
    shift = 30;
  else if (suffix == "T" || suffix == "t")
    shift = 40;
  else
    return std::nullopt;
  return v << shift;
}

struct Options {
  std::string path;
  uint64_t size = uint64_t{1} << 30;
  AioConfig aio;
  std::optional<io::AioEngineKind> engine;
  bool do_write = true, do_read = true;
  int loops = 3;
  uint64_t buffer = 0;  // bytes of the I/O buffer ring; 0: block_size x queue_depth x threads
};

using Clock = std::chrono::steady_clock;

// One pass over the whole file: every request queued at once (the engine keeps queue_depth pieces in flight
// per thread), then drained. The same buffer serves every request; its contents do not matter here.
double pass_seconds(io::AioEngine& engine, io::IoOp op, const io::IoFile& file, io::AlignedBuffer& buf, uint64_t size) {
  std::vector<io::IoTicket> tickets;
  auto t0 = Clock::now();
  for (uint64_t off = 0; off < size; off += buf.size()) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - off));
    tickets.push_back(engine.submit(op, file, buf.data(), n, off));
  }
  for (auto& t : tickets) engine.wait(t);
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Removes the benchmark file however the run ends.
struct FileRemover {
  std::string path;
  ~FileRemover() { ::unlink(path.c_str()); }
};

}  // namespace

int run_iobench(const Args& args) {
  Options o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
    if (i + 1 >= args.size()) {
      std::fprintf(stderr, "zero3 iobench: %s needs a value\n%s", a.c_str(), kUsage);
      return 2;
    }
    const std::string& val = args[++i];
    auto bytes = [&](const char* what) -> uint64_t {
      auto b = parse_bytes(val);
      if (!b || *b == 0) throw InvalidArgument(std::string(what) + " " + val + ": expected a positive size like 1M");
      return *b;
    };
    auto count = [&](const char* what) -> int64_t {
      auto b = parse_bytes(val);
      if (!b || *b == 0 || *b > 1'000'000)
        throw InvalidArgument(std::string(what) + " " + val + ": expected 1..1000000");
      return static_cast<int64_t>(*b);
    };
    if (a == "--path")
      o.path = val;
    else if (a == "--size")
      o.size = bytes("--size");
    else if (a == "--block-size")
      o.aio.block_size = static_cast<int64_t>(bytes("--block-size"));
    else if (a == "--queue-depth")
      o.aio.queue_depth = count("--queue-depth");
    else if (a == "--threads")
      o.aio.intra_op_parallelism = count("--threads");
    else if (a == "--loops")
      o.loops = static_cast<int>(count("--loops"));
    else if (a == "--engine") {
      o.engine = io::parse_aio_engine(val);
      if (!o.engine) throw InvalidArgument("--engine " + val + ": expected io_uring, libaio or psync");
    } else if (a == "--mode") {
      if (val != "read" && val != "write" && val != "both") {
        throw InvalidArgument("--mode " + val + ": expected read, write or both");
      }
      o.do_write = val != "read";  // a read-only run still has to write the file once, untimed
      o.do_read = val != "write";
    } else {
      std::fprintf(stderr, "zero3 iobench: unknown argument %s\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  if (o.path.empty()) {
    std::fprintf(stderr, "zero3 iobench: --path DIR is required\n%s", kUsage);
    return 2;
  }
  if (!std::filesystem::is_directory(o.path)) throw IoError("--path " + o.path + " is not a directory");
  struct statfs fs {};
  if (::statfs(o.path.c_str(), &fs) == 0 && (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC)) {
    std::printf("note: %s is a memory file system; O_DIRECT there is emulated, so this measures memory, not a disk\n",
                o.path.c_str());
  }
  uint64_t block = static_cast<uint64_t>(o.aio.block_size);
  o.size = (o.size + block - 1) / block * block;  // whole blocks, so every transfer is O_DIRECT-aligned

  auto engine = io::make_aio_engine(o.aio, o.engine);
  std::string file_path =
      (std::filesystem::path(o.path) / ("zero3-iobench-" + std::to_string(::getpid()) + ".bin")).string();
  FileRemover remover{file_path};
  io::IoFile file = io::IoFile::open(file_path, io::IoFile::Mode::read_write, /*direct=*/true, /*create=*/true);
  int rc = ::posix_fallocate(file.fd(), 0, static_cast<off_t>(o.size));
  if (rc != 0) {
    throw IoError("cannot preallocate " + std::to_string(o.size) + " bytes for " + file_path + ": " +
                  std::strerror(rc));
  }
  // The pieces in flight come from a ring of queue_depth x threads blocks, the memory fio uses for the same
  // job; each request covers the ring once. (The footprint matters on virtual disks, whose host copies the
  // data: a ring that fits in the CPU cache moves faster than one that does not.) --buffer overrides it.
  uint64_t ring = o.buffer != 0
                      ? o.buffer
                      : static_cast<uint64_t>(o.aio.block_size * o.aio.queue_depth * o.aio.intra_op_parallelism);
  ring = (ring + block - 1) / block * block;
  io::AlignedBuffer buf(static_cast<size_t>(std::min<uint64_t>(o.size, ring)));
  for (size_t i = 0; i < buf.size(); i += 4096) buf.data()[i] = static_cast<std::byte>(i >> 12);

  std::printf("iobench: %s, file %s, %llu bytes, block %lld, queue depth %lld, threads %lld, buffer %zu, O_DIRECT\n",
              std::string(engine->name()).c_str(), file_path.c_str(), static_cast<unsigned long long>(o.size),
              static_cast<long long>(o.aio.block_size), static_cast<long long>(o.aio.queue_depth),
              static_cast<long long>(o.aio.intra_op_parallelism), buf.size());
  auto report = [&](const char* what, io::IoOp op) {
    double best = 1e30, total = 0;
    for (int l = 0; l < o.loops; ++l) {
      double t = pass_seconds(*engine, op, file, buf, o.size);
      best = std::min(best, t);
      total += t;
    }
    double gbs_best = static_cast<double>(o.size) / best / 1e9;
    double gbs_mean = static_cast<double>(o.size) * o.loops / total / 1e9;
    std::printf("%-5s %.3f GB/s best, %.3f GB/s mean of %d (engine=%s block_size=%lld queue_depth=%lld)\n", what,
                gbs_best, gbs_mean, o.loops, std::string(engine->name()).c_str(),
                static_cast<long long>(o.aio.block_size), static_cast<long long>(o.aio.queue_depth));
  };
  // Untimed layout pass: the first write into preallocated (unwritten) extents also converts them, which
  // a swap file pays once; the timed passes measure the steady state of overwriting, as fio's loops do.
  pass_seconds(*engine, io::IoOp::write, file, buf, o.size);
  if (o.do_write) report("write", io::IoOp::write);
  if (o.do_read) report("read", io::IoOp::read);
  return 0;
}

}  // namespace zero3::cli
