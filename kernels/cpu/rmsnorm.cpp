// RMSNorm over the last dimension (Llama): no centring, no bias.
#include <cmath>
#include <cstddef>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

namespace zshard::cpu {

template <class T>
void rmsnorm_forward(T* out, Compute<T>* rstd, const T* inp, const T* weight, int N, int C, float eps) {
  for (int i = 0; i < N; ++i) {
    const T* x = inp + size_t(i) * C;
    T* o = out + size_t(i) * C;
    const T sq = detail::lane_sum<T>(C, [=](size_t c) { return x[c] * x[c]; });
    const T rs = T(1) / std::sqrt(sq / T(C) + T(eps));
    for (int c = 0; c < C; ++c) o[c] = x[c] * rs * weight[c];
    rstd[i] = rs;
  }
}

template <class T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const Compute<T>* rstd,
                      int N, int C) {
  for (int i = 0; i < N; ++i) {
    const T* x = inp + size_t(i) * C;
    const T* d = dout + size_t(i) * C;
    T* dx = dinp + size_t(i) * C;
    const T rs = rstd[i];
    // dx = rstd * (g - xhat * mean(g * xhat)) with g = dout * weight and xhat = x * rstd.
    const T gx_mean = detail::lane_sum<T>(C, [=](size_t c) { return d[c] * weight[c] * x[c] * rs; }) / T(C);
    if (dweight)  // null: a frozen gain
      for (int c = 0; c < C; ++c) dweight[c] += d[c] * x[c] * rs;
    for (int c = 0; c < C; ++c) dx[c] += rs * (d[c] * weight[c] - x[c] * rs * gx_mean);
  }
}

// A row at a time, as layernorm_residual_forward: residual_forward's and rmsnorm_forward's bits.
template <class T>
void rmsnorm_residual_forward(T* residual, T* out, Compute<T>* rstd, const T* a, const T* b, const T* weight, int N,
                              int C, float eps) {
  for (int i = 0; i < N; ++i) {
    const size_t row = size_t(i) * C;
    residual_forward(residual + row, a + row, b + row, size_t(C));
    rmsnorm_forward(out + row, rstd + i, residual + row, weight, 1, C, eps);
  }
}

#define ZS_INSTANTIATE(T)                                                                 \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int, int, float);          \
  template void rmsnorm_residual_forward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, float); \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int, int);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(double)
#undef ZS_INSTANTIATE

}  // namespace zshard::cpu
