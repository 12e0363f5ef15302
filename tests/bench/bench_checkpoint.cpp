// Checkpoint save and load throughput against the file system's own speed, measured in the same run on the same
// directory: every rank writes (then reads) a plain file of its shard's size with 64 MiB write()/pread() calls
// and fsync, as `dd bs=64M conv=fsync` would. Printed: MB/s of the bound, of the shard-writing phase of
// save_checkpoint, of the whole save (manifest, renames and latest included), and of load_checkpoint (which
// reads every byte twice: once for the CRC-32C, once into the slices), with their ratios to the bound. The
// files are evicted from the page cache (posix_fadvise DONTNEED after fsync) before every read, so reads come
// from the disk.
//
//   zero3 launch -n N -- bench_checkpoint [DIR=.] [MILLION_PARAMS=64] [UNITS=16] [STAGE=3] [ROUNDS=3]
//
// Each round writes a plain file (the bound), saves a new tag and loads it; the figures are medians over the
// rounds (a first, unprinted round sizes the plain files).
//
// The model is UNITS units of equal size; the state saved is 12 bytes per parameter (fp32 master, exp_avg,
// exp_avg_sq).
//
// The smallest run, in seconds (ctest label bench_smoke; tests/CMakeLists.txt reads these lines):
// zero3-bench-smoke: @DIR@ 1 4 3 1
// zero3-bench-smoke-ranks: 2
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_main.hpp"
#include "support/engine_world.hpp"
#include "checkpoint/crc32c.hpp"
#include "zero3/checkpoint.hpp"
#include "zero3/comm.hpp"
#include "zero3/config.hpp"
#include "zero3/device.hpp"
#include "zero3/engine.hpp"

using namespace zero3;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Longest time over the ranks.
double slowest(Communicator& comm, double seconds) {
  float t = static_cast<float>(seconds);
  comm.all_reduce(&t, 1, DType::f32, ReduceOp::max)->wait();
  return t;
}

// The median: a shared machine's disk is noisy, and the median of alternating rounds compares like with like.
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

double total(Communicator& comm, double value) {
  float v = static_cast<float>(value);
  comm.all_reduce(&v, 1, DType::f32, ReduceOp::sum)->wait();
  return v;
}

void evict(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void evict_tree(const fs::path& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) evict(e.path());
  }
}

// The bound: `bytes` written with 64 MiB write() calls and fsync'ed, then read back from disk.
std::pair<double, double> plain_file(const fs::path& path, size_t bytes, Communicator& comm) {
  constexpr size_t kBlock = size_t{64} << 20;
  std::vector<char> buf(std::min(kBlock, bytes), 'z');
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<char>(i * 2654435761u >> 13);
  comm.barrier();
  auto t0 = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (size_t off = 0; off < bytes; off += kBlock) {
    const size_t n = std::min(kBlock, bytes - off);
    if (::write(fd, buf.data(), n) != static_cast<ssize_t>(n)) std::perror("write");
  }
  ::fsync(fd);
  ::close(fd);
  const double write_s = slowest(comm, seconds_since(t0));
  evict(path);
  comm.barrier();
  t0 = Clock::now();
  const int rfd = ::open(path.c_str(), O_RDONLY);
  for (size_t off = 0; off < bytes; off += kBlock) {
    const size_t n = std::min(kBlock, bytes - off);
    if (::pread(rfd, buf.data(), n, static_cast<off_t>(off)) != static_cast<ssize_t>(n)) std::perror("read");
  }
  ::close(rfd);
  const double read_s = slowest(comm, seconds_since(t0));
  fs::remove(path);
  return {write_s, read_s};
}

}  // namespace

