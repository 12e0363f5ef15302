// The format's element types: names, widths, and the mapping to zero3's compute types.
#include <array>

#include "zero3/safetensors.hpp"

namespace zero3::safetensors {
namespace {

struct DtypeEntry {
  Dtype dtype;
  std::string_view name;
  int bits;
};

// In enum order, so that kDtypes[int(t)] describes t.
constexpr std::array<DtypeEntry, 22> kDtypes{{
    {Dtype::boolean, "BOOL", 8},
    {Dtype::u8, "U8", 8},
    {Dtype::i8, "I8", 8},
    {Dtype::u16, "U16", 16},
    {Dtype::i16, "I16", 16},
    {Dtype::u32, "U32", 32},
    {Dtype::i32, "I32", 32},
    {Dtype::u64, "U64", 64},
    {Dtype::i64, "I64", 64},
    {Dtype::f16, "F16", 16},
    {Dtype::bf16, "BF16", 16},
    {Dtype::f32, "F32", 32},
    {Dtype::f64, "F64", 64},
    {Dtype::c64, "C64", 64},
    {Dtype::f8_e4m3, "F8_E4M3", 8},
    {Dtype::f8_e5m2, "F8_E5M2", 8},
    {Dtype::f8_e8m0, "F8_E8M0", 8},
    {Dtype::f8_e4m3fnuz, "F8_E4M3FNUZ", 8},
    {Dtype::f8_e5m2fnuz, "F8_E5M2FNUZ", 8},
    {Dtype::f4, "F4", 4},
    {Dtype::f6_e2m3, "F6_E2M3", 6},
    {Dtype::f6_e3m2, "F6_E3M2", 6},
}};

constexpr bool table_in_enum_order() {
  for (size_t i = 0; i < kDtypes.size(); ++i) {
    if (static_cast<size_t>(kDtypes[i].dtype) != i) return false;
  }
  return true;
}
static_assert(table_in_enum_order(), "kDtypes must list the Dtype values in declaration order");

}  // namespace

int dtype_bits(Dtype t) { return kDtypes.at(static_cast<size_t>(t)).bits; }

std::string_view dtype_name(Dtype t) { return kDtypes.at(static_cast<size_t>(t)).name; }

std::optional<Dtype> dtype_from_name(std::string_view name) {
  for (const DtypeEntry& e : kDtypes) {
    if (e.name == name) return e.dtype;
  }
  return std::nullopt;
}

Dtype from_dtype(zero3::DType t) {
  switch (t) {
    case zero3::DType::f32:
      return Dtype::f32;
    case zero3::DType::bf16:
      return Dtype::bf16;
    case zero3::DType::f16:
      return Dtype::f16;
  }
  return Dtype::f32;
}

std::optional<zero3::DType> to_dtype(Dtype t) {
  switch (t) {
    case Dtype::f32:
      return zero3::DType::f32;
    case Dtype::bf16:
      return zero3::DType::bf16;
    case Dtype::f16:
      return zero3::DType::f16;
    default:
      return std::nullopt;
  }
}

}  // namespace zero3::safetensors
