#include "data/sampler.hpp"

#include <numeric>
#include <stdexcept>
#include <string>

namespace llama3 {
namespace {

// splitmix64: a small, portable generator (std distributions differ between standard libraries).
uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

DistributedSampler::DistributedSampler(int64_t num_items, int rank, int world_size, uint64_t seed, bool shuffle)
    : num_items_(num_items), rank_(rank), world_size_(world_size), seed_(seed), shuffle_(shuffle) {
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw std::runtime_error("sampler: rank " + std::to_string(rank) + " of world size " + std::to_string(world_size));
  if (per_rank() < 1)
    throw std::runtime_error("sampler: " + std::to_string(num_items) + " sequences cannot give each of " +
                             std::to_string(world_size) + " ranks one; use more data or a shorter sequence");
  build_order();
}

std::vector<int64_t> DistributedSampler::epoch_order(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(num_items_));
  std::iota(order.begin(), order.end(), 0);
  if (shuffle_) {
    uint64_t s = seed_ * 0x100000001B3ull + static_cast<uint64_t>(epoch);
    for (size_t i = order.size(); i > 1; --i) {
      size_t j = static_cast<size_t>(splitmix64(s) % i);  // modulo bias is negligible for data order
      std::swap(order[i - 1], order[j]);
    }
  }
  return order;
}

void DistributedSampler::build_order() { order_ = epoch_order(state_.epoch); }

int64_t DistributedSampler::next() {
  if (state_.position >= per_rank()) {
    ++state_.epoch;
    state_.position = 0;
    build_order();
  }
  // Interleaved split: rank r takes r, r + W, r + 2W ... of the epoch's order.
  int64_t idx = order_[static_cast<size_t>(state_.position * world_size_ + rank_)];
  ++state_.position;
  return idx;
}

int64_t DistributedSampler::index_at(int64_t taken, int rank) const {
  if (rank < 0 || rank >= world_size_ || taken < 0)
    throw std::runtime_error("sampler: no sequence " + std::to_string(taken) + " of rank " + std::to_string(rank) +
                             " in a world of " + std::to_string(world_size_));
  const int64_t epoch = taken / per_rank(), position = taken % per_rank();
  if (epoch != lookup_epoch_) {
    lookup_order_ = epoch_order(epoch);
    lookup_epoch_ = epoch;
  }
  return lookup_order_[static_cast<size_t>(position * world_size_ + rank)];
}

void DistributedSampler::restore(const State& s) {
  if (s.epoch < 0 || s.position < 0 || s.position > per_rank())
    throw std::runtime_error("sampler: cannot resume at epoch " + std::to_string(s.epoch) + " position " +
                             std::to_string(s.position));
  state_ = s;
  build_order();
}

}  // namespace llama3
