// The LoRA linear op's steps (<zshard/ops.h>, lora_linear_forward), written once over a backend's GEMM
// and bias add: the cpu op (kernels/cpu/linear.cpp) and its CUDA twin (kernels/cuda/linear.cu) pass their
// own, so that the cpu's bf16 reference rounds exactly where the CUDA kernels store and both check their
// arguments alike. `gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)` is the backend's
// row-major GEMM, `add_bias(out, bias, N, OC)` adds bias to each of out's N rows, `scratch(bytes)` returns
// a Buffer of the backend's workspace, S is the backend's scalar type.
#pragma once
#include <cstddef>

#include <zshard/error.h>
#include <zshard/memory.h>
#include <zshard/ops.h>

namespace zshard::lora_linear {

using ops::WeightLayout;

inline void check_sizes(const char* op, int N, int C, int OC, int R) {
  ZS_CHECK(R >= 1, op, ": LoRA rank R=", R, ", must be at least 1");
  ZS_CHECK(N >= 0 && C >= 0 && OC >= 0, op, ": negative size N=", N, " C=", C, " OC=", OC);
}

template <class T, class S, class Gemm, class AddBias>
void forward(const Gemm& gemm, const AddBias& add_bias, T* out, T* hidden, const T* inp, const T* weight,
             const T* bias, const T* lora_a, const T* lora_b, int N, int C, int OC, int R, S scale,
             WeightLayout layout) {
  check_sizes("lora_linear_forward", N, C, OC, R);
  ZS_CHECK(hidden, "lora_linear_forward: lora_hidden (N x R, saved for the backward) is required");
  const bool out_in = layout == WeightLayout::out_in;  // W stored (OC, C): read transposed
  gemm(false, out_in, N, OC, C, S(1), inp, C, weight, out_in ? C : OC, S(0), out, OC);
  if (bias) add_bias(out, bias, N, OC);
  gemm(false, true, N, R, C, S(1), inp, C, lora_a, C, S(0), hidden, R);     // hidden = inp @ A^T
  gemm(false, true, N, OC, R, scale, hidden, R, lora_b, R, S(1), out, OC);  // out += scale hidden @ B^T
}

template <class T, class S, class Gemm, class Scratch>
void backward(const Gemm& gemm, const Scratch& scratch, T* dinp, T* dlora_a, T* dlora_b, const T* dout,
              const T* inp, const T* weight, const T* lora_a, const T* lora_b, const T* hidden, int N, int C,
              int OC, int R, S scale, WeightLayout layout) {
  check_sizes("lora_linear_backward", N, C, OC, R);
  // A frozen adapter matrix (EngineOptions::freeze) has no gradient: null skips it, as for any weight.
  ZS_CHECK(dinp, "lora_linear_backward: dinp is required (a frozen layer's input still needs its gradient)");
  ZS_CHECK(hidden, "lora_linear_backward: lora_hidden (the forward's inp @ A^T) is required");
  const bool out_in = layout == WeightLayout::out_in;
  gemm(false, !out_in, N, C, OC, S(1), dout, OC, weight, out_in ? C : OC, S(1), dinp, C);  // dinp += dout @ W^T
  // The gradient at hidden, which dinp and dlora_a both take.
  const Buffer dhidden_buffer = scratch(size_t(N) * size_t(R) * sizeof(T));
  T* dhidden = static_cast<T*>(dhidden_buffer.data());
  gemm(false, false, N, R, OC, scale, dout, OC, lora_b, R, S(0), dhidden, R);  // dhidden = scale dout @ B
  gemm(false, false, N, C, R, S(1), dhidden, R, lora_a, C, S(1), dinp, C);     // dinp += dhidden @ A
  if (dlora_a) gemm(true, false, R, C, N, S(1), dhidden, R, inp, C, S(1), dlora_a, C);     // dA += dhidden^T @ inp
  if (dlora_b) gemm(true, false, OC, R, N, scale, dout, OC, hidden, R, S(1), dlora_b, R);  // dB += scale dout^T @ hidden
}

}  // namespace zshard::lora_linear
