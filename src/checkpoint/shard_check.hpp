// Checking one shard file of a checkpoint against its manifest entry: present, of the recorded size and
// CRC-32C, a valid safetensors file holding the tensors of every range the manifest lists for it.
#pragma once

#include <optional>
#include <string>

#include "zero3/checkpoint.hpp"
#include "zero3/safetensors.hpp"

namespace zero3::ckpt {

// The problem with file `file` (index into info.files), or "" when it is sound. Reads the whole file. When
// `reader` is not null and the file is sound, it is left open there for reading its tensors.
std::string check_shard_file(const CheckpointInfo& info, size_t file,
                             std::optional<safetensors::SafetensorsReader>* reader = nullptr);

}  // namespace zero3::ckpt
