// NVMe optimizer offload (offload_optimizer.device = nvme): the fp32 master weights and Adam moments of this
// rank's owned ranges live in one swap file per rank (tier "optimizer"), streamed through the Swapper at
// every step.
//
// Layout: each unit's owned range is cut into tiles of sub_group_size elements (padding included, so a
// checkpoint sees the same range as without offload); a tile holds its master, exp_avg and exp_avg_sq
// back to back (3 x n floats), padded to 4096 bytes, units in declaration order.
//
// Threads: used from the engine's training thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "io/aio_engine.hpp"
#include "offload/swap_file.hpp"
#include "offload/swapper.hpp"
#include "zero3/config.hpp"

namespace zero3::detail {

struct OptimizerSwapTile {
  size_t unit = 0;    // index into the engine's units
  int64_t begin = 0;  // offset in the unit's owned range
  int64_t length = 0;
};

class OptimizerSwap {
 public:
  // owned_lens: each unit's owned range length. Creates the swap file (preflight: IoError/ConfigError
  // naming nvme_path) and the staging buffers. Nothing is written yet.
  OptimizerSwap(const Config& config, int rank, std::span<const int64_t> owned_lens);

  const std::vector<OptimizerSwapTile>& tiles() const { return tiles_; }
  offload::Swapper& swapper() { return *swapper_; }
  const offload::Swapper& swapper() const { return *swapper_; }
  const std::string& path() const { return file_->path(); }

  // Blocking: the whole owned range of `unit` to or from host arrays of owned_len floats each.
  void write_unit(size_t unit, const float* master, const float* exp_avg, const float* exp_avg_sq);
  // read_unit: a null array is skipped.
  void read_unit(size_t unit, float* master, float* exp_avg, float* exp_avg_sq);
  // The tile indices of `unit`, in order.
  std::vector<size_t> unit_tiles(size_t unit) const;

 private:
  std::vector<OptimizerSwapTile> tiles_;
  std::vector<size_t> first_tile_;  // per unit, and one past the end
  std::unique_ptr<io::AioEngine> aio_;
  std::unique_ptr<offload::SwapFile> file_;
  std::unique_ptr<offload::Swapper> swapper_;  // declared last: destroyed before the file and the engine
};

}  // namespace zero3::detail
