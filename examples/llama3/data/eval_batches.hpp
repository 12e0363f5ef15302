// Held-out evaluation data: every sequence of a packed set exactly once per evaluation, in order, split across
// the ranks. Batch b of rank r holds sequences (b * world + r) * micro_batch, ... + micro_batch - 1; those past
// the end of the set are padding (ids 0, every target `ignore_target`), so every rank runs the same number of
// batches, as the engine's collectives need, and padding adds nothing to the loss.
#pragma once

#include <cstdint>

#include "data/dataset.hpp"

namespace llama3 {

class EvalBatches {
 public:
  // `data` must outlive this. max_batches 0: as many batches as the whole set needs. Throws
  // std::invalid_argument for a micro_batch or world below 1, or a rank outside [0, world).
  EvalBatches(const PackedDataset& data, int rank, int world, int64_t micro_batch, int64_t max_batches,
              int32_t ignore_target);

  int64_t batches() const { return batches_; }
  // Sequences all ranks evaluate together per evaluation (the padding not counted).
  int64_t sequences() const;
  // Batch `batch` of this rank: micro_batch x seq_len ids and targets.
  void fill(int64_t batch, int32_t* ids, int32_t* targets) const;

 private:
  const PackedDataset& data_;
  int rank_, world_;
  int64_t micro_;
  int64_t batches_;
  int32_t ignore_;
};

}  // namespace llama3
