// The engine's cost on a GPU for a model of transformer-shaped units, against two bounds measured in the
// same run:
//
//   overhead     step time with ZeRO stage 3 (every layer gathered before use, released after, gradients
//                reduce-scattered) over step time with all parameters resident (stage 0);
//   hidden comm  how much of what stage 3 adds to a step (its gathers, reduce-scatters and their ordering)
//                disappears behind compute: 1 - exposed / alone, where alone = stage 3 minus stage 0 step time
//                with no GEMMs, and exposed = the same difference with the GEMMs. The GEMMs alone (no engine)
//                are timed too, as the compute bound.
//
// Each layer is one unit of 12 d^2 parameters (attention 4 d^2, MLP 8 d^2), bf16 compute with fp32 master
// weights and gradients; a step is forward (one GEMM per parameter over T tokens), backward (two GEMMs per
// parameter: input and weight gradients, the latter into the engine's gradient view) and the optimizer.
// The GEMMs run on cuBLAS on the device's default stream, where the engine expects compute.
//
//   bench_cuda_engine [--layers L] [--hidden d] [--tokens T] [--steps S]   (default 8, 2048, 4096, 10)
//
// One process, one GPU: the NCCL communicator has one rank, so a gather is a device-to-device copy and
// the figures measure the engine's own overhead (scheduling, copies, stream ordering), not a network.
// Exits 77 with the reason when there is no CUDA device.
//
// The smallest run, in seconds (ctest label bench_smoke; tests/CMakeLists.txt reads these lines):
// zero3-bench-smoke: --layers 2 --hidden 256 --tokens 256 --steps 2
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "bench/bench_main.hpp"
#include "zero3/build_config.hpp"

#if ZERO3_HAVE_CUDA && ZERO3_HAVE_NCCL

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "device/cuda/cuda_device.hpp"
#include "support/engine_world.hpp"
#include "zero3/comm.hpp"
#include "zero3/engine.hpp"

using namespace zero3;

namespace {

struct Options {
  int layers = 8;
  int64_t hidden = 2048;
  int64_t tokens = 4096;
  int steps = 10;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "usage: %s [--layers L] [--hidden d] [--tokens T] [--steps S]\n", argv[0]);
      std::exit(2);
    }
    long long v = std::atoll(argv[++i]);
    if (a == "--layers") {
      o.layers = static_cast<int>(v);
    } else if (a == "--hidden") {
      o.hidden = v;
    } else if (a == "--tokens") {
      o.tokens = v;
    } else if (a == "--steps") {
      o.steps = static_cast<int>(v);
    } else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      std::exit(2);
    }
  }
  if (o.layers < 1 || o.hidden < 64 || o.tokens < 1 || o.steps < 1) {
    std::fprintf(stderr, "need --layers >= 1, --hidden >= 64, --tokens >= 1, --steps >= 1\n");
    std::exit(2);
  }
  return o;
}

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s failed: cuBLAS status %d\n", what, static_cast<int>(s));
    std::exit(1);
  }
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// The activations the GEMMs read and write (bf16, row-major), allocated once.
struct Activations {
  void* x = nullptr;   // (T, d)
  void* y = nullptr;   // (T, 8d): the widest output
  void* dx = nullptr;  // (T, d)
};

// Row-major Y(T, m) = X(T, k) W(m, k)^T, bf16 in, out_type out, fp32 accumulation.
void gemm_xwt(cublasHandle_t h, const void* x, const void* w, void* y, int64_t T, int64_t m, int64_t k) {
  const float one = 1.0f, zero = 0.0f;
  // Column-major view: Y^T(m, T) = W(m, k) X^T(k, T).
  check(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m), static_cast<int>(T), static_cast<int>(k), &one,
                     w, CUDA_R_16BF, static_cast<int>(k), x, CUDA_R_16BF, static_cast<int>(k), &zero, y, CUDA_R_16BF,
                     static_cast<int>(m), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx (forward)");
}

