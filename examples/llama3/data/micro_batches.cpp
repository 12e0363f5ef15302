#include "data/micro_batches.hpp"

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

}  // namespace llama3
