#include "zero/optimizer_swap.hpp"

#include <algorithm>
#include <cstring>

#include "core/check.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {

OptimizerSwap::OptimizerSwap(const Config& config, int rank, std::span<const int64_t> owned_lens) {
  const OffloadConfig& off = config.zero.offload_optimizer;
  const int64_t sub = config.zero.sub_group_size;
  std::vector<size_t> bytes;
  for (size_t i = 0; i < owned_lens.size(); ++i) {
    first_tile_.push_back(tiles_.size());
    for (int64_t a = 0; a < owned_lens[i]; a += sub) {
      int64_t n = std::min(sub, owned_lens[i] - a);
      tiles_.push_back({i, a, n});
      bytes.push_back(static_cast<size_t>(n) * 3 * sizeof(float));
    }
  }
  first_tile_.push_back(tiles_.size());
  ZERO3_REQUIRE(!off.nvme_path.empty(), ConfigError,
                "zero_optimization.offload_optimizer.nvme_path: required when offload_optimizer.device is nvme");
  std::vector<offload::SwapTile> placed = offload::pack_swap_tiles(bytes);
  size_t largest = 0;
  for (size_t b : bytes) largest = std::max(largest, b);
  offload::SwapFileSpec spec;
  spec.dir = off.nvme_path;
  spec.tier = "optimizer";
  spec.rank = rank;
  spec.bytes = std::max<uint64_t>(offload::swap_tiles_end(placed), 4096);
  spec.largest_tile = largest;
  spec.buffer_key = "zero_optimization.sub_group_size";
  aio_ = io::make_aio_engine(config.aio);
  file_ = std::make_unique<offload::SwapFile>(spec);
  offload::SwapperOptions so;
  so.buffer_count = static_cast<size_t>(std::max<int64_t>(off.buffer_count, 1));
  so.pipeline_read = off.pipeline_read;
  so.pipeline_write = off.pipeline_write;
  so.config_key = "zero_optimization.offload_optimizer";
  swapper_ = std::make_unique<offload::Swapper>(*aio_, *file_, std::move(placed), so);
  log::debug("engine: optimizer state of rank ", rank, " swapped to ", file_->path(), " (", file_->size(), " bytes, ",
             tiles_.size(), " tiles)");
}

std::vector<size_t> OptimizerSwap::unit_tiles(size_t unit) const {
  std::vector<size_t> order;
  for (size_t t = first_tile_.at(unit); t < first_tile_.at(unit + 1); ++t) order.push_back(t);
  return order;
}

void OptimizerSwap::write_unit(size_t unit, const float* master, const float* exp_avg, const float* exp_avg_sq) {
  swapper_->run(offload::SwapPass::write_only, unit_tiles(unit), [&](size_t t, std::span<std::byte> data) {
    const OptimizerSwapTile& tile = tiles_[t];
    const size_t n = static_cast<size_t>(tile.length);
    auto* f = reinterpret_cast<float*>(data.data());
    std::memcpy(f, master + tile.begin, n * sizeof(float));
    std::memcpy(f + n, exp_avg + tile.begin, n * sizeof(float));
    std::memcpy(f + 2 * n, exp_avg_sq + tile.begin, n * sizeof(float));
  });
}

void OptimizerSwap::read_unit(size_t unit, float* master, float* exp_avg, float* exp_avg_sq) {
  swapper_->run(offload::SwapPass::read_only, unit_tiles(unit), [&](size_t t, std::span<std::byte> data) {
    const OptimizerSwapTile& tile = tiles_[t];
    const size_t n = static_cast<size_t>(tile.length);
    const auto* f = reinterpret_cast<const float*>(data.data());
    if (master != nullptr) std::memcpy(master + tile.begin, f, n * sizeof(float));
    if (exp_avg != nullptr) std::memcpy(exp_avg + tile.begin, f + n, n * sizeof(float));
    if (exp_avg_sq != nullptr) std::memcpy(exp_avg_sq + tile.begin, f + 2 * n, n * sizeof(float));
  });
}

}  // namespace zero3::detail
