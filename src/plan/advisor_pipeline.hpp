// The pipelined rows of the layout advisor (layout_advisor.hpp): the batch that keeps the user's, the memory of a
// row's worst pipeline rank (pipeline_plan.hpp), and the note a row carries.
#pragma once

#include <cstdint>
#include <string>

#include "zero3/layout_advisor.hpp"

namespace zero3::detail {

// The gradient_accumulation_steps that keep `user`'s (resolved) train_batch_size and micro-batch with `stages`
// pipeline stages on `world` ranks: train_batch_size / (micro-batch x world / stages). Throws ConfigError naming the
// numbers when that is not a whole number.
int64_t pipelined_grad_accum(const Config& user, int64_t world, int64_t stages);

struct PipelinedMemory {
  int64_t gpu_bytes = 0;        // the worst pipeline rank's device bytes (0 on the cpu device)
  int64_t host_node_bytes = 0;  // the node with the most
  int64_t nvme_node_bytes = 0;
  double bubble = 0;
};

// plan_pipeline() of a pipelined row's resolved `config`: boundaries of micro-batch x seq_len x hidden elements in
// the compute dtype, the activations scaled from `advice`'s estimate (or its caller's figure, counted whole on
// every rank).
PipelinedMemory plan_pipelined_row(const ModelDesc& model, const LlamaDims& dims, const Config& config,
                                   const ClusterDesc& cluster, const Advice& advice);

// "the program splits its model into 4 stages (llama3_train --pipeline-stages 4) and accumulates 16 micro-batches
// (--grad-accum 16): the same global batch of 256"
std::string pipelined_note(const LayoutChoice& choice, const Config& config, bool grad_accum_from_program);

}  // namespace zero3::detail
