// Fused softmax cross-entropy, forward and backward in one pass over the logits.
#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels/cpu/ops.h"
#include "kernels/error.h"

namespace zshard::cpu {

template <class T>
double cross_entropy_forward_backward(T* dlogits, T* losses, const T* logits, const int32_t* targets, int N,
                                      int V, T dloss) {
  double total = 0;
  for (int i = 0; i < N; ++i) {
    const T* x = logits + size_t(i) * V;
    const int32_t target = targets[i];
    ZS_CHECK(target >= 0 && target < V, "cross_entropy: target ", target, " outside [0, ", V, ")");
    T mx = x[0];
    for (int j = 1; j < V; ++j) mx = std::max(mx, x[j]);
    // Read before the row is overwritten: dlogits may alias logits.
    const T x_target = x[target];
    T sum = 0;
    if (dlogits) {
      T* d = dlogits + size_t(i) * V;
      for (int j = 0; j < V; ++j) {
        const T e = std::exp(x[j] - mx);
        d[j] = e;
        sum += e;
      }
      const T factor = dloss / sum;
      for (int j = 0; j < V; ++j) d[j] *= factor;
      d[target] -= dloss;
    } else {
      for (int j = 0; j < V; ++j) sum += std::exp(x[j] - mx);
    }
    const T loss = std::log(sum) + mx - x_target;
    losses[i] = loss;
    total += double(loss);
  }
  return total;
}

template double cross_entropy_forward_backward<float>(float*, float*, const float*, const int32_t*, int, int,
                                                      float);
template double cross_entropy_forward_backward<double>(double*, double*, const double*, const int32_t*, int,
                                                       int, double);

}  // namespace zshard::cpu
