// Pieces shared by the two exports to Hugging Face safetensors (consolidate_checkpoint from files,
// save_16bit_model from a live engine): the tensor declarations in unit order and the description of what
// was written.
#pragma once

#include <filesystem>
#include <vector>

#include "checkpoint/export_names.hpp"
#include "zero3/checkpoint.hpp"
#include "zero3/safetensors.hpp"

namespace zero3::ckpt {

// One parameter to export: where it lies in its unit's flat buffer and how it is declared in the files.
struct ExportParam {
  int unit = 0;
  int64_t offset = 0;
  int64_t numel = 0;
  safetensors::TensorDecl decl;
};

struct ExportSource {
  std::string full_name, local_name;
  int unit = 0;
  int64_t offset = 0, numel = 0;
  std::vector<int64_t> shape;
  DType dtype = DType::f32;  // compute dtype of the run
};

// Names (export_names) and element types (`dtype`, or each parameter's own when nullopt) of the exported
// tensors, in the given order (unit order).
std::vector<ExportParam> plan_export(const std::vector<ExportSource>& sources, const ExportOptions& options,
                                     std::optional<DType> dtype);

// What a finished export holds: file names from the shard plan (plus the index for several shards), counts, and
// the files' sizes on disk (0 when `stat_files` is false: the files are on another rank's view).
// `buffers` follow the parameters in the files (the model's buffers).
ExportedModel describe_export(const std::filesystem::path& out_dir, const std::vector<ExportParam>& params,
                              uint64_t max_shard_bytes, bool stat_files,
                              const std::vector<safetensors::TensorDecl>& buffers = {});

// The export's dtype for the summary: `dtype`, else the first tensor's.
DType export_dtype(const std::vector<ExportParam>& params, std::optional<DType> dtype);

}  // namespace zero3::ckpt
