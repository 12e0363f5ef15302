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

  // What next() returns on rank `rank` (of this sampler's world) when that rank has taken `taken` sequences since
  // epoch 0, position 0: the same sequence, read in any order and for any rank (a pipeline stage reads its
  // micro-batches by index, and counts the targets of every rank's). Throws std::runtime_error for a rank outside
  // the world or a negative count.
  int64_t index_at(int64_t taken, int rank) const;

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
  mutable int64_t lookup_epoch_ = -1;  // index_at()'s epoch order
  mutable std::vector<int64_t> lookup_order_;
};

}  // namespace llama3
