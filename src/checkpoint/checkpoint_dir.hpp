// The checkpoint directory's names and its crash-safe commit steps.
//
//   DIR/latest                  tag of the newest complete checkpoint, replaced atomically
//   DIR/TAG/                    a complete checkpoint (manifest.json written last, inside the temp dir)
//   DIR/.tmp-TAG-<nonce>/       a save in progress, or one a crash interrupted: ignored by loads, removed by
//                               the next save
//   DIR/.old-TAG-<nonce>/       a replaced checkpoint on its way out (file systems that cannot exchange two
//                               directories); if DIR/TAG is missing it is the checkpoint, and is put back
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace zero3::ckpt {

inline constexpr const char* kLatestName = "latest";

// InvalidArgument unless `tag` is a plain file name: not empty, at most 200 bytes, no '/' or control
// characters, no leading or trailing space, not starting with '.', not "latest".
void validate_tag(const std::string& tag);

// The tag DIR/latest holds (trailing whitespace dropped). CheckpointError when missing, empty or invalid.
std::string read_latest(const std::filesystem::path& dir);
// Replaces DIR/latest atomically (temp file, fsync, rename, fsync DIR).
void write_latest(const std::filesystem::path& dir, const std::string& tag);

// DIR/.tmp-TAG-<nonce as 16 hex digits>
std::filesystem::path temp_dir_path(const std::filesystem::path& dir, const std::string& tag, uint64_t nonce);

// Removes what interrupted saves left in DIR: every .tmp-* directory, and each .old-TAG-* directory whose
// DIR/TAG is complete (one whose DIR/TAG is missing is renamed back to DIR/TAG: it is the only copy).
// Problems are logged, never thrown: a failed cleanup must not fail a save.
void clean_interrupted_saves(const std::filesystem::path& dir);

// Where DIR/TAG's files are: DIR/TAG when it holds a manifest, else an .old-TAG-* directory an interrupted
// replacement left (logged), else nullopt.
std::optional<std::filesystem::path> locate_checkpoint(const std::filesystem::path& dir, const std::string& tag);

// Moves the complete temp directory `temp` to DIR/TAG and makes that durable (fsync of DIR). An existing
// DIR/TAG is exchanged with it in one step where the file system can (renameat2 RENAME_EXCHANGE), else renamed
// to DIR/.old-TAG-<nonce> first. Returns the directory now holding the replaced checkpoint, to remove once
// DIR/latest is updated, or nullopt. Throws CheckpointError naming the paths. `try_exchange` = false takes the
// two-rename path (for tests of it).
std::optional<std::filesystem::path> commit_directory(const std::filesystem::path& temp,
                                                      const std::filesystem::path& dir, const std::string& tag,
                                                      uint64_t nonce, bool try_exchange = true);

// remove_all, logging instead of throwing.
void remove_quietly(const std::filesystem::path& path);

}  // namespace zero3::ckpt
