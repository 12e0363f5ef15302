#include "zero/param_swap.hpp"

#include <algorithm>

#include "core/check.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {

ParamSwap::ParamSwap(const Config& config, int rank, std::span<const size_t> slice_bytes, size_t elem_bytes)
    : bytes_(slice_bytes.begin(), slice_bytes.end()) {
  const OffloadConfig& off = config.zero.offload_param;
  ZERO3_REQUIRE(!off.nvme_path.empty(), ConfigError,
                "zero_optimization.offload_param.nvme_path: required when offload_param.device is nvme");
  ZERO3_REQUIRE(off.buffer_size >= 1, ConfigError, "zero_optimization.offload_param.buffer_size: ", off.buffer_size,
                " is not a positive number of elements");
  std::vector<offload::SwapTile> tiles = offload::pack_swap_tiles(bytes_);
  size_t largest = 0;
  for (size_t b : bytes_) largest = std::max(largest, b);
  offload::SwapFileSpec spec;
  spec.dir = off.nvme_path;
  spec.tier = "param";
  spec.rank = rank;
  spec.bytes = std::max<uint64_t>(offload::swap_tiles_end(tiles), 4096);
  spec.largest_tile = largest;
  spec.buffer_bytes = static_cast<size_t>(off.buffer_size) * elem_bytes;
  spec.buffer_key = "zero_optimization.offload_param.buffer_size";
  aio_ = io::make_aio_engine(config.aio);
  file_ = std::make_unique<offload::SwapFile>(spec);
  offload::SwapperOptions so;
  // Staging buffers of the largest slice, not of buffer_size (checked above as a bound): one unit is moved at
  // a time, so two buffers suffice whatever buffer_count says.
  so.buffer_count = 2;
  so.pipeline_read = false;
  so.pipeline_write = false;
  so.config_key = "zero_optimization.offload_param";
  swapper_ = std::make_unique<offload::Swapper>(*aio_, *file_, std::move(tiles), so);
  log::debug("engine: parameter slices of rank ", rank, " swapped to ", file_->path(), " (", file_->size(), " bytes)");
}

void ParamSwap::write(size_t unit, const void* data) {
  swapper_->write_tile(unit, std::span<const std::byte>(static_cast<const std::byte*>(data), bytes_.at(unit)));
}

void ParamSwap::read(size_t unit, void* data) {
  swapper_->read_tile(unit, std::span<std::byte>(static_cast<std::byte*>(data), bytes_.at(unit)));
}

}  // namespace zero3::detail
