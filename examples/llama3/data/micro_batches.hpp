// Micro-batches by index: what a training loop's micro-step reads, readable in any order and for any data-parallel
// rank. A pipeline stage (pipeline_model.hpp) reads its micro-batch by the pipeline's data index, and the last stage
// counts the targets of every rank's micro-batches of a step.
#pragma once

#include <cstdint>

#include "data/dataset.hpp"
#include "data/sampler.hpp"

namespace llama3 {

class MicroBatchSource {
 public:
  virtual ~MicroBatchSource() = default;
  // ids and targets (micro-batch x seq, row-major; targets shifted, kIgnoreIndex skips) of micro-batch
  // `data_index` of data-parallel rank `rank`.
  virtual void fill(int64_t data_index, int rank, int32_t* ids, int32_t* targets) = 0;
};

// A PackedDataset in a DistributedSampler's order: micro-batch d of rank r holds the sequences that rank r's
// sampler (over `data_parallel_size` ranks, `seed`) returns as its next() number d x micro_batch .. d x micro_batch
// + micro_batch - 1 counted from the start of training: those llama3_train's unpipelined loop reads on rank r for
// micro-step d % accumulation of optimizer step d / accumulation. `dataset` must outlive it. Throws
// std::runtime_error as DistributedSampler does (fewer sequences than ranks).
class SampledMicroBatches : public MicroBatchSource {
 public:
  SampledMicroBatches(const PackedDataset& dataset, int data_parallel_size, uint64_t seed, int64_t micro_batch);
  void fill(int64_t data_index, int rank, int32_t* ids, int32_t* targets) override;

 private:
  const PackedDataset& dataset_;
  DistributedSampler order_;  // index_at() only
  int64_t micro_batch_;
};

}  // namespace llama3
