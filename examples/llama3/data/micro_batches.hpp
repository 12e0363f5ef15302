// Micro-batches by index: what a training loop's micro-step reads, readable in any order and for any data-parallel
// rank. A pipeline stage (pipeline_model.hpp) reads its micro-batch by the pipeline's data index, and the last stage
// counts the targets of every rank's micro-batches of a step.
#pragma once

#include <cstdint>
#include <vector>

#include "data/dataset.hpp"
#include "data/eval_batches.hpp"
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

// The held-out set by data index, for PipelineEngine::eval_batch(): micro-batch d of data-parallel rank r is that
// rank's EvalBatches batch d % per_evaluation() (llama3_train's unpipelined evaluation reads the same batches on the
// same data-parallel rank), and batches past EvalBatches::batches() up to per_evaluation() are padding (ids 0,
// every target `ignore_target`): per_evaluation() is batches() rounded up to a multiple of `group` (the micro-batches
// of one eval_batch()), and the data indices of successive evaluations continue (eval_batch()'s counter). `data`
// must outlive it; throws what EvalBatches throws.
class EvalMicroBatches : public MicroBatchSource {
 public:
  EvalMicroBatches(const PackedDataset& data, int data_parallel_size, int64_t micro_batch, int64_t max_batches,
                   int64_t group, int32_t ignore_target);
  int64_t batches() const { return ranks_.front().batches(); }
  int64_t per_evaluation() const { return per_evaluation_; }
  void fill(int64_t data_index, int rank, int32_t* ids, int32_t* targets) override;

 private:
  std::vector<EvalBatches> ranks_;
  int64_t per_evaluation_;
  int64_t elements_;  // micro_batch x seq
  int32_t ignore_;
};

}  // namespace llama3