// Row-major dW(m, k) += dY(T, m)^T X(T, k), fp32 out (the engine's gradient view).
void gemm_dw(cublasHandle_t h, const void* dy, const void* x, float* dw, int64_t T, int64_t m, int64_t k) {
  const float one = 1.0f;
  // Column-major: dW^T(k, m) = X^T(k, T) dY(T, m).
  check(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(k), static_cast<int>(m), static_cast<int>(T), &one,
                     x, CUDA_R_16BF, static_cast<int>(k), dy, CUDA_R_16BF, static_cast<int>(m), &one, dw, CUDA_R_32F,
                     static_cast<int>(k), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx (weight gradient)");
}

// Row-major dX(T, k) = dY(T, m) W(m, k).
void gemm_dx(cublasHandle_t h, const void* dy, const void* w, void* dx, int64_t T, int64_t m, int64_t k) {
  const float one = 1.0f, zero = 0.0f;
  check(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(k), static_cast<int>(T), static_cast<int>(m), &one,
                     w, CUDA_R_16BF, static_cast<int>(k), dy, CUDA_R_16BF, static_cast<int>(m), &zero, dx, CUDA_R_16BF,
                     static_cast<int>(k), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx (input gradient)");
}

const int64_t kWidths[2] = {4, 8};  // attention (4d, d), MLP (8d, d)
const char* kNames[2] = {"attn", "mlp"};

Config engine_config(int stage, int64_t unit_numel) {
  Config c;
  c.zero.stage = stage;
  c.bf16.enabled = true;
  c.gradient_accumulation_steps = 1;
  c.train_micro_batch_size_per_gpu = 1;
  c.gradient_clipping = 1.0;
  c.optimizer.present = true;
  c.optimizer.type = OptimizerType::adamw;
  c.optimizer.lr = 1e-4;
  c.zero.reduce_bucket_size = unit_numel;
  c.zero.prefetch_bucket_size = unit_numel;  // one layer ahead
  c.zero.param_persistence_threshold = 0;
  c.zero.overlap_comm = true;
  c.zero.overlap_comm_set = true;
  return c;
}

// One training step's compute on the views of the scopes (with_engine) or on fixed buffers (without).
class Model {
 public:
  Model(const Options& o, cublasHandle_t h, Activations a) : o_(o), h_(h), a_(a) {}

  void forward(const void* w_attn, const void* w_mlp) {
    const void* w[2] = {w_attn, w_mlp};
    for (int p = 0; p < 2; ++p) gemm_xwt(h_, a_.x, w[p], a_.y, o_.tokens, kWidths[p] * o_.hidden, o_.hidden);
  }
  void backward(const void* w_attn, const void* w_mlp, float* g_attn, float* g_mlp) {
    const void* w[2] = {w_attn, w_mlp};
    float* g[2] = {g_attn, g_mlp};
    for (int p = 0; p < 2; ++p) {
      gemm_dw(h_, a_.y, a_.x, g[p], o_.tokens, kWidths[p] * o_.hidden, o_.hidden);
      gemm_dx(h_, a_.y, w[p], a_.dx, o_.tokens, kWidths[p] * o_.hidden, o_.hidden);
    }
  }

 private:
  Options o_;
  cublasHandle_t h_;
  Activations a_;
};

double seconds_per_step(int steps, const std::function<void()>& step) {
  step();  // warm-up: the engine records its order, caches fill
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) step();
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
}

struct EngineTiming {
  double step_s = 0;
  int64_t peak_bytes = 0;
};

EngineTiming time_engine(const Options& o, int stage, bool compute, Device& device, std::shared_ptr<Communicator> comm,
                         Model& model) {
  const int64_t d = o.hidden;
  Config c = engine_config(stage, 12 * d * d);
  Engine engine(zero3::testing::resolved_for(c, *comm), comm, device);
  std::vector<UnitId> units;
  for (int l = 0; l < o.layers; ++l) {
    UnitId u = engine.add_unit("layers." + std::to_string(l));
    for (int p = 0; p < 2; ++p) engine.add_param(u, {kNames[p], {kWidths[p] * d, d}, ParamInit::normal(0.02)});
    units.push_back(u);
  }
  engine.materialize();
  auto step = [&] {
    for (UnitId u : units) {
      auto s = engine.forward_scope(u);
      if (compute) model.forward(s.param("attn").data, s.param("mlp").data);
    }
    for (auto it = units.rbegin(); it != units.rend(); ++it) {
      auto s = engine.backward_scope(*it);
      if (compute) {
        model.backward(s.param("attn").data, s.param("mlp").data, s.grad("attn").as<float>(),
                       s.grad("mlp").as<float>());
      }
    }
    engine.step();
  };
  EngineTiming t;
  t.step_s = seconds_per_step(o.steps, step);
  t.peak_bytes = engine.memory().peak_total;
  return t;
}

}  // namespace

