// The dry-run memory plan: how many bytes each rank (and each node) will hold for a model under a config,
// per category and per tier, computed from shapes alone, before anything is allocated. `zero3 plan` prints
// it; the engine's byte counters report the same categories, so a run can be checked against its plan.
//
// What it counts is what the engine allocates (all counts in elements; W = the ranks a unit is partitioned over:
// the world size, or mics_shard_size under MiCS, whose shard groups each hold a replica; P_u the elements of
// unit u):
//   - Unit u is one flat buffer padded to Pp_u = W * S_u, S_u = ceil(P_u / W); each rank owns one slice of
//     S_u elements (stage >= 1) or the whole buffer (stage 0). Padding is counted.
//   - params: the compute-dtype copy (c bytes: bf16/f16 2, f32 4). Stages 0-2 hold every unit's full
//     buffer. Stage 3 holds the rank's slices, the units that stay gathered (P_u at most
//     stage3_param_persistence_threshold, in declaration order while their sum stays within
//     stage3_model_persistence_threshold), and the units gathered on demand at their worst moment (below).
//   - master: fp32 copy of the owned range when the compute dtype is 16-bit. With f32 compute the
//     parameters are the master (stages 0-2: the full buffer; stage 3: the fp32 slice, counted as params).
//   - grads: the accumulator in data_types.grad_accum_dtype (g bytes), full at stages 0-1, the slice at
//     stages 2-3; plus the buffer of one open backward scope, the largest unit's Pp_u elements in g bytes.
//   - optimizer_state: Adam's m and v, fp32, over the owned range.
//   - buffers: the reducer's two alternating buckets in communication_data_type (default: the compute
//     dtype, as DeepSpeed's): stages 2-3 reduce-scatter, each bucket C*W in + C out elements with
//     C = min(reduce_bucket_size / W, sum of S_u); stages 0-1 all-reduce, each C = min(reduce_bucket_size,
//     sum of P_u) elements; reduce_bucket_size 0 counts as the largest unit (W * max S_u, or max P_u).
//     With a 16-bit accumulator, an fp32 tile of min(sub_group_size, largest owned
//     range) elements for the optimizer step. NVMe tiers add their staging buffers (below).
//   - Gathered units (stage 3) are simulated along the steady-state order of a micro-step, every unit's
//     forward scope in declaration order and then every backward scope in reverse (a model without
//     activation checkpointing), with the engine's rules: prefetch along the order within
//     stage3_prefetch_bucket_size elements ahead and stage3_max_live_parameters gathered; a closing unit
//     kept when its next use is within stage3_max_reuse_distance elements; kept units evicted (farthest
//     next use first) to make room under stage3_max_live_parameters; the entered unit always gathered.
//   - offload_optimizer cpu: master and Adam state on the host; nvme: on NVMe, plus buffer_count host
//     buffers of min(sub_group_size, owned elements) fp32 elements. offload_param (stage 3 only) cpu:
//     parameter slices on the host; nvme: slices on NVMe plus buffer_count host buffers of buffer_size
//     elements in the compute dtype. The gradient accumulator stays on the device. On a GPU (zero3.device not
//     "cpu"), optimizer offload adds the step's pinned staging: 2 tiles of T = min(sub_group_size, largest
//     slice) gradients in g bytes and, unless the parameter slices are on the host, 2 tiles of T compute-dtype
//     parameters; with a 16-bit accumulator the fp32 step tile is on the host. Parameter offload without
//     optimizer offload adds a device tile of T compute-dtype parameters for the step. With fp32 compute on a
//     GPU, any offload keeps the fp32 master apart from the parameters (where the optimizer lives).
//   - hpZ (zero_hpz_partition_size H): the secondary partition, Pp_u / H compute-dtype elements of every
//     non-persistent unit. MiCS with replicas: two all-reduce buckets of min(reduce_bucket_size, sum of S_u)
//     elements in communication_data_type for the sum across the replicas; with mics_hierarchical_params_gather
//     the inter-node stage's slices of the units in flight, at most (gathered units' worst case + persistent
//     units) x (nodes the shard group spans) / W elements.
//   - activations: the caller's estimate, on the device.
// When zero3.device is "cpu" the device tier is host memory; per-node host totals then include it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zero3/config.hpp"

