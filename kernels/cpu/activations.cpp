// Element-wise ops: GELU (tanh approximation), SwiGLU and the residual add.
#include <cmath>
#include <cstddef>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

namespace zshard::cpu {

template <class T>
void gelu_forward(T* out, const T* inp, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = detail::gelu(inp[i]);
}

template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n) {
  for (size_t i = 0; i < n; ++i) dinp[i] += detail::gelu_grad(inp[i]) * dout[i];
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
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, size_t n, InputGrad mode) {
  // Set: added to 0 rather than stored, so that a -0 comes out +0 as on zeroed buffers: the same bits.
  const bool set = mode == InputGrad::set;
  for (size_t i = 0; i < n; ++i) {
    const T g = gate[i], sig = T(1) / (T(1) + std::exp(-g));
    dup[i] = (set ? T(0) : dup[i]) + dout[i] * g * sig;
    // d silu / dg = sig * (1 + g * (1 - sig))
    dgate[i] = (set ? T(0) : dgate[i]) + dout[i] * up[i] * sig * (T(1) + g * (T(1) - sig));
  }
}

#define ZS_INSTANTIATE(T)                                                                               \
  template void swiglu_forward<T>(T*, const T*, const T*, size_t);                                      \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, size_t, InputGrad);            \
  template void gelu_forward<T>(T*, const T*, size_t);                                                  \
  template void gelu_backward<T>(T*, const T*, const T*, size_t);                                       \
  template void residual_forward<T>(T*, const T*, const T*, size_t);                                    \
  template void residual_backward<T>(T*, T*, const T*, size_t);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(double)
#undef ZS_INSTANTIATE

}  // namespace zshard::cpu
