// NVMe parameter offload (offload_param.device = nvme, stage 3, 16-bit compute): this rank's compute-dtype
// parameter slice of every unit lives in one swap file per rank (tier "param"), one tile per unit (its slice,
// padded to 4096 bytes), and is read back only to feed the unit's all-gather.
//
// Writes are blocking (they go through one staging buffer of the Swapper, which records which tiles hold
// complete data). Reads are asynchronous, straight into a caller's aligned buffer: ParamPrefetcher starts them
// ahead of the all-gathers along the schedule. A read of a tile whose last write failed, or that was never
// written, is refused before any I/O.
//
// Threads: used from the engine's training thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/aio_engine.hpp"
#include "offload/swap_file.hpp"
#include "offload/swapper.hpp"
#include "zero3/config.hpp"

namespace zero3::detail {

class ParamSwap {
 public:
  // slice_bytes: each unit's slice in bytes, of elements of `elem_bytes` bytes. Preflight before the swap file
  // exists: ConfigError naming offload_param.buffer_count (below 1) or buffer_size (its elements cannot hold the
  // largest slice), IoError/ConfigError naming nvme_path (swap_file.hpp). Then creates the file.
  ParamSwap(const Config& config, int rank, std::span<const size_t> slice_bytes, size_t elem_bytes);

  // Blocking: the unit's slice (exactly its slice bytes) to the file; on return it is on disk.
  void write(size_t unit, const void* data);

  // Starts reading the unit's padded tile into `buffer` (4096-aligned, at least padded_bytes(unit) bytes), which
  // must stay untouched until wait() on the ticket returns. IoError at once when the tile holds no complete data.
  io::IoTicket start_read(size_t unit, std::byte* buffer);
  // Blocks until the read is complete; throws its IoError (backend, file, offset, size, errno).
  void wait(const io::IoTicket& ticket);
  // Whether the read is complete (successfully or not); never blocks.
  bool ready(const io::IoTicket& ticket) const;

  size_t units() const { return bytes_.size(); }
  size_t slice_bytes(size_t unit) const { return bytes_.at(unit); }
  size_t padded_bytes(size_t unit) const;
  size_t largest_padded_bytes() const;
  const std::string& path() const { return file_->path(); }
  const offload::Swapper& swapper() const { return *swapper_; }

 private:
  std::vector<size_t> bytes_;
  std::unique_ptr<io::AioEngine> aio_;
  std::unique_ptr<offload::SwapFile> file_;
  std::unique_ptr<offload::Swapper> swapper_;  // declared last: destroyed before the file and the engine
};

}  // namespace zero3::detail
