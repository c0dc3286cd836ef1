// Vector helpers for the optimizer path: sum of squares (gradient norm) and axpy.
#include <cstddef>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

namespace zshard::cpu {

template <class T>
double sum_squares(const T* x, size_t n) {
  return detail::lane_sum<double>(n, [x](size_t i) { return double(x[i]) * double(x[i]); });
}

template <class T>
void axpy(T* y, const T* x, Compute<T> alpha, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

template double sum_squares<float>(const float*, size_t);
template double sum_squares<double>(const double*, size_t);
template void axpy<float>(float*, const float*, float, size_t);
template void axpy<double>(double*, const double*, double, size_t);

}  // namespace zshard::cpu
