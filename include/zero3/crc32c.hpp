// CRC-32C (Castagnoli): the checksum zero3 records for every file of a checkpoint (manifest.json), also the
// one TFRecord files (TensorBoard event files) frame their records with. Hardware instructions where the
// processor has them (SSE4.2, the AArch64 CRC extension).
#pragma once

#include <cstddef>
#include <cstdint>

namespace zero3 {

// Continues a CRC-32C over `size` more bytes; crc = 0 starts one. crc32c("123456789", 9) == 0xE3069283.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

}  // namespace zero3
