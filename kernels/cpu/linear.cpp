// Linear layer in the Conv1D layout: out(N,OC) = inp(N,C) @ W(C,OC) + b.
#include <cstddef>

#include <zshard/error.h>

#include "kernels/cpu/ops.h"

namespace zshard::cpu {

template <class T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC) {
  T beta = 0;
  if (bias) {
    // Seed the output with the bias so the GEMM adds onto it (beta = 1): no second pass.
    for (int i = 0; i < N; ++i) {
      T* o = out + size_t(i) * OC;
      for (int j = 0; j < OC; ++j) o[j] = bias[j];
    }
    beta = 1;
  }
  gemm<T>(false, false, N, OC, C, T(1), inp, C, weight, OC, beta, out, OC);
}

template <class T>
void linear_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int N,
                     int C, int OC) {
  ZS_CHECK(dinp && dweight, "linear_backward: dinp and dweight are required");
  gemm<T>(false, true, N, C, OC, T(1), dout, OC, weight, OC, T(1), dinp, C);     // dinp += dout @ W^T
  gemm<T>(true, false, C, OC, N, T(1), inp, C, dout, OC, T(1), dweight, OC);     // dW += inp^T @ dout
  if (dbias) {
    for (int i = 0; i < N; ++i) {
      const T* d = dout + size_t(i) * OC;
      for (int j = 0; j < OC; ++j) dbias[j] += d[j];
    }
  }
}

#define ZS_INSTANTIATE(T)                                                                               \
  template void linear_forward<T>(T*, const T*, const T*, const T*, int, int, int);                     \
  template void linear_backward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, int);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(double)
#undef ZS_INSTANTIATE

}  // namespace zshard::cpu