int bench_main(int argc, char** argv) {
  const fs::path dir = fs::absolute(argc > 1 ? argv[1] : ".") / "zero3-bench-ckpt";
  const int64_t params = (argc > 2 ? std::atoll(argv[2]) : 64) * 1'000'000;
  const int64_t units = argc > 3 ? std::atoll(argv[3]) : 16;
  const int stage = argc > 4 ? std::atoi(argv[4]) : 3;
  const int repeat = 1 + (argc > 5 ? std::atoi(argv[5]) : 3);  // + a first round that sizes the plain files

  std::shared_ptr<Communicator> comm = connect(testing::host_comm_options());
  auto device = make_cpu_device();
  Config c;
  c.zero.stage = stage;
  c.train_micro_batch_size_per_gpu = 1;  // resolve() needs a batch size
  c.optimizer.present = true;
  c.optimizer.type = OptimizerType::adamw;
  Engine engine(zero3::testing::resolved_for(c, *comm), comm, *device);
  for (int64_t u = 0; u < units; ++u) {
    engine.add_unit("layers." + std::to_string(u), {{"w", {params / units}, ParamInit::normal(0.02)}});
  }
  engine.materialize();
  // Moments that are not zero, so that no layer of the storage stack can shortcut them.
  std::mt19937 rng(static_cast<unsigned>(comm->rank()));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t u = 0; u < units; ++u) {
    const ShardView v = engine.local_shard(UnitId{static_cast<int32_t>(u)});
    for (int64_t i = 0; i < v.length; ++i) {
      v.exp_avg[i] = dist(rng);
      v.exp_avg_sq[i] = std::abs(dist(rng));
    }
  }
  if (comm->rank() == 0) fs::create_directories(dir);
  comm->barrier();
  // The checksum alone, over this rank's state in memory: the part of a save that is not I/O.
  double crc_s = 0, crc_bytes = 0;
  {
    const auto t0 = Clock::now();
    uint32_t crc = 0;
    for (int64_t u = 0; u < units; ++u) {
      const ShardView v = engine.local_shard(UnitId{static_cast<int32_t>(u)});
      for (const float* p : {v.master, v.exp_avg, v.exp_avg_sq}) {
        crc = ckpt::crc32c_update(crc, p, static_cast<size_t>(v.length) * sizeof(float));
        crc_bytes += static_cast<double>(v.length) * sizeof(float);
      }
    }
    crc_s = seconds_since(t0);
    if (crc == 0x12345678u) std::printf(" ");  // keep the loop
  }

  std::vector<double> bound_w, bound_r, shard_w, save_s, load_s;  // seconds per round
  double bytes = 0, rank_bytes = 0;
  for (int r = 0; r < repeat; ++r) {
    // The bound and the checkpoint alternate, so that both see the same state of a shared machine.
    const auto [w, rd] = plain_file(dir / ("plain-" + std::to_string(comm->rank()) + ".bin"),
                                    static_cast<size_t>(rank_bytes > 0 ? rank_bytes : 1), *comm);
    // A new tag each time, as a training run saves global_step100, global_step200, ...: replacing a tag would
    // add the deletion of the old copy to the save.
    const std::string tag = "bench" + std::to_string(r);
    const SavedCheckpoint saved = save_checkpoint(engine, dir, tag);
    rank_bytes = static_cast<double>(saved.rank_bytes);
    bytes = static_cast<double>(saved.bytes);
    const double sw = slowest(*comm, saved.rank_write_seconds), ss = slowest(*comm, saved.seconds);
    if (comm->rank() == 0) evict_tree(dir / tag);
    comm->barrier();
    const auto t0 = Clock::now();
    load_checkpoint(engine, dir, tag);
    const double ls = slowest(*comm, seconds_since(t0));
    if (comm->rank() == 0 && r > 0) fs::remove_all(dir / ("bench" + std::to_string(r - 1)));
    if (r == 0) continue;  // the first round sizes the plain files
    if (comm->rank() == 0) {
      std::printf("round %d: plain write %.3f s, read %.3f s; shards %.3f s, save %.3f s, load %.3f s\n", r, w, rd, sw,
                  ss, ls);
    }
    bound_w.push_back(w);
    bound_r.push_back(rd);
    shard_w.push_back(sw);
    save_s.push_back(ss);
    load_s.push_back(ls);
  }
  const double plain_total = total(*comm, rank_bytes);
  if (comm->rank() == 0) {
    const double mb = bytes / 1e6, plain_mb = plain_total / 1e6;
    const double bw = median(bound_w), br = median(bound_r), sw = median(shard_w), ss = median(save_s),
                 ls = median(load_s);
    std::printf("checkpoint of %lld parameters in %lld units, stage %d, %d ranks: %.1f MB (median of %d rounds)\n",
                static_cast<long long>(params), static_cast<long long>(units), stage, comm->size(), mb, repeat - 1);
    std::printf("  bound: plain files, 64 MiB writes + fsync   %8.1f MB/s write   %8.1f MB/s read\n", plain_mb / bw,
                plain_mb / br);
    std::printf("  CRC-32C alone, in memory (%s)        %8.1f MB/s\n",
                ckpt::crc32c_hardware() ? "hardware" : "software", crc_bytes / 1e6 / crc_s);
    std::printf("  save: shard files (write + CRC + fsync)     %8.1f MB/s   %.2f x bound\n", mb / sw, bw / sw);
    std::printf("  save: whole (agreement, manifest, renames)  %8.1f MB/s   %.2f x bound\n", mb / ss, bw / ss);
    std::printf("  load: verify CRC + read slices, from disk   %8.1f MB/s   %.2f x bound (reads each byte twice)\n",
                mb / ls, br / ls);
    // ZERO3_TEST_KEEP_DIRS keeps the last checkpoint (to try `zero3 ckpt` on it).
    if (std::getenv("ZERO3_TEST_KEEP_DIRS") == nullptr) fs::remove_all(dir);
  }
  comm->barrier();
  return 0;
}

int main(int argc, char** argv) { return zero3::testing::run_main(argc, argv, bench_main); }
