// Number formatting shared by the plans' tables (memory_plan.cpp, traffic_plan.cpp).
#pragma once

#include <cstdint>
#include <string>

namespace zero3::detail {

// 1234567 -> "1,234,567".
inline std::string with_commas(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

}  // namespace zero3::detail