int bench_main(int argc, char** argv) {
  Options o = parse(argc, argv);
  std::string why;
  if (detail::cuda_device_count(&why) == 0) {
    std::printf("skipped: no CUDA device: %s\n", why.c_str());
    return 77;
  }
  detail::CudaDevice device(0);
  CommOptions co;
  co.backend = "nccl";
  co.device = 0;
  LaunchInfo launch;
  launch.launcher = "bench";
  std::shared_ptr<Communicator> comm(make_communicator(co, launch, nullptr));

  cublasHandle_t h;
  check(cublasCreate(&h), "cublasCreate");
  check(cublasSetStream(h, reinterpret_cast<cudaStream_t>(device.default_stream())), "cublasSetStream");
  const int64_t d = o.hidden, T = o.tokens;
  Activations a;
  check(cudaMalloc(&a.x, static_cast<size_t>(T * d) * 2), "cudaMalloc");
  check(cudaMalloc(&a.y, static_cast<size_t>(T * 8 * d) * 2), "cudaMalloc");
  check(cudaMalloc(&a.dx, static_cast<size_t>(T * d) * 2), "cudaMalloc");
  check(cudaMemset(a.x, 0, static_cast<size_t>(T * d) * 2), "cudaMemset");
  check(cudaMemset(a.y, 0, static_cast<size_t>(T * 8 * d) * 2), "cudaMemset");
  Model model(o, h, a);

  const int64_t params = 12 * d * d * o.layers;
  std::printf("device: %s; %d layers of 12 x %lld^2 = %.1f M parameters (%.2f B total), %lld tokens per step\n",
              device.properties().name, o.layers, static_cast<long long>(d), 12.0 * d * d / 1e6, params / 1e9,
              static_cast<long long>(T));
  std::printf("bf16 compute, fp32 master weights and gradients, AdamW on the GPU; NCCL with one rank\n\n");

  // The GEMMs alone, on fixed weight and gradient buffers.
  void* w_attn = nullptr;
  void* w_mlp = nullptr;
  float* g_attn = nullptr;
  float* g_mlp = nullptr;
  check(cudaMalloc(&w_attn, static_cast<size_t>(4 * d * d) * 2), "cudaMalloc");
  check(cudaMalloc(&w_mlp, static_cast<size_t>(8 * d * d) * 2), "cudaMalloc");
  check(cudaMalloc(reinterpret_cast<void**>(&g_attn), static_cast<size_t>(4 * d * d) * 4), "cudaMalloc");
  check(cudaMalloc(reinterpret_cast<void**>(&g_mlp), static_cast<size_t>(8 * d * d) * 4), "cudaMalloc");
  const double compute_s = seconds_per_step(o.steps, [&] {
    for (int l = 0; l < o.layers; ++l) model.forward(w_attn, w_mlp);
    for (int l = 0; l < o.layers; ++l) model.backward(w_attn, w_mlp, g_attn, g_mlp);
  });
  const double flops = 6.0 * static_cast<double>(T) * static_cast<double>(params);

  EngineTiming resident = time_engine(o, 0, true, device, comm, model);
  EngineTiming zero3 = time_engine(o, 3, true, device, comm, model);
  EngineTiming comm_only = time_engine(o, 3, false, device, comm, model);
  EngineTiming resident_only = time_engine(o, 0, false, device, comm, model);

  std::printf("%-44s %10s %12s\n", "run", "ms/step", "peak MiB");
  std::printf("%-44s %10.2f %12s   (%.0f TFLOP/s)\n", "GEMMs alone (no engine)", compute_s * 1e3, "-",
              flops / compute_s / 1e12);
  std::printf("%-44s %10.2f %12.0f\n", "stage 0: all parameters resident", resident.step_s * 1e3,
              resident.peak_bytes / 1048576.0);
  std::printf("%-44s %10.2f %12.0f\n", "stage 3: gathered per layer", zero3.step_s * 1e3, zero3.peak_bytes / 1048576.0);
  std::printf("%-44s %10.2f %12.0f\n", "stage 3 without GEMMs (communication, step)", comm_only.step_s * 1e3,
              comm_only.peak_bytes / 1048576.0);
  std::printf("%-44s %10.2f %12.0f\n", "stage 0 without GEMMs (step)", resident_only.step_s * 1e3,
              resident_only.peak_bytes / 1048576.0);
  std::printf("\noverhead: stage 3 / stage 0 step time = %.3f\n", zero3.step_s / resident.step_s);
  // What stage 3 adds over stage 0 when nothing hides it, and how much of it the GEMMs hid.
  const double comm_s = comm_only.step_s - resident_only.step_s;
  const double exposed = zero3.step_s - resident.step_s;
  if (comm_s > 0) {
    double hidden = 1.0 - exposed / comm_s;
    hidden = hidden < 0 ? 0 : hidden > 1 ? 1 : hidden;
    std::printf("communication of stage 3: %.2f ms/step alone, %.2f ms exposed with compute: %.0f%% hidden\n",
                comm_s * 1e3, exposed * 1e3, 100.0 * hidden);
  } else {
    std::printf("communication of stage 3: not measurable against stage 0 (%.3f ms)\n", comm_s * 1e3);
  }
  cudaFree(w_attn);
  cudaFree(w_mlp);
  cudaFree(g_attn);
  cudaFree(g_mlp);
  cudaFree(a.x);
  cudaFree(a.y);
  cudaFree(a.dx);
  cublasDestroy(h);
  return 0;
}

int main(int argc, char** argv) { return zero3::testing::run_main(argc, argv, bench_main); }

#else

int main() {
  std::printf("skipped: this build of zero3 has no CUDA and NCCL backends\n");
  return 77;
}

#endif
