// Reading a config file with bounds, so that no path can hang or exhaust the reader: at most `max_bytes`
// bytes (a regular file larger than that is refused before it is read; /dev/zero and other endless
// sources stop at the cap), and for what is not a regular file (a pipe, a FIFO, a device) at most
// kConfigReadSeconds of waiting for input. A directory is named as one. Internal to the config reader.
#pragma once

#include <cstdint>
#include <string>

namespace zero3::config_detail {

// How long reading a pipe, FIFO or device may wait for its next bytes, in all.
inline constexpr int kConfigReadSeconds = 5;

// The bytes of the file at `path`. Throws ConfigError naming the path: cannot open, a directory, larger
// than max_bytes (with the size and the cap), no end of input within kConfigReadSeconds, a read error.
std::string read_config_file(const std::string& path, uint64_t max_bytes);

// "16777216 bytes (16 MiB)": a size as the messages write it.
std::string bytes_text(uint64_t bytes);

}  // namespace zero3::config_detail
