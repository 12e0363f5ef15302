// A program outside the zero3 tree, built against the installed package.
#include <zero3/zero3.hpp>

#include <cstdio>

int main() {
  uint16_t b = zero3::f32_to_bf16(1.5f);
  std::printf("zero3 %s: bf16(1.5) = %g\n", zero3::version().c_str(), zero3::bf16_to_f32(b));
  return zero3::bf16_to_f32(b) == 1.5f ? 0 : 1;
}
