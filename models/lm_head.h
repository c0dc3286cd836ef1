// The language-model head the hand-written models share: logits = x @ W^T for an output matrix W of
// (V, C) (GPT-2's tied wte, Llama's lm_head or tied embedding), the token losses, and the backward.
#pragma once
#include "kernels/tensor.h"

namespace zshard {

// Row stride of the logits: the vocabulary rounded up to a multiple of 64, so that every row starts
// 128-byte aligned and cuBLAS can use its aligned tensor-core kernels for the head's GEMMs (GPT-2's
// 50257 is odd). The padding columns are never read.
inline int logits_row_stride(int vocab) { return (vocab + 63) / 64 * 64; }

struct LmHead {
  Device device;
  int N, C, V;  // rows (B*T), channels, vocabulary

  // logits (N, logits_row_stride(V)) = x @ W^T and the token losses; returns their sum. With `backward`
  // the logits are replaced by dlogits = dloss * (softmax - onehot).
  template <class T>
  double forward(T* logits, T* losses, const T* x, const T* W, const int32_t* targets, bool backward,
                 float dloss) const;
  // dx = dlogits @ W (set).
  template <class T>
  void input_grad(T* dx, const T* dlogits, const T* W) const;
  // dW += dlogits^T @ x. Reads only dlogits and x, so a tied head can add it later than input_grad, for
  // as long as both are kept (GPT-2 may leave it to the embedding's backward).
  template <class T>
  void weight_grad(T* dW, const T* dlogits, const T* x) const;
  // input_grad, then weight_grad.
  template <class T>
  void backward(T* dx, T* dW, const T* dlogits, const T* x, const T* W) const;
};

}  // namespace zshard
