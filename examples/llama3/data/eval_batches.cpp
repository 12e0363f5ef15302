#include "data/eval_batches.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace llama3 {

EvalBatches::EvalBatches(const PackedDataset& data, int rank, int world, int64_t micro_batch, int64_t max_batches,
                         int32_t ignore_target)
    : data_(data), rank_(rank), world_(world), micro_(micro_batch), ignore_(ignore_target) {
  if (micro_batch < 1 || world < 1 || rank < 0 || rank >= world) {
    throw std::invalid_argument("EvalBatches: micro_batch " + std::to_string(micro_batch) + ", rank " +
                                std::to_string(rank) + " of " + std::to_string(world) +
                                ": expected micro_batch >= 1 and 0 <= rank < world");
  }
  const int64_t per_batch = micro_batch * world;
  batches_ = (data.num_sequences() + per_batch - 1) / per_batch;
  if (max_batches > 0) batches_ = std::min(batches_, max_batches);
}

int64_t EvalBatches::sequences() const { return std::min(data_.num_sequences(), batches_ * micro_ * world_); }

void EvalBatches::fill(int64_t batch, int32_t* ids, int32_t* targets) const {
  const int64_t seq = data_.seq_len();
  std::vector<uint32_t> row(static_cast<size_t>(seq));
  for (int64_t j = 0; j < micro_; ++j) {
    const int64_t index = (batch * world_ + rank_) * micro_ + j;
    int32_t* id = ids + j * seq;
    int32_t* target = targets + j * seq;
    if (index >= data_.num_sequences()) {
      std::fill(id, id + seq, 0);
      std::fill(target, target + seq, ignore_);
      continue;
    }
    data_.sequence(index, row.data(), target);
    for (int64_t t = 0; t < seq; ++t) id[t] = static_cast<int32_t>(row[static_cast<size_t>(t)]);
  }
}

}  // namespace llama3
