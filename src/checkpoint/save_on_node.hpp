// save_checkpoint with the node name given rather than read from gethostname(): which ranks share node-local
// storage (checkpoint.use_node_local_storage) follows from it. The public save_checkpoint passes the host name;
// tests pass made-up names to play several nodes on one machine.
#pragma once

#include <filesystem>
#include <string>

#include "checkpoint/checkpoint_ranks.hpp"
#include "zero3/checkpoint.hpp"

namespace zero3::ckpt {

SavedCheckpoint save_checkpoint_on_node(Engine& engine, const std::filesystem::path& dir, const std::string& tag,
                                        const CheckpointExtras& extras, const std::string& node_name);
// The same for any ranks (a pipelined run's: every stage saves its engine's units into one checkpoint).
SavedCheckpoint save_checkpoint_on_node(const CheckpointRanks& ranks, const std::filesystem::path& dir,
                                        const std::string& tag, const CheckpointExtras& extras,
                                        const std::string& node_name);

// The host name (gethostname), or "localhost".
std::string host_name();

}  // namespace zero3::ckpt
