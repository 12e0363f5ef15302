// The model's buffers (Engine::buffers(): BatchNorm's running statistics and the like) in checkpoints and exports:
// rank 0 writes them as one safetensors file beside the shard files, every rank reads them back, and the two exports
// append them to the parameters.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "zero3/checkpoint.hpp"
#include "zero3/engine.hpp"
#include "zero3/safetensors.hpp"

namespace zero3::ckpt {

inline constexpr const char* kBuffersFileName = "buffers.safetensors";

// The declarations of `buffers` (names, types, shapes), as files and manifests carry them.
std::vector<CheckpointBuffer> describe_buffers(const std::vector<ModelBuffer>& buffers);
std::vector<safetensors::TensorDecl> buffer_decls(const std::vector<CheckpointBuffer>& buffers);
uint64_t buffer_bytes(const ModelBuffer& buffer);

// Writes `buffers` as the safetensors file `path` (fsync'ed); the returned file has its name, size and CRC-32C.
CheckpointFile write_buffers_file(const std::vector<ModelBuffer>& buffers, const std::filesystem::path& path);

// The problem with the checkpoint's buffers file ("" when it is sound, or when the checkpoint has no buffers):
// missing, wrong size or CRC-32C, or not holding the manifest's tensors. Reads the whole file.
std::string check_buffers_file(const CheckpointInfo& info);

// "" when `buffers` are the checkpoint's (the same names, types and shapes), else the first difference.
std::string buffers_difference(const CheckpointInfo& info, const std::vector<ModelBuffer>& buffers);

// Copies the checkpoint's buffers into `buffers` (checked with buffers_difference first).
void read_buffers(const CheckpointInfo& info, const std::vector<ModelBuffer>& buffers);

// Appends every buffer of the checkpoint to an export, copying its bytes unchanged (the declarations came from
// buffer_decls and follow the parameters').
void export_buffers(const CheckpointInfo& info, safetensors::ShardedSafetensorsWriter& writer);

// Throws CheckpointError when a buffer's name is also an exported parameter's.
void check_export_names(const std::vector<safetensors::TensorDecl>& params,
                        const std::vector<CheckpointBuffer>& buffers);

}  // namespace zero3::ckpt
