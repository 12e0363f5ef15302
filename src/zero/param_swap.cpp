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
  ZERO3_REQUIRE(off.buffer_count >= 1, ConfigError, "zero_optimization.offload_param.buffer_count: ", off.buffer_count,
                " is not a positive number of read buffers");
  ZERO3_REQUIRE(off.buffer_size >= 1, ConfigError, "zero_optimization.offload_param.buffer_size: ", off.buffer_size,
                " is not a positive number of elements");
  size_t largest = 0;
  for (size_t b : bytes_) largest = std::max(largest, b);
  const size_t largest_elems = elem_bytes == 0 ? 0 : (largest + elem_bytes - 1) / elem_bytes;
  // The read buffers are allocated at the size of the largest slice; buffer_size is the bound they must fit in.
  ZERO3_REQUIRE(static_cast<size_t>(off.buffer_size) >= largest_elems, ConfigError,
                "zero_optimization.offload_param.buffer_size: ", off.buffer_size,
                " elements per read buffer cannot hold rank ", rank, "'s largest parameter slice of ", largest_elems,
                " elements; raise buffer_size to at least ", largest_elems,
                " (zero_optimization.offload_param.buffer_count buffers of it are read into)");
  std::vector<offload::SwapTile> tiles = offload::pack_swap_tiles(bytes_);
  offload::SwapFileSpec spec;
  spec.dir = off.nvme_path;
  spec.tier = "param";
  spec.rank = rank;
  spec.bytes = std::max<uint64_t>(offload::swap_tiles_end(tiles), 4096);
  aio_ = io::make_aio_engine(config.aio);
  file_ = std::make_unique<offload::SwapFile>(spec);
  offload::SwapperOptions so;
  // Only writes go through the Swapper, one unit at a time: one staging buffer of the largest slice.
  so.buffer_count = 1;
  so.pipeline_read = false;
  so.pipeline_write = false;
  so.config_key = "zero_optimization.offload_param";
  swapper_ = std::make_unique<offload::Swapper>(*aio_, *file_, std::move(tiles), so);
  log::debug("engine: parameter slices of rank ", rank, " swapped to ", file_->path(), " (", file_->size(), " bytes)");
}

void ParamSwap::write(size_t unit, const void* data) {
  swapper_->write_tile(unit, std::span<const std::byte>(static_cast<const std::byte*>(data), bytes_.at(unit)));
}

size_t ParamSwap::padded_bytes(size_t unit) const { return io::align_up(bytes_.at(unit), io::kDirectIoAlignment); }

size_t ParamSwap::largest_padded_bytes() const {
  size_t largest = 0;
  for (size_t b : bytes_) largest = std::max(largest, b);
  return io::align_up(largest, io::kDirectIoAlignment);
}

io::IoTicket ParamSwap::start_read(size_t unit, std::byte* buffer) {
  const offload::SwapTile& tile = swapper_->tile(unit);
  if (!swapper_->tile_trusted(unit)) {
    throw IoError(log::concat("parameter swap ", file_->path(), ": the slice of unit #", unit, " (offset ", tile.offset,
                              ", ", tile.bytes,
                              " bytes) holds no complete data: it was never written, or its last write failed"));
  }
  return aio_->submit_read(file_->file(), buffer, padded_bytes(unit), tile.offset);
}

void ParamSwap::wait(const io::IoTicket& ticket) { aio_->wait(ticket); }

bool ParamSwap::ready(const io::IoTicket& ticket) const { return aio_->ready(ticket); }

}  // namespace zero3::detail
