// Streams tiles of a swap file through a fixed pool of aligned staging buffers: read a tile, hand it to a
// compute callback, write it back, with the read of the next tiles and the write of the previous ones in
// flight while the callback runs (DeepSpeed's pipeline_read / pipeline_write).
//
// Buffers: buffer_count buffers of buffer_bytes each, allocated once. One is being computed on, up to
// buffer_count - 1 - (pipeline_write ? 1 : 0) are being read ahead, the rest are being written back; a new
// read waits for the oldest write. Minimum: 1 + pipeline_read + pipeline_write (a ConfigError below it).
//
// Trust: a tile holds data only after a write of it completed without error in this process; a write in
// flight or failed, or a tile never written, makes it untrusted, and a pass that would read an untrusted
// tile is an IoError before any I/O starts. Padding after a tile's logical bytes (to 4096) is written as
// zeros.
//
// Threads: one pass at a time per Swapper, on the calling thread; the callback runs on that thread. The
// engine's threads do the I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "io/aio_engine.hpp"
#include "io/aligned_buffer.hpp"
#include "offload/swap_file.hpp"

namespace zero3::offload {

// A tile: `bytes` logical bytes at `offset` (a multiple of 4096) in the swap file; it occupies
// align_up(bytes, 4096) bytes there.
struct SwapTile {
  uint64_t offset = 0;
  size_t bytes = 0;
};

// Places tiles of the given logical sizes one after another from `base` (4096-aligned), each padded to
// 4096. The swap file needs swap_tiles_end(tiles) bytes.
std::vector<SwapTile> pack_swap_tiles(std::span<const size_t> tile_bytes, uint64_t base = 0);
uint64_t swap_tiles_end(std::span<const SwapTile> tiles);

struct SwapperOptions {
  size_t buffer_count = 4;  // offload_*.buffer_count
  size_t buffer_bytes = 0;  // bytes per buffer; 0: the largest tile, padded
  bool pipeline_read = true;
  bool pipeline_write = true;
  std::string config_key = "buffer_count";  // named in errors, e.g. "zero_optimization.offload_optimizer"
};

enum class SwapPass {
  read_write,  // read, compute, write back (the optimizer step)
  read_only,   // read, compute (fetching parameters; nothing is written)
  write_only,  // compute fills the buffer, write (initial contents)
};

struct SwapperStats {
  uint64_t bytes_read = 0;     // padded bytes
  uint64_t bytes_written = 0;  // padded bytes
  uint64_t reads_ahead = 0;    // reads issued before the previous tile's compute began
  double io_wait_seconds = 0;  // time the calling thread spent blocked on I/O
  double compute_seconds = 0;  // time in the callback
};

// The callback: tile index and its logical bytes in a staging buffer (read from disk, or for write_only
// stale contents to be overwritten). It may modify them; in read_write and write_only passes they are
// written back after it returns. An exception from it ends the pass (after in-flight I/O completes) and
// propagates; the tile it was computing keeps its previous on-disk contents and trust.
using SwapCompute = std::function<void(size_t tile, std::span<std::byte> data)>;

class Swapper {
 public:
  // Checks the tiles (aligned, inside the file, not overlapping: InvalidArgument) and the options
  // (ConfigError), allocates the buffers. The engine and the file must outlive the Swapper.
  Swapper(io::AioEngine& engine, const SwapFile& file, std::vector<SwapTile> tiles, SwapperOptions options);
  ~Swapper();
  Swapper(const Swapper&) = delete;
  Swapper& operator=(const Swapper&) = delete;

  // One pass over `order` (tile indices, each at most once), or over every tile in index order.
  void run(SwapPass pass, std::span<const size_t> order, const SwapCompute& compute);
  void run(SwapPass pass, const SwapCompute& compute);

  // Blocking single-tile transfers between a caller's memory and the file (through a staging buffer).
  void write_tile(size_t tile, std::span<const std::byte> data);
  void read_tile(size_t tile, std::span<std::byte> data);

  size_t tile_count() const { return tiles_.size(); }
  const SwapTile& tile(size_t i) const { return tiles_.at(i); }
  bool tile_trusted(size_t i) const { return trusted_.at(i); }
  size_t buffer_count() const { return slots_.size(); }
  size_t buffer_bytes() const { return buffer_bytes_; }
  const SwapperOptions& options() const { return options_; }
  const SwapperStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  struct Slot {
    enum class State { free, reading, writing } state = State::free;
    io::AlignedBuffer buffer;
    size_t tile = 0;
    io::IoTicket ticket;
    uint64_t write_seq = 0;  // order of writes, to reclaim the oldest first
  };

  Slot* acquire_slot();
  void finish_write(Slot& slot);
  void settle_all() noexcept;
  void wait_timed(const io::IoTicket& ticket);

  io::AioEngine& engine_;
  const SwapFile& file_;
  std::vector<SwapTile> tiles_;
  std::vector<bool> trusted_;
  SwapperOptions options_;
  size_t buffer_bytes_ = 0;
  std::vector<Slot> slots_;
  uint64_t write_seq_ = 0;
  SwapperStats stats_;
};

}  // namespace zero3::offload
