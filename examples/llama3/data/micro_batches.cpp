#include "data/micro_batches.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace llama3 {

SampledMicroBatches::SampledMicroBatches(const PackedDataset& dataset, int data_parallel_size, uint64_t seed,
                                         int64_t micro_batch)
    : dataset_(dataset), order_(dataset.num_sequences(), 0, data_parallel_size, seed), micro_batch_(micro_batch) {}

void SampledMicroBatches::fill(int64_t data_index, int rank, int32_t* ids, int32_t* targets) {
  const int64_t seq = dataset_.seq_len();
  std::vector<uint32_t> row(static_cast<size_t>(seq));
  for (int64_t j = 0; j < micro_batch_; ++j) {
    const int64_t index = order_.index_at(data_index * micro_batch_ + j, rank);
    dataset_.sequence(index, row.data(), targets + j * seq);
    for (int64_t t = 0; t < seq; ++t) ids[j * seq + t] = static_cast<int32_t>(row[static_cast<size_t>(t)]);
  }
}

EvalMicroBatches::EvalMicroBatches(const PackedDataset& data, int data_parallel_size, int64_t micro_batch,
                                   int64_t max_batches, int64_t group, int32_t ignore_target)
    : elements_(micro_batch * data.seq_len()), ignore_(ignore_target) {
  if (group < 1) throw std::invalid_argument("EvalMicroBatches: group " + std::to_string(group) + ", expected >= 1");
  for (int r = 0; r < data_parallel_size; ++r)
    ranks_.emplace_back(data, r, data_parallel_size, micro_batch, max_batches, ignore_target);
  per_evaluation_ = (batches() + group - 1) / group * group;
}

void EvalMicroBatches::fill(int64_t data_index, int rank, int32_t* ids, int32_t* targets) {
  const int64_t batch = data_index % per_evaluation_;
  if (batch < batches()) {
    ranks_.at(static_cast<size_t>(rank)).fill(batch, ids, targets);
    return;
  }
  std::fill(ids, ids + elements_, 0);
  std::fill(targets, targets + elements_, ignore_);
}

}  // namespace llama3
