#include "core/cpu_isa.hpp"

namespace zero3 {

std::string_view cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::scalar:
      return "scalar";
    case CpuIsa::avx2:
      return "avx2";
    case CpuIsa::avx512:
      return "avx512";
    case CpuIsa::best:
      return "best";
  }
  return "?";
}

bool cpu_isa_supported(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::scalar:
    case CpuIsa::best:
      return true;
#if defined(__x86_64__)
    case CpuIsa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    case CpuIsa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl");
#else
    case CpuIsa::avx2:
    case CpuIsa::avx512:
      return false;
#endif
  }
  return false;
}

CpuIsa cpu_isa_detect() {
  static const CpuIsa detected = [] {
    if (cpu_isa_supported(CpuIsa::avx512)) return CpuIsa::avx512;
    if (cpu_isa_supported(CpuIsa::avx2)) return CpuIsa::avx2;
    return CpuIsa::scalar;
  }();
  return detected;
}

}  // namespace zero3
