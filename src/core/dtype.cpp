#include "zero3/dtype.hpp"

namespace zero3 {

std::optional<DType> parse_dtype(std::string_view n) {
  if (n == "f32" || n == "fp32" || n == "float32" || n == "float") return DType::f32;
  if (n == "bf16" || n == "bfloat16") return DType::bf16;
  if (n == "f16" || n == "fp16" || n == "float16" || n == "half") return DType::f16;
  return std::nullopt;
}

}  // namespace zero3
