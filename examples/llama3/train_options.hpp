// The command line of llama3_train: every flag, its default and its help text in one table.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace llama3 {

struct TrainOptions {
  std::string model = "configs/models/llama-3-tiny.json";  // Hugging Face config.json
  std::string deepspeed = "configs/zero-stage3.json";      // DeepSpeed JSON
  std::vector<std::string> data;                           // files, directories, token files; default: common-licenses
  std::vector<std::string> eval_data;                      // held-out data, the same forms; none: no evaluation
  int64_t eval_interval = 0;                               // optimizer steps between evaluations; 0: the last only
  int64_t eval_batches = 0;                                // micro-batches per rank per evaluation; 0: the whole set
  std::string tokenizer = "bytes";                         // bytes | PATH/tokenizer.model
  int64_t seq_len = 256;
  std::optional<int64_t> micro_batch;  // resolve train_micro_batch_size_per_gpu "auto"
  std::optional<int64_t> grad_accum;   // resolve gradient_accumulation_steps "auto"
  int64_t steps = 100;                 // optimizer steps
  std::optional<double> lr;
  std::optional<int64_t> warmup_steps;
  std::optional<std::string> precision;  // bf16 | fp16 | fp32; unset: what the config says
  std::string device = "auto";           // cpu | cuda | auto
  bool grad_checkpointing = true;
  std::optional<int64_t> pipeline_stages;  // pipeline.stages; unset: the config's (default 1, no pipeline)
  // The dtype between pipeline stages: compute (default: the config's compute dtype, as DeepSpeed's pipeline sends
  // a bf16 model's activations) | activation (the backend's activation dtype: fp32 on cpu) | bf16 | fp16 | fp32.
  std::string pipeline_boundary_dtype = "compute";
  std::string network = "auto";            // auto | efa | socket
  std::string save_dir;
  int64_t save_interval = 0;          // optimizer steps between checkpoints; 0: only at the end (with --save-dir)
  std::optional<std::string> resume;  // "latest" or a tag
  std::string init_from;              // Hugging Face safetensors (file, directory, index)
  bool init_from_strict = false;      // unknown tensors in init_from: an error instead of a warning
  std::string metrics;                // CSV file; default <save-dir>/metrics.csv or ./llama3_train_metrics.csv; "none"
  uint64_t seed = 1234;               // data order (and the config's zero3.seed unless the config sets it)
  bool dry_run = false;
  int64_t world_size = 0;         // dry run: ranks (default: the launcher's world size)
  int64_t ranks_per_node = 0;     // dry run: ranks per node (default: the launcher's local world size)
  std::string consolidate_to;     // after training: Hugging Face safetensors of the final weights
  std::string consolidate_dtype;  // bf16 | fp32; default: bf16 when training in bf16, else fp32
  std::string consolidate_max_shard = "5GB";
  bool help = false;
  bool version = false;
};

// Parses argv (flags as --name=value or --name value; booleans as --name / --no-name). Throws
// zero3::InvalidArgument naming the flag and what was expected, with a "did you mean" hint for unknown flags.
TrainOptions parse_train_options(int argc, char** argv);

// The --help text.
std::string train_usage();

}  // namespace llama3
