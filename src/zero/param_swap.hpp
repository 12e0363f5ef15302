// NVMe parameter offload (offload_param.device = nvme, stage 3, 16-bit compute): this rank's compute-dtype
// parameter slice of every unit lives in one swap file per rank (tier "param"), one tile per unit (its slice,
// padded to 4096 bytes), and is read back only to feed the unit's all-gather.
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

class ParamSwap {
 public:
  // slice_bytes: each unit's slice in bytes. Creates the swap file (preflight: IoError/ConfigError naming
  // nvme_path or buffer_size, given in elements of `elem_bytes` bytes).
  ParamSwap(const Config& config, int rank, std::span<const size_t> slice_bytes, size_t elem_bytes);

  // Blocking transfers of one unit's slice (exactly its slice bytes).
  void write(size_t unit, const void* data);
  void read(size_t unit, void* data);
  const offload::Swapper& swapper() const { return *swapper_; }

 private:
  std::vector<size_t> bytes_;
  std::unique_ptr<io::AioEngine> aio_;
  std::unique_ptr<offload::SwapFile> file_;
  std::unique_ptr<offload::Swapper> swapper_;  // declared last: destroyed before the file and the engine
};

}  // namespace zero3::detail
