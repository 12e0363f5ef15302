// CPU Adam/AdamW over fp32 master weights and moments: the optimizer step of CPU and NVMe offload.
//
// One pass over memory: it reads p, g, m, v and writes p, m, v and (optionally) a copy of the updated p in
// the compute dtype, so each byte is moved once (16 B read + 12 B written + 2 B copy per bf16/f16
// parameter). The step is memory-bound; tests/bench/bench_cpu_adam.cpp compares it with a STREAM triad.
//
// Numerics: every path (AVX-512, AVX2, scalar) performs the operations of zero3::adam_update
// (optim/adam_math.hpp) in the same order with no fused multiply-add, so they all produce the same bits as
// the scalar reference. The 16-bit copy is the reference conversion zero3::f32_to_bf16 / f32_to_f16
// (round to nearest even, NaN stays NaN) of the updated p.
//
// Threads: the call splits [0, n) into chunks over num_threads OpenMP threads (0: omp_get_max_threads() of
// the calling thread; n below 32768 runs on the calling thread alone) and returns when every element is
// done. Different calls may run concurrently on disjoint arrays.
#pragma once

#include <cstddef>

#include "core/cpu_isa.hpp"
#include "optim/adam_math.hpp"
#include "zero3/dtype.hpp"

namespace zero3 {

// One Adam/AdamW step over n elements: p (fp32 master), g (fp32 gradient, already unscaled and clipped),
// m and v (fp32 moments), all of length n, updated in place except g. The arrays may have any alignment
// but must not overlap each other or copy_out.
//
// copy_out: nullptr, or n elements of copy_dtype that receive the updated p (f32 copies the value, bf16
// and f16 round to nearest even), written in the same pass.
// isa: a specific ISA the CPU does not support is an Unsupported error; `best` never fails.
// c: adam_step_consts(hyper, step) for this step.
// num_threads: 0 for the OpenMP default, otherwise the number of threads to use (negative: InvalidArgument).
void cpu_adam_step(float* p, const float* g, float* m, float* v, size_t n, const AdamStepConsts& c,
                   void* copy_out = nullptr, DType copy_dtype = DType::f32, CpuIsa isa = CpuIsa::best,
                   int num_threads = 0);

}  // namespace zero3
