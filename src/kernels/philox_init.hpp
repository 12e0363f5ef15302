// Counter-based parameter initialisation: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy
// as 1, 2, 3", SC'11), keyed by the run's seed, with the parameter's stream id and the element's index in
// the counter. Element i of a parameter gets the same value whichever rank fills it and however the
// parameter is sliced, so the initial model is the same bits for any world size.
//
//   key     = (seed low 32 bits, seed high 32 bits)
//   counter = (block low, block high, stream low, stream high),  block = element index / 4
//   lane    = element index % 4 picks one of the four 32-bit outputs
//
// Values are computed in double and rounded once to float, with explicit fma where a product meets a sum,
// so a compiler's contraction choices cannot change the bits. zeros/ones/constant/uniform are bit-identical
// on every backend; normal uses log/sin/cos, whose last double bit may differ between libm and CUDA's math
// library, which changes the float result only when that bit decides the rounding (about 1 in 2^29).
//
// Single-source: every function here is ZERO3_HOST_DEVICE; the CPU driver below runs philox_fill_block in
// an OpenMP loop and the CUDA backend launches one thread per block of four elements.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

#include "zero3/host_device.hpp"

namespace zero3 {

struct Philox4x32 {
  uint32_t v[4];
};

inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
inline constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // golden ratio
inline constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;  // sqrt(3) - 1

// One Philox4x32-10 evaluation: 10 rounds, the key bumped by the Weyl constants between rounds.
ZERO3_HOST_DEVICE Philox4x32 philox4x32_10(Philox4x32 ctr, uint32_t key0, uint32_t key1) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key0 += kPhiloxW0;
      key1 += kPhiloxW1;
    }
    uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * ctr.v[0];
    uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * ctr.v[2];
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    ctr = Philox4x32{{hi1 ^ ctr.v[1] ^ key0, lo1, hi0 ^ ctr.v[3] ^ key1, lo0}};
  }
  return ctr;
}

// The four raw outputs for elements [4*block, 4*block + 4) of stream `stream` under `seed`.
ZERO3_HOST_DEVICE Philox4x32 philox_block(uint64_t seed, uint64_t stream, uint64_t block) {
  Philox4x32 ctr{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), static_cast<uint32_t>(stream),
                  static_cast<uint32_t>(stream >> 32)}};
  return philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// A 32-bit output as a uniform in [0, 1): its top 24 bits, so every value is an exact float.
ZERO3_HOST_DEVICE double philox_uniform01(uint32_t x) { return static_cast<double>(x >> 8) * 0x1p-24; }

// A 32-bit output as a uniform in (0, 1], for the logarithm in Box-Muller.
ZERO3_HOST_DEVICE double philox_uniform01_open0(uint32_t x) { return (static_cast<double>(x) + 1.0) * 0x1p-32; }

enum class FillKind : uint8_t { zeros, ones, constant, normal, uniform };

// What to fill with. Only the fields of `kind` are read. Build one with the named constructors.
struct FillSpec {
  FillKind kind = FillKind::zeros;
  double value = 0.0;               // constant
  double mean = 0.0, stddev = 1.0;  // normal(mean, stddev)
  double low = 0.0, high = 1.0;     // uniform on [low, high) (high itself may appear after rounding to float)

  static constexpr FillSpec zeros() { return FillSpec{}; }
  static constexpr FillSpec ones() {
    FillSpec s;
    s.kind = FillKind::ones;
    return s;
  }
  static constexpr FillSpec constant(double value) {
    FillSpec s;
    s.kind = FillKind::constant;
    s.value = value;
    return s;
  }
  static constexpr FillSpec normal(double mean, double stddev) {
    FillSpec s;
    s.kind = FillKind::normal;
    s.mean = mean;
    s.stddev = stddev;
    return s;
  }
  static constexpr FillSpec uniform(double low, double high) {
    FillSpec s;
    s.kind = FillKind::uniform;
    s.low = low;
    s.high = high;
    return s;
  }
};

// The values of elements [4*block, 4*block + 4). Normals come in Box-Muller pairs: lanes (0, 1) from
// outputs (0, 1), lanes (2, 3) from outputs (2, 3).
ZERO3_HOST_DEVICE void philox_fill_block(const FillSpec& spec, uint64_t seed, uint64_t stream, uint64_t block,
                                         float out[4]) {
  switch (spec.kind) {
    case FillKind::zeros:
      for (int i = 0; i < 4; ++i) out[i] = 0.0f;
      return;
    case FillKind::ones:
      for (int i = 0; i < 4; ++i) out[i] = 1.0f;
      return;
    case FillKind::constant:
      for (int i = 0; i < 4; ++i) out[i] = static_cast<float>(spec.value);
      return;
    case FillKind::uniform: {
      Philox4x32 r = philox_block(seed, stream, block);
      double width = spec.high - spec.low;
      for (int i = 0; i < 4; ++i) out[i] = static_cast<float>(::fma(width, philox_uniform01(r.v[i]), spec.low));
      return;
    }
    case FillKind::normal: {
      Philox4x32 r = philox_block(seed, stream, block);
      constexpr double kTwoPi = 6.283185307179586476925286766559;
      for (int pair = 0; pair < 2; ++pair) {
        double radius = ::sqrt(-2.0 * ::log(philox_uniform01_open0(r.v[2 * pair])));
        double angle = kTwoPi * philox_uniform01(r.v[2 * pair + 1]);
        out[2 * pair] = static_cast<float>(::fma(spec.stddev, radius * ::cos(angle), spec.mean));
        out[2 * pair + 1] = static_cast<float>(::fma(spec.stddev, radius * ::sin(angle), spec.mean));
      }
      return;
    }
  }
}

// Element `index` alone (computes its whole block; prefer philox_fill_block in loops).
ZERO3_HOST_DEVICE float philox_fill_value(const FillSpec& spec, uint64_t seed, uint64_t stream, uint64_t index) {
  float block[4];
  philox_fill_block(spec, seed, stream, index / 4, block);
  return block[index % 4];
}

// A parameter's stream id from its name (64-bit FNV-1a), so the id does not depend on declaration order
// or on how parameters are grouped into units.
constexpr uint64_t philox_stream_id(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// CPU driver: writes elements [begin, end) of the parameter to out[0, end - begin), in an OpenMP loop.
// Throws InvalidArgument when begin < 0 or end < begin. `out` must hold end - begin floats.
void philox_fill_cpu(const FillSpec& spec, uint64_t seed, uint64_t stream, int64_t begin, int64_t end, float* out);

}  // namespace zero3
