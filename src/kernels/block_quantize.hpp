// Block quantization: values of the element types to int8 or int4 codes with one fp32 scale per block of
// elements. It is the wire format of ZeRO++'s quantized weight all-gather (qwZ) and quantized gradient
// reduction (qgZ); docs/quantization.md explains the choices and how they differ from DeepSpeed's.
//
// Per block, with x read as fp32, qmax = 127 (int8) or 7 (int4) and amax = max |x| over the block:
//   - some x is Inf or NaN:     scale = NaN, every code 0   -> every element of the block dequantizes to NaN
//   - amax < qmax * 2^-126:     scale = 0,   every code 0   -> every element dequantizes to +0 (zero or tiny
//                                                             block; the error is below 1.5e-36)
//   - otherwise:                scale = amax / qmax, q = clamp(rne(x * (qmax / amax)), -qmax, qmax)
// and the dequantized value is float(q) * scale, rounded to the destination type (nearest even). Symmetric:
// the codes -128 (int8) and -8 (int4) are never produced. The error of the fp32 value is at most
// scale/2 + amax * 2^-21 (half a step, plus the fp32 roundings of the scale, the product and the result).
//
// A message is the quantized form of one chunk of n elements, self-contained, so that one collective moves
// codes and scales together:
//   [codes: n bytes (int8) or ceil(n/2) bytes (int4)][zeros up to a multiple of 4][fp32 scale per block]
// Blocks are `block` elements from the chunk's start, the last one partial. int4 packs element 2j into the
// high nibble of byte j and element 2j+1 into its low nibble (DeepSpeed's PackedInt4 order), two's
// complement; an odd n leaves the last low nibble 0. The size is a multiple of 4, so messages laid back to
// back keep their scales aligned and can travel as fp32 elements.
//
// Single-source: the element functions below are ZERO3_HOST_DEVICE; the CPU drivers
// (block_quantize_cpu.hpp, with AVX-512/AVX2 bodies of the same bits) and the CUDA kernels
// (device/cuda/quantize_kernels.cu) both run them. Rounding assumes the default floating-point environment
// (round to nearest, no flush-to-zero), which is what both backends run in.
#pragma once

#include <cmath>
#include <cstdint>

#include "zero3/dtype.hpp"
#include "zero3/host_device.hpp"

namespace zero3 {

// How a message is quantized. bits: 8 or 4; block: elements per scale, at least 1, even for int4 (so that
// no byte holds codes of two blocks).
struct QuantFormat {
  int bits = 8;
  int64_t block = 2048;
};

ZERO3_HOST_DEVICE int quant_qmax(int bits) { return bits == 4 ? 7 : 127; }

// Blocks in a chunk of n elements.
ZERO3_HOST_DEVICE int64_t quant_blocks(int64_t n, int64_t block) { return (n + block - 1) / block; }

// Bytes of the codes of n elements (int4: element 2j and 2j+1 share byte j).
ZERO3_HOST_DEVICE int64_t quant_code_bytes(int64_t n, int bits) { return bits == 4 ? (n + 1) / 2 : n; }

// Byte offset of the scales in a message of n elements (the codes and their padding before them).
ZERO3_HOST_DEVICE int64_t quant_scales_offset(int64_t n, int bits) { return (quant_code_bytes(n, bits) + 3) / 4 * 4; }

// Bytes of the message of a chunk of n elements.
ZERO3_HOST_DEVICE int64_t quant_message_bytes(int64_t n, const QuantFormat& f) {
  return quant_scales_offset(n, f.bits) + 4 * quant_blocks(n, f.block);
}

// |x| as bits: for non-negative floats the unsigned order of the bits is the order of the values, Inf is
// 0x7f800000 and every NaN is above it, so the maximum over a block both finds amax and detects Inf/NaN.
ZERO3_HOST_DEVICE uint32_t quant_abs_bits(float x) { return f32_bits(x) & 0x7fffffffu; }

inline constexpr uint32_t kQuantNonFiniteBits = 0x7f800000u;
inline constexpr uint32_t kQuantNaNScaleBits = 0x7fc00000u;

// The scale of a block and the factor its codes are computed with; inv == 0 means every code is 0.
struct QuantScale {
  float scale;
  float inv;
};

// From the block's maximum of quant_abs_bits. The threshold keeps scale a normal float (so it is not
// rounded coarsely) and inv finite (<= 2^126).
ZERO3_HOST_DEVICE QuantScale quant_scale(uint32_t amax_bits, int bits) {
  if (amax_bits >= kQuantNonFiniteBits) return {f32_from_bits(kQuantNaNScaleBits), 0.0f};
  const float qmax = static_cast<float>(quant_qmax(bits));
  const float amax = f32_from_bits(amax_bits);
  if (amax < qmax * 0x1p-126f) return {0.0f, 0.0f};  // the product is exact
  return {amax / qmax, qmax / amax};
}

// The code of x in a block of factor inv (|x * inv| <= qmax up to rounding; the clamp keeps the range).
ZERO3_HOST_DEVICE int32_t quant_code(float x, float inv, int bits) {
  if (inv == 0.0f) return 0;
  const float qmax = static_cast<float>(quant_qmax(bits));
  float r = rintf(x * inv);  // nearest, ties to even
  if (r > qmax) r = qmax;
  if (r < -qmax) r = -qmax;
  return static_cast<int32_t>(r);
}

// int4: element 2j in the high nibble, 2j+1 in the low nibble.
ZERO3_HOST_DEVICE uint8_t quant_pack_int4(int32_t even, int32_t odd) {
  return static_cast<uint8_t>(((static_cast<uint32_t>(even) & 0xfu) << 4) | (static_cast<uint32_t>(odd) & 0xfu));
}
ZERO3_HOST_DEVICE int32_t quant_int4_even(uint8_t byte) { return static_cast<int32_t>((byte >> 4) ^ 8u) - 8; }
ZERO3_HOST_DEVICE int32_t quant_int4_odd(uint8_t byte) { return static_cast<int32_t>((byte & 0xfu) ^ 8u) - 8; }

// Code of element i of a chunk's codes.
ZERO3_HOST_DEVICE int32_t quant_code_at(const uint8_t* codes, int64_t i, int bits) {
  if (bits == 8) return static_cast<int8_t>(codes[i]);
  uint8_t byte = codes[i / 2];
  return (i & 1) == 0 ? quant_int4_even(byte) : quant_int4_odd(byte);
}

ZERO3_HOST_DEVICE float dequant_value(int32_t code, float scale) { return static_cast<float>(code) * scale; }

// Scale of block b of a message (memcpy: a message may start at any 4-byte boundary).
ZERO3_HOST_DEVICE float quant_scale_at(const uint8_t* message, int64_t n, int bits, int64_t b) {
  float s;
  memcpy(&s, message + quant_scales_offset(n, bits) + 4 * b, 4);
  return s;
}

// Element i of a chunk of n elements, dequantized to fp32 from its message.
ZERO3_HOST_DEVICE float dequant_element(const uint8_t* message, int64_t n, const QuantFormat& f, int64_t i) {
  return dequant_value(quant_code_at(message, i, f.bits), quant_scale_at(message, n, f.bits, i / f.block));
}

// Throws InvalidArgument naming `op` and the argument unless bits is 4 or 8, block >= 1 (even for int4),
// chunk >= 0 and chunks >= 0. Host only (src/kernels/block_quantize_cpu.cpp).
void check_quant_args(const char* op, const QuantFormat& f, int64_t chunk, int64_t chunks);

}  // namespace zero3
