// Which sequences each rank trains on: a deterministic shuffle per epoch, split across ranks without
// overlap (like PyTorch's DistributedSampler with drop_last), resumable from a (epoch, position) pair.
#pragma once

#include <cstdint>
#include <vector>

namespace llama3 {

class DistributedSampler {
 public:
  struct State {
    int64_t epoch = 0;
    int64_t position = 0;  // sequences this rank already took in this epoch
  };

  DistributedSampler(int64_t num_items, int rank, int world_size, uint64_t seed, bool shuffle = true);

  int64_t per_rank() const { return num_items_ / world_size_; }
  // The next index for this rank; moves to the next epoch (a new shuffle) when this one is used up.
  int64_t next();
  State state() const { return state_; }
  void restore(const State& s);

  // The full order of an epoch (all ranks), for tests.
  std::vector<int64_t> epoch_order(int64_t epoch) const;

 private:
  void build_order();

  int64_t num_items_;
  int rank_, world_size_;
  uint64_t seed_;
  bool shuffle_;
  State state_;
  std::vector<int64_t> order_;  // of state_.epoch
};

}  // namespace llama3