namespace zero3 {

// A unit: parameters gathered together. Shapes only; nothing is allocated.
struct UnitDesc {
  std::string name;
  std::vector<std::vector<int64_t>> params;  // one shape per parameter
  int64_t numel() const;
};

struct ModelDesc {
  std::string name;
  std::vector<UnitDesc> units;  // in forward order
  int64_t numel() const;
};

// The dimensions of a Llama (Hugging Face LlamaConfig names).
struct LlamaDims {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // 0: same as num_attention_heads
  int64_t head_dim = 0;             // 0: hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  bool tie_word_embeddings = false;
};

// Llama's units: "embed" (vocab x hidden), one "layer.<i>" per decoder layer (q, k, v, o projections,
// gate, up, down, input and post-attention RMSNorm weights), "head" (final norm, and lm_head unless the
// embeddings are tied). Shapes are PyTorch's (out_features, in_features). Throws InvalidArgument for a non-positive
// dimension or heads that do not divide.
ModelDesc llama_model_desc(const LlamaDims& dims, const std::string& name = "llama");

// Reads a model description from JSON text: either a Hugging Face Llama config.json (has "hidden_size")
// or {"name": ..., "units": [{"name": ..., "params": [[d0, d1], [d0]]}, ...]}. `source` names the file
// in errors. Throws ConfigError naming the key. `hidden_size_out`, when given, receives the model's hidden
// size (0 when the description has none): it resolves the config's "auto" bucket sizes. `dims_out`, when given,
// receives a Llama config's dimensions (all 0 for a unit list).
ModelDesc parse_model_desc(const std::string& json_text, const std::string& source, int64_t* hidden_size_out = nullptr,
                           LlamaDims* dims_out = nullptr);

// Reads the file and parses it. Throws ConfigError (unreadable file included).
ModelDesc load_model_desc(const std::string& path, int64_t* hidden_size_out = nullptr, LlamaDims* dims_out = nullptr);

enum class MemoryTier { device, host, nvme };
enum class MemoryCategory { params, master, grads, optimizer_state, buffers, activations };

const char* to_string(MemoryTier tier);
const char* to_string(MemoryCategory category);

struct MemoryPlanEntry {
  MemoryCategory category;
  MemoryTier tier;
  int64_t bytes = 0;  // per rank
  std::string what;   // e.g. "parameter slices (bf16)"
};

struct MemoryPlanOptions {
  int64_t world_size = 1;
  int64_t ranks_per_node = 1;
  int64_t activation_bytes = 0;  // per rank, on the device
};

struct MemoryPlan {
  int stage = 0;
  DType compute_dtype = DType::f32;
  int64_t world_size = 1;
  int64_t ranks_per_node = 1;
  int64_t nodes = 1;            // ceil(world_size / ranks_per_node)
  bool device_is_host = false;  // zero3.device == "cpu"
  int64_t partition_size = 1;   // ranks the slices are cut for: world_size, or MiCS's mics_shard_size
  std::string layout;           // "ZeRO-3 over 16 ranks", "hpZ: ...", "MiCS: ..." (src/zero/topology.hpp)

  int64_t total_params = 0;       // elements, unpadded
  int64_t padded_params = 0;      // sum of Pp_u
  int64_t shard_params = 0;       // sum of S_u: elements one rank owns
  int64_t persistent_params = 0;  // stage 3: padded elements of the units that stay gathered
  int64_t persistent_numel = 0;   // the same unpadded (the engine's ScheduleStats::persistent_numel)
  int64_t live_params = 0;        // stage 3: most padded elements of non-persistent units gathered at once
  int64_t live_numel = 0;         // most unpadded ones (the engine's ScheduleStats::peak_live_numel)
  int64_t largest_unit = 0;       // padded elements of the largest unit

  int64_t checkpoint_bytes = 0;  // one save_checkpoint, every rank's file together: see checkpoint_bytes()

  std::vector<MemoryPlanEntry> entries;  // per rank; entries with 0 bytes are left out

  int64_t rank_bytes(MemoryTier tier) const;
  int64_t rank_bytes(MemoryCategory category) const;
  int64_t rank_bytes() const;
  // Every rank holds the same amount (slices are padded to equal size), so a node holds ranks_per_node times
  // a rank's bytes in each tier.
  int64_t node_bytes(MemoryTier tier) const { return rank_bytes(tier) * ranks_per_node; }
};

// Plans `model` under `config`, which must be resolved (no "auto" left in the fields used: throws
// ConfigError naming the key and the zero3 plan flag that resolves it). Throws ConfigError for an offload
// the stage does not support (offload_param below stage 3, any offload at stage 0), InvalidArgument for
// world_size or ranks_per_node < 1 or an empty model.
MemoryPlan plan_memory(const ModelDesc& model, const Config& config, const MemoryPlanOptions& options);

// The size of one checkpoint of `model` saved by `world_size` ranks (save_checkpoint: every rank's shard file
// and the manifest together): the fp32 master weights and Adam's two moments of every parameter, 12 bytes each
// (padding is not stored), plus an allowance of 4 KiB per unit and rank for the files' headers and 64 KiB for
// the manifest's config.
int64_t checkpoint_bytes(const ModelDesc& model, int64_t world_size);

// A table: one row per entry (category, what, tier, bytes per rank), then totals per tier per rank and
// per node, in bytes and in binary units (KiB, MiB, GiB).
std::string format_memory_plan(const MemoryPlan& plan);

}  // namespace zero3
