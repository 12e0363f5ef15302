#include "plan/advisor_pipeline.hpp"

#include <algorithm>

#include "core/check.hpp"
#include "zero3/error.hpp"
#include "zero3/pipeline_plan.hpp"

namespace zero3::detail {

int64_t pipelined_grad_accum(const Config& user, int64_t world, int64_t stages) {
  const int64_t batch = *user.train_batch_size, micro = *user.train_micro_batch_size_per_gpu;
  const int64_t per_step = micro * (world / stages);
  ZERO3_REQUIRE(world % stages == 0 && batch % per_step == 0, ConfigError, "train_batch_size: ", batch,
                " is no whole number of train_micro_batch_size_per_gpu ", micro, " x data-parallel size ",
                world / stages, " (world size ", world, " / pipeline.stages ", stages,
                "); a pipelined row keeps the global batch and the micro-batch, and no gradient_accumulation_steps "
                "does");
  return batch / per_step;
}

PipelinedMemory plan_pipelined_row(const ModelDesc& model, const LlamaDims& dims, const Config& config,
                                   const ClusterDesc& cluster, const Advice& advice) {
  PipelinePlanOptions o;
  o.world_size = cluster.world();
  o.ranks_per_node = cluster.gpus_per_node;
  o.boundary_numel = *config.train_micro_batch_size_per_gpu * advice.seq_len * dims.hidden_size;
  o.dims = dims;
  o.checkpointing = advice.checkpointing;
  if (advice.activations_estimated) o.activations = advice.activations;
  const PipelinePlan plan = plan_pipeline(model, config, o);
  PipelinedMemory m;
  m.bubble = plan.bubble;
  for (const PipelineRankPlan& r : plan.ranks) {
    const int64_t device = r.memory.device_is_host ? 0 : r.memory.rank_bytes(MemoryTier::device);
    m.gpu_bytes = std::max(m.gpu_bytes, device + (advice.activations_estimated ? 0 : advice.activation_bytes));
    m.nvme_node_bytes = std::max(m.nvme_node_bytes, r.memory.rank_bytes(MemoryTier::nvme) * cluster.gpus_per_node);
  }
  m.host_node_bytes = *std::max_element(plan.node_host_bytes.begin(), plan.node_host_bytes.end());
  return m;
}

std::string pipelined_note(const LayoutChoice& choice, const Config& config, bool grad_accum_from_program) {
  const std::string stages = std::to_string(choice.pipeline_stages);
  const std::string ga = std::to_string(*config.gradient_accumulation_steps);
  return "the program splits its model into " + stages + " stages (llama3_train --pipeline-stages " + stages +
         ") and accumulates " + ga + " micro-batches" + (grad_accum_from_program ? " (--grad-accum " + ga + ")" : "") +
         ": the same global batch of " + std::to_string(*config.train_batch_size);
}

}  // namespace zero3::detail
