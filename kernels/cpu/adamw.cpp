// AdamW, the PyTorch formula (decoupled weight decay, bias-corrected moments).
#include <cmath>
#include <cstddef>

#include "kernels/cpu/ops.h"
#include "kernels/error.h"

namespace zshard::cpu {

template <class T>
void adamw_step(T* param, const T* grad, T* m, T* v, size_t n, const AdamWParams& hp) {
  ZS_CHECK(hp.step >= 1, "adamw: step is 1-based, got ", hp.step);
  // Scalars in double, then rounded once to T.
  const double bc1 = 1.0 - std::pow(double(hp.beta1), hp.step);
  const double bc2 = 1.0 - std::pow(double(hp.beta2), hp.step);
  const T decay = T(1.0 - double(hp.lr) * double(hp.weight_decay));
  const T step_size = T(double(hp.lr) / bc1);
  const T inv_sqrt_bc2 = T(1.0 / std::sqrt(bc2));
  const T b1 = T(hp.beta1), b2 = T(hp.beta2);
  const T one_minus_b1 = T(1.0 - double(hp.beta1)), one_minus_b2 = T(1.0 - double(hp.beta2));
  const T eps = T(hp.eps), grad_scale = T(hp.grad_scale);
  for (size_t i = 0; i < n; ++i) {
    const T g = grad[i] * grad_scale;
    const T mi = b1 * m[i] + one_minus_b1 * g;
    const T vi = b2 * v[i] + one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] = param[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
  }
}

template void adamw_step<float>(float*, const float*, float*, float*, size_t, const AdamWParams&);
template void adamw_step<double>(double*, const double*, double*, double*, size_t, const AdamWParams&);

}  // namespace zshard::cpu
