// CRC-32C (Castagnoli), the checksum of every file of a checkpoint: the CRC of iSCSI, ext4 and Lustre, with
// hardware instructions on x86-64 (SSE4.2) and AArch64 (CRC extension), so checking a checkpoint runs near
// memory speed. Same value as Python's `crc32c` package, Google's crc32c library and `gsutil hash -c`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>

namespace zero3::ckpt {

// Continues a CRC-32C over `size` more bytes: crc32c_update(0, ...) starts one; the result of one call is the
// `crc` of the next. crc32c_update(0, "123456789", 9) == 0xE3069283.
uint32_t crc32c_update(uint32_t crc, const void* data, size_t size);

// The CRC of A followed by B, from crc(A), crc(B) and B's length, without the bytes.
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t size_b);

// Whether crc32c_update uses the processor's CRC instruction.
bool crc32c_hardware();

// CRC-32C and size of a whole file, read sequentially in large blocks. Throws IoError naming the file.
struct FileChecksum {
  uint64_t size = 0;
  uint32_t crc32c = 0;
};
FileChecksum checksum_file(const std::filesystem::path& path);

}  // namespace zero3::ckpt
