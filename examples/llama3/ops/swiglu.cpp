#include "ops/swiglu.hpp"

#include "kernel_math/swiglu_math.hpp"
#include "ops/parallel.hpp"

namespace llama3 {

template <typename T>
void swiglu_forward(const T* gu, T* h, int64_t rows, int64_t inter) {
#pragma omp parallel for schedule(static) if (rows * inter >= kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) {
    const T* g = gu + r * 2 * inter;
    const T* u = g + inter;
    T* hr = h + r * inter;
    for (int64_t i = 0; i < inter; ++i) hr[i] = kernel_math::swiglu_forward_elem(g[i], u[i]);
  }
}

template <typename T>
void swiglu_backward(const T* gu, const T* dh, T* dgu, int64_t rows, int64_t inter) {
#pragma omp parallel for schedule(static) if (rows * inter >= kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) {
    const T* g = gu + r * 2 * inter;
    const T* u = g + inter;
    const T* dhr = dh + r * inter;
    T* dg = dgu + r * 2 * inter;
    T* du = dg + inter;
    for (int64_t i = 0; i < inter; ++i) {
      const kernel_math::SwigluGrad<T> d = kernel_math::swiglu_backward_elem(g[i], u[i], dhr[i]);
      dg[i] = d.dg;
      du[i] = d.du;
    }
  }
}

template void swiglu_forward<float>(const float*, float*, int64_t, int64_t);
template void swiglu_forward<double>(const double*, double*, int64_t, int64_t);
template void swiglu_backward<float>(const float*, const float*, float*, int64_t, int64_t);
template void swiglu_backward<double>(const double*, const double*, double*, int64_t, int64_t);

}  // namespace llama3
