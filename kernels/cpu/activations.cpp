// Element-wise ops: GELU (tanh approximation), SwiGLU and the residual add.
#include <cmath>
#include <cstddef>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

namespace zshard::cpu {

namespace {
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kGeluCubic = 0.044715;
}  // namespace

template <class T>
void gelu_forward(T* out, const T* inp, size_t n) {
  const T s = T(kSqrt2OverPi), a = T(kGeluCubic);
  for (size_t i = 0; i < n; ++i) {
    const T x = inp[i];
    out[i] = T(0.5) * x * (T(1) + detail::tanh_approx(s * (x + a * x * x * x)));
  }
}

template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n) {
  const T s = T(kSqrt2OverPi), a = T(kGeluCubic);
  for (size_t i = 0; i < n; ++i) {
    const T x = inp[i];
    const T th = detail::tanh_approx(s * (x + a * x * x * x));
    const T sech2 = T(1) - th * th;
    const T grad = T(0.5) * (T(1) + th) + T(0.5) * x * sech2 * s * (T(1) + T(3) * a * x * x);
    dinp[i] += grad * dout[i];
  }
}

template <class T>
void residual_forward(T* out, const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <class T>
void residual_backward(T* da, T* db, const T* dout, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

// SwiGLU (Llama's MLP): out = silu(gate) * up with silu(x) = x * sigmoid(x).
template <class T>
void swiglu_forward(T* out, const T* gate, const T* up, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const T g = gate[i];
    out[i] = g / (T(1) + std::exp(-g)) * up[i];
  }
}

template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const T g = gate[i], sig = T(1) / (T(1) + std::exp(-g));
    dup[i] += dout[i] * g * sig;
    // d silu / dg = sig * (1 + g * (1 - sig))
    dgate[i] += dout[i] * up[i] * sig * (T(1) + g * (T(1) - sig));
  }
}

#define ZS_INSTANTIATE(T)                                                                               \
  template void swiglu_forward<T>(T*, const T*, const T*, size_t);                                      \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, size_t);                       \
  template void gelu_forward<T>(T*, const T*, size_t);                                                  \
  template void gelu_backward<T>(T*, const T*, const T*, size_t);                                       \
  template void residual_forward<T>(T*, const T*, const T*, size_t);                                    \
  template void residual_backward<T>(T*, T*, const T*, size_t);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(double)
#undef ZS_INSTANTIATE

}  // namespace zshard::cpu
