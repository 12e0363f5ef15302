#include "offload/cpu_adam.hpp"

#include <omp.h>

#include <algorithm>
#include <string>

#include "offload/cpu_adam_kernels.hpp"
#include "zero3/error.hpp"

namespace zero3 {
namespace detail {

void adam_chunk_scalar(float* p, const float* g, float* m, float* v, size_t n, const AdamStepConsts& c, void* copy_out,
                       DType copy_dtype) {
  // Three loops rather than a switch per element, so the compiler sees a plain loop in each.
  if (copy_out == nullptr) {
    for (size_t i = 0; i < n; ++i) adam_update(p[i], g[i], m[i], v[i], c);
  } else if (copy_dtype == DType::f32) {
    auto* out = static_cast<float*>(copy_out);
    for (size_t i = 0; i < n; ++i) {
      adam_update(p[i], g[i], m[i], v[i], c);
      out[i] = p[i];
    }
  } else if (copy_dtype == DType::bf16) {
    auto* out = static_cast<uint16_t*>(copy_out);
    for (size_t i = 0; i < n; ++i) {
      adam_update(p[i], g[i], m[i], v[i], c);
      out[i] = f32_to_bf16(p[i]);
    }
  } else {
    auto* out = static_cast<uint16_t*>(copy_out);
    for (size_t i = 0; i < n; ++i) {
      adam_update(p[i], g[i], m[i], v[i], c);
      out[i] = f32_to_f16(p[i]);
    }
  }
}

}  // namespace detail

namespace {

// Below this many elements a step is a few microseconds: starting threads would cost more than it saves.
constexpr size_t kMinParallelElements = size_t{1} << 15;
// Chunk boundaries on 64-byte multiples of fp32 so that threads do not share cache lines of p, m, v.
constexpr size_t kChunkAlign = 16;

}  // namespace

void cpu_adam_step(float* p, const float* g, float* m, float* v, size_t n, const AdamStepConsts& c, void* copy_out,
                   DType copy_dtype, CpuIsa isa, int num_threads) {
  if (isa == CpuIsa::best) isa = cpu_isa_detect();
  if (!cpu_isa_supported(isa)) {
    throw Unsupported("cpu_adam_step: this CPU does not support the " + std::string(cpu_isa_name(isa)) +
                      " path (best available: " + std::string(cpu_isa_name(cpu_isa_detect())) + ")");
  }
  if (num_threads < 0) {
    throw InvalidArgument("cpu_adam_step: num_threads = " + std::to_string(num_threads) +
                          ", expected 0 (OpenMP default) or a positive count");
  }
  if (n == 0) return;
  if (p == nullptr || g == nullptr || m == nullptr || v == nullptr) {
    throw InvalidArgument("cpu_adam_step: p, g, m and v must be non-null for n = " + std::to_string(n));
  }
  detail::AdamChunkFn fn = detail::adam_chunk_scalar;
#if defined(__x86_64__)
  if (isa == CpuIsa::avx512) fn = detail::adam_chunk_avx512;
  if (isa == CpuIsa::avx2) fn = detail::adam_chunk_avx2;
#endif
  if (num_threads == 0) num_threads = std::max(1, omp_get_max_threads());
  size_t threads = n < kMinParallelElements ? 1 : static_cast<size_t>(num_threads);
  if (threads == 1) {
    fn(p, g, m, v, n, c, copy_out, copy_dtype);
    return;
  }
  size_t chunk = (n + threads - 1) / threads;
  chunk = (chunk + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
  size_t copy_size = dtype_size(copy_dtype);
#pragma omp parallel num_threads(static_cast <int>(threads))
  {
    size_t begin = static_cast<size_t>(omp_get_thread_num()) * chunk;
    if (begin < n) {
      size_t len = std::min(chunk, n - begin);
      void* out = copy_out == nullptr ? nullptr : static_cast<char*>(copy_out) + begin * copy_size;
      fn(p + begin, g + begin, m + begin, v + begin, len, c, out, copy_dtype);
    }
  }
}

}  // namespace zero3
