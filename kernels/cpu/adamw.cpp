// AdamW, the PyTorch formula (decoupled weight decay, bias-corrected moments).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <type_traits>

#include <zshard/error.h>

#include "kernels/cpu/ops.h"

namespace zshard::cpu {

template <class T>
AdamWFactors<T> adamw_factors(const AdamWParams& hp) {
  ZS_CHECK(hp.step >= 1, "adamw: step is 1-based, got ", hp.step);
  // Scalars in double, then rounded once to T.
  const double bc1 = 1.0 - std::pow(double(hp.beta1), hp.step);
  const double bc2 = 1.0 - std::pow(double(hp.beta2), hp.step);
  return {{T(1), T(1.0 - double(hp.lr) * double(hp.weight_decay))},
          T(double(hp.lr) / bc1),
          T(1.0 / std::sqrt(bc2)),
          T(hp.beta1),
          T(hp.beta2),
          T(1.0 - double(hp.beta1)),
          T(1.0 - double(hp.beta2)),
          T(hp.eps)};
}

template <class T, class G>
void adamw_update(T* param, const G* grad, T* m, T* v, size_t n, const AdamWFactors<T>& f, bool decayed, T grad_scale,
                  bf16* param_bf16) {
  ZS_CHECK((!param_bf16 || std::is_same_v<T, float>), "adamw: the bf16 copy is written from an fp32 master");
  const T decay = f.decay[decayed ? 1 : 0], step_size = f.step_size, inv_sqrt_bc2 = f.inv_sqrt_bc2;
  const T b1 = f.b1, b2 = f.b2, one_minus_b1 = f.one_minus_b1, one_minus_b2 = f.one_minus_b2, eps = f.eps;
  // A block's scaled gradients go to a local array before any of its results are written: that is what
  // lets param_bf16 alias grad, and it leaves the update loop with nothing but T arithmetic to vectorise.
  constexpr size_t kBlock = 256;
  T g[kBlock];
  for (size_t begin = 0; begin < n; begin += kBlock) {
    const size_t len = std::min(kBlock, n - begin);
    for (size_t i = 0; i < len; ++i) g[i] = T(grad[begin + i]) * grad_scale;
    T* const p = param + begin;
    T* const mb = m + begin;
    T* const vb = v + begin;
    for (size_t i = 0; i < len; ++i) {
      const T mi = b1 * mb[i] + one_minus_b1 * g[i];
      const T vi = b2 * vb[i] + one_minus_b2 * g[i] * g[i];
      mb[i] = mi;
      vb[i] = vi;
      p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
    }
    if constexpr (std::is_same_v<T, float>)
      if (param_bf16)
        for (size_t i = 0; i < len; ++i) param_bf16[begin + i] = bf16(p[i]);
  }
}

template <class T, class G>
void adamw_step(T* param, const G* grad, T* m, T* v, size_t n, const AdamWParams& hp, bf16* param_bf16) {
  adamw_update(param, grad, m, v, n, adamw_factors<T>(hp), true, T(hp.grad_scale), param_bf16);
}

template AdamWFactors<float> adamw_factors<float>(const AdamWParams&);
template AdamWFactors<double> adamw_factors<double>(const AdamWParams&);
template void adamw_update<float, float>(float*, const float*, float*, float*, size_t, const AdamWFactors<float>&,
                                         bool, float, bf16*);
template void adamw_update<float, bf16>(float*, const bf16*, float*, float*, size_t, const AdamWFactors<float>&, bool,
                                        float, bf16*);
template void adamw_step<float, float>(float*, const float*, float*, float*, size_t, const AdamWParams&, bf16*);
template void adamw_step<float, bf16>(float*, const bf16*, float*, float*, size_t, const AdamWParams&, bf16*);
template void adamw_step<double, double>(double*, const double*, double*, double*, size_t, const AdamWParams&,
                                         bf16*);

}  // namespace zshard::cpu
