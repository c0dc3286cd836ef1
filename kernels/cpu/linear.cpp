// Linear layer in the Conv1D layout: out(N,OC) = inp(N,C) @ W(C,OC) + b, and LoRA on a frozen one.
#include <cstddef>

#include <zshard/error.h>
#include <zshard/memory.h>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/lora_linear.h"

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
  ZS_CHECK(dinp, "linear_backward: dinp is required");
  gemm<T>(false, true, N, C, OC, T(1), dout, OC, weight, OC, T(1), dinp, C);     // dinp += dout @ W^T
  if (dweight) gemm<T>(true, false, C, OC, N, T(1), inp, C, dout, OC, T(1), dweight, OC);  // dW += inp^T @ dout
  if (dbias) detail::add_column_sums(dbias, dout, N, OC);
}

#define ZS_INSTANTIATE(T)                                                                               \
  template void linear_forward<T>(T*, const T*, const T*, const T*, int, int, int);                     \
  template void linear_backward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, int);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(double)
#undef ZS_INSTANTIATE

namespace {

// As the CUDA twin's bias kernel: in the compute type, rounded once.
template <class T>
void add_bias(T* out, const T* bias, int N, int OC) {
  for (int i = 0; i < N; ++i) {
    T* o = out + size_t(i) * OC;
    for (int j = 0; j < OC; ++j) o[j] = T(Compute<T>(o[j]) + Compute<T>(bias[j]));
  }
}

Buffer lora_scratch(size_t bytes) { return Buffer(bytes, Device::cpu, Category::workspace); }

}  // namespace

template <class T>
void lora_linear_forward(T* out, T* lora_hidden, const T* inp, const T* weight, const T* bias, const T* lora_a,
                         const T* lora_b, int N, int C, int OC, int R, Compute<T> scale, WeightLayout layout) {
  lora_linear::forward(gemm<T>, add_bias<T>, out, lora_hidden, inp, weight, bias, lora_a, lora_b, N, C,
                       OC, R, scale, layout);
}

template <class T>
void lora_linear_backward(T* dinp, T* dlora_a, T* dlora_b, const T* dout, const T* inp, const T* weight,
                          const T* lora_a, const T* lora_b, const T* lora_hidden, int N, int C, int OC, int R,
                          Compute<T> scale, WeightLayout layout) {
  lora_linear::backward(gemm<T>, lora_scratch, dinp, dlora_a, dlora_b, dout, inp, weight, lora_a, lora_b,
                        lora_hidden, N, C, OC, R, scale, layout);
}

#define ZS_INSTANTIATE(T)                                                                                    \
  template void lora_linear_forward<T>(T*, T*, const T*, const T*, const T*, const T*, const T*, int, int,   \
                                       int, int, Compute<T>, WeightLayout);                                  \
  template void lora_linear_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*,        \
                                        const T*, int, int, int, int, Compute<T>, WeightLayout);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(double)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

}  // namespace zshard::cpu
