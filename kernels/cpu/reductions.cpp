// Vector helpers for the optimizer path: sum of squares (gradient norm) and axpy.
#include <cstddef>

#include "kernels/cpu/ops.h"

namespace zshard::cpu {

template <class T>
double sum_squares(const T* x, size_t n) {
  // Independent partial sums: the compiler may vectorise them without reassociating (no -ffast-math).
  constexpr size_t kLanes = 8;
  double partial[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (size_t l = 0; l < kLanes; ++l) partial[l] += double(x[i + l]) * double(x[i + l]);
  double sum = 0;
  for (; i < n; ++i) sum += double(x[i]) * double(x[i]);
  for (double p : partial) sum += p;
  return sum;
}

template <class T>
void axpy(T* y, const T* x, T alpha, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

template double sum_squares<float>(const float*, size_t);
template double sum_squares<double>(const double*, size_t);
template void axpy<float>(float*, const float*, float, size_t);
template void axpy<double>(double*, const double*, double, size_t);

}  // namespace zshard::cpu
