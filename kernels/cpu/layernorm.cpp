// LayerNorm over the last dimension, biased variance (as PyTorch), eps = kLayerNormEps.
#include <cmath>
#include <cstddef>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

namespace zshard::cpu {

template <class T>
void layernorm_forward(T* out, Compute<T>* mean, Compute<T>* rstd, const T* inp, const T* weight, const T* bias,
                       int N, int C) {
  for (int i = 0; i < N; ++i) {
    const T* x = inp + size_t(i) * C;
    T* o = out + size_t(i) * C;
    const T mu = detail::sum_of(x, C) / T(C);
    // Two passes: the variance of centred values does not cancel catastrophically.
    const T sq = detail::lane_sum<T>(C, [=](size_t c) { return (x[c] - mu) * (x[c] - mu); });
    const T rs = T(1) / std::sqrt(sq / T(C) + T(kLayerNormEps));
    for (int c = 0; c < C; ++c) o[c] = (x[c] - mu) * rs * weight[c] + bias[c];
    mean[i] = mu;
    rstd[i] = rs;
  }
}

template <class T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const Compute<T>* mean, const Compute<T>* rstd, int N, int C) {
  for (int i = 0; i < N; ++i) {
    const T* x = inp + size_t(i) * C;
    const T* d = dout + size_t(i) * C;
    T* dx = dinp + size_t(i) * C;
    const T mu = mean[i], rs = rstd[i];
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dout * weight.
    const T g_mean = detail::lane_sum<T>(C, [=](size_t c) { return d[c] * weight[c]; }) / T(C);
    const T gx_mean =
        detail::lane_sum<T>(C, [=](size_t c) { return d[c] * weight[c] * (x[c] - mu) * rs; }) /
        T(C);
    // A loop per array written keeps the compiler's runtime alias checks affordable; a frozen gain or
    // bias (null) is skipped.
    if (dbias)
      for (int c = 0; c < C; ++c) dbias[c] += d[c];
    if (dweight)
      for (int c = 0; c < C; ++c) dweight[c] += d[c] * (x[c] - mu) * rs;
    for (int c = 0; c < C; ++c) dx[c] += rs * (d[c] * weight[c] - g_mean - (x[c] - mu) * rs * gx_mean);
  }
}

// A row at a time, so that the row just summed is still in cache when it is normalised; each row is
// residual_forward's and layernorm_forward's own arithmetic, so the bits are theirs.
template <class T>
void layernorm_residual_forward(T* residual, T* out, Compute<T>* mean, Compute<T>* rstd, const T* a, const T* b,
                                const T* weight, const T* bias, int N, int C) {
  for (int i = 0; i < N; ++i) {
    const size_t row = size_t(i) * C;
    residual_forward(residual + row, a + row, b + row, size_t(C));
    layernorm_forward(out + row, mean + i, rstd + i, residual + row, weight, bias, 1, C);
  }
}

#define ZS_INSTANTIATE(T)                                                                               \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, int, int);               \
  template void layernorm_residual_forward<T>(T*, T*, T*, T*, const T*, const T*, const T*, const T*, int, int); \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, int, \
                                      int);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(double)
#undef ZS_INSTANTIATE

}  // namespace zshard::cpu
