#include "ops/linear.hpp"

#include "ops/gemm.hpp"

namespace llama3 {

template <typename T>
void linear_forward(const T* x, int64_t ldx, const T* w, T* y, int64_t ldy, int64_t n, int64_t in, int64_t out) {
  gemm<T>(false, true, n, out, in, T(1), x, ldx, w, in, T(0), y, ldy);
}

template <typename T>
void linear_backward(const T* x, int64_t ldx, const T* w, const T* dy, int64_t lddy, T* dx, int64_t lddx, T* dw,
                     int64_t n, int64_t in, int64_t out, bool accumulate_dx) {
  if (dx != nullptr) gemm<T>(false, false, n, in, out, T(1), dy, lddy, w, in, accumulate_dx ? T(1) : T(0), dx, lddx);
  if (dw != nullptr) gemm<T>(true, false, out, in, n, T(1), dy, lddy, x, ldx, T(1), dw, in);
}

template void linear_forward<float>(const float*, int64_t, const float*, float*, int64_t, int64_t, int64_t, int64_t);
template void linear_forward<double>(const double*, int64_t, const double*, double*, int64_t, int64_t, int64_t,
                                     int64_t);
template void linear_backward<float>(const float*, int64_t, const float*, const float*, int64_t, float*, int64_t,
                                     float*, int64_t, int64_t, int64_t, bool);
template void linear_backward<double>(const double*, int64_t, const double*, const double*, int64_t, double*, int64_t,
                                      double*, int64_t, int64_t, int64_t, bool);

}  // namespace llama3
