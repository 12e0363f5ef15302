// The bf16 GEMM ceiling of this GPU, measured: cuBLAS's C = A B for square bf16 matrices with f32 accumulation (the
// GEMMs a bf16 training step is made of), timed with CUDA events over repeated calls after a warm-up. The GPU run
// (scripts/gpu-run.sh) prints MFU against this figure beside the datasheet's peak: what the kernels can reach on
// this machine at its clocks and power limit, not what NVIDIA lists.
//
//   bench_cuda_gemm [--n N] [--reps R]     (default N = 8192, R = 20)
//
// Prints one line "bf16 GEMM N^3 (cuBLAS, f32 accumulate): <ms> ms per call, <TFLOP/s> TFLOP/s" (2 N^3 FLOPs a
// call). Exits 77 with the reason when there is no CUDA device (or no CUDA in this build).
//
// The smallest run, in seconds (ctest label bench_smoke; tests/CMakeLists.txt reads these lines):
// zero3-bench-smoke: --n 256 --reps 2
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench/bench_main.hpp"
#include "zero3/build_config.hpp"

#if ZERO3_HAVE_CUDA

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdexcept>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(static_cast<int>(s)));
  }
}

struct Options {
  int n = 8192;
  int reps = 20;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--n" && i + 1 < argc) {
      o.n = std::atoi(argv[++i]);
    } else if (a == "--reps" && i + 1 < argc) {
      o.reps = std::atoi(argv[++i]);
    } else {
      throw std::invalid_argument("usage: bench_cuda_gemm [--n N] [--reps R]; got '" + a + "'");
    }
  }
  if (o.n < 64 || o.n % 8 != 0 || o.reps < 1) {
    throw std::invalid_argument("--n must be a multiple of 8 of at least 64 and --reps at least 1");
  }
  return o;
}

}  // namespace

int bench_main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    std::printf("skipped: no CUDA device: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    return 77;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const size_t n = static_cast<size_t>(opt.n), bytes = n * n * 2;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  check(cudaMalloc(&a, bytes), "cudaMalloc A");
  check(cudaMalloc(&b, bytes), "cudaMalloc B");
  check(cudaMalloc(&c, bytes), "cudaMalloc C");
  // 0x3c00 is bf16 1/128: finite products and sums at every size, so no call runs on special values.
  check(cudaMemset(a, 0x3c, bytes), "cudaMemset A");
  check(cudaMemset(b, 0x3c, bytes), "cudaMemset B");
  cublasHandle_t h = nullptr;
  check(cublasCreate(&h), "cublasCreate");
  const float one = 1.0f, zero = 0.0f;
  auto gemm = [&] {
    check(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, opt.n, opt.n, opt.n, &one, a, CUDA_R_16BF, opt.n, b, CUDA_R_16BF,
                       opt.n, &zero, c, CUDA_R_16BF, opt.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
  };
  for (int i = 0; i < 3; ++i) gemm();  // warm-up: cuBLAS picks and loads its kernel
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  check(cudaEventRecord(start), "cudaEventRecord");
  for (int i = 0; i < opt.reps; ++i) gemm();
  check(cudaEventRecord(stop), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float total_ms = 0;
  check(cudaEventElapsedTime(&total_ms, start, stop), "cudaEventElapsedTime");
  const double ms = static_cast<double>(total_ms) / opt.reps;
  const double tflops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / (ms * 1e9);
  std::printf("device: %s (cc %d.%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  std::printf("bf16 GEMM %d^3 (cuBLAS, f32 accumulate): %.3f ms per call, %.1f TFLOP/s (%d calls)\n", opt.n, ms, tflops,
              opt.reps);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cublasDestroy(h);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 0;
}

int main(int argc, char** argv) { return zero3::testing::run_main(argc, argv, bench_main); }

#else

int main() {
  std::printf("skipped: this build of zero3 has no CUDA backend (ZERO3_CUDA off or not found)\n");
  return 77;
}

#endif
