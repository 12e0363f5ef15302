// Pieces shared by the safetensors reader, writer and index code.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zero3/safetensors.hpp"

namespace zero3::safetensors::detail {

// A name from a file, fit for an error message: quoted, control bytes (and, when `ascii_only`, every byte
// >= 0x80) escaped as \xNN, and cut to 200 bytes, since a hostile file controls its names.
std::string printable(std::string_view name, bool ascii_only = false);

// shape_string, cut after 16 dimensions ("[1, 2, ..., 40 dims]") for messages about hostile files.
std::string short_shape(const std::vector<int64_t>& shape);

// Element count of a shape, or nullopt when it overflows int64 (or a dimension is negative).
std::optional<int64_t> checked_numel(const std::vector<int64_t>& shape);

// numel * bits, or nullopt on uint64 overflow.
std::optional<uint64_t> checked_bits(int64_t numel, int bits);

// Whether `s` is well-formed UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF).
bool valid_utf8(std::string_view s);

}  // namespace zero3::safetensors::detail
