// The NVMe swap file: one preallocated file per rank per tier ("optimizer", "param") under nvme_path,
// zero3-swap-<tier>-rank<R>.bin, read and written with O_DIRECT at offsets from the partition layout.
//
// A swap file is scratch space for one run: whatever an earlier run left at the same path is removed before
// anything else (never read), and the destructor removes the file. Which parts of it hold complete data is
// known only to the process that wrote them (the Swapper's per-tile state), so nothing half-written in a
// crashed run can be mistaken for data by a later one.
//
// Preflight, before training starts, each failure a sentence naming the directory and the fix:
//   the directory exists and is a directory; it is not a memory file system (tmpfs/ramfs: O_DIRECT there is
//   refused or emulated through the page cache, and swapping to RAM defeats NVMe offload); a probe file can
//   be created in it (not read-only, permissions); O_DIRECT open, aligned write and read back work on it;
//   there is free space for the whole swap plus a margin; the staging buffers hold the largest tile.
// The final word on space is the preallocation itself (ranks sharing a disk may race for it): fallocate
// failing with ENOSPC is reported the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "io/aio_engine.hpp"

namespace zero3::offload {

struct SwapFileSpec {
  std::string dir;   // nvme_path (after ZERO3_SWAP_DIR)
  std::string tier;  // "optimizer", "param": letters, digits, '_' or '-'
  int rank = 0;
  uint64_t bytes = 0;       // size of the whole swap; rounded up to a multiple of 4096
  size_t largest_tile = 0;  // bytes of the largest tile streamed through the buffers (0: not checked)
  size_t buffer_bytes = 0;  // bytes of one staging buffer (0: not checked)
  // Config key(s) to name when the buffers are too small, e.g. "zero_optimization.offload_param.buffer_size".
  std::string buffer_key = "buffer_size";
};

// Free space demanded beyond the swap itself: 1% of it plus 64 MiB, for the file system's own metadata.
uint64_t swap_space_margin(uint64_t bytes);

// <dir>/zero3-swap-<tier>-rank<rank>.bin
std::string swap_file_path(const std::string& dir, const std::string& tier, int rank);

// Runs every preflight check without creating the swap file (a small probe file is created and removed).
// Throws IoError (directory, file system, space) or ConfigError (buffers, tier name).
void swap_preflight(const SwapFileSpec& spec);

class SwapFile {
 public:
  // Removes a stale file at the path, runs the preflight, creates and preallocates the file (fallocate) and
  // opens it with O_DIRECT. On any failure nothing is left at the path.
  explicit SwapFile(const SwapFileSpec& spec);
  // Closes and removes the file; a failure is logged, not thrown.
  ~SwapFile();
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  const io::IoFile& file() const { return file_; }
  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  const std::string& tier() const { return tier_; }
  int rank() const { return rank_; }

 private:
  std::string path_;
  std::string tier_;
  int rank_ = 0;
  uint64_t size_ = 0;
  io::IoFile file_;
};

}  // namespace zero3::offload
