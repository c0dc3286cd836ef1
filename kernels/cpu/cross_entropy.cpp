// Fused softmax cross-entropy: loss and logits gradient in one call, row by row.
#include <algorithm>
#include <cmath>
#include <cstddef>

#include <zshard/error.h>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

namespace zshard::cpu {

template <class T>
double cross_entropy_forward_backward(T* dlogits, T* losses, const T* logits, const int32_t* targets, int N,
                                      int V, int ld, Compute<T> dloss) {
  ZS_CHECK(ld >= V, "cross_entropy: row stride ", ld, " below the row length ", V);
  double total = 0;
  for (int i = 0; i < N; ++i) {
    const T* x = logits + size_t(i) * ld;
    const int32_t target = targets[i];
    ZS_CHECK(target >= 0 && target < V, "cross_entropy: target ", target, " outside [0, ", V, ")");
    T mx = x[0];
    for (int j = 1; j < V; ++j) mx = std::max(mx, x[j]);
    // Read before the row is overwritten: dlogits may alias logits.
    const T x_target = x[target];
    T sum;
    if (dlogits) {
      T* d = dlogits + size_t(i) * ld;
      for (int j = 0; j < V; ++j) d[j] = detail::exp_nonpositive(x[j] - mx);
      sum = detail::sum_of(d, V);
      const T factor = dloss / sum;
      for (int j = 0; j < V; ++j) d[j] *= factor;
      d[target] -= dloss;
    } else {
      sum = detail::lane_sum<T>(V, [=](size_t j) { return detail::exp_nonpositive(x[j] - mx); });
    }
    const T loss = std::log(sum) + mx - x_target;
    losses[i] = loss;
    total += double(loss);
  }
  return total;
}

template double cross_entropy_forward_backward<float>(float*, float*, const float*, const int32_t*, int, int,
                                                      int, float);
template double cross_entropy_forward_backward<double>(double*, double*, const double*, const int32_t*, int,
                                                       int, int, double);

}  // namespace zshard::cpu
