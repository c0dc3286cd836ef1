// CPU reference ops, forward and backward, for T = float and T = double (double exists so that tests can
// check every backward against central finite differences).
//
// Conventions shared by every op (the CUDA twins in kernels/cuda/ops.cuh keep them):
// - Arrays are contiguous and row-major. N = rows (B*T), C = channels, OC = output channels,
//   V = vocabulary, NH = heads.
// - Backward ops ACCUMULATE (+=) into every gradient they write, activation gradients included; the
//   caller zeroes. This makes tied weights and gradient accumulation free.
// - Linear weights use the Hugging Face GPT-2 Conv1D layout (in, out): out = inp @ W + b.
#pragma once
#include <cstddef>
#include <cstdint>

#include <zshard/dtype.h>

namespace zshard::cpu {

constexpr double kLayerNormEps = 1e-5;

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]; wpe (and dwpe) may be null: no position table.
template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int Tn, int C);
template <class T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int Tn, int C);

// mean and rstd (N each) are saved for the backward.
template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int N, int C);
template <class T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const T* mean, const T* rstd, int N, int C);

// RMSNorm (Llama): out = inp * rstd * weight, rstd = 1 / sqrt(mean(inp^2) + eps) per row, saved (N).
template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int N, int C, float eps);
template <class T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const T* rstd, int N,
                      int C);

// Rotary position embedding in place on x (B,T,NH,HS), Hugging Face's rotate_half layout: element i of a
// head pairs with i + HS/2 and turns by t * theta^(-2i/HS) at position t. The backward turns a gradient
// back, in place: the one op besides cross-entropy that does not accumulate.
template <class T>
void rope_forward(T* x, int B, int Tn, int NH, int HS, float theta);
template <class T>
void rope_backward(T* dx, int B, int Tn, int NH, int HS, float theta);

// Grouped-query attention's input for attention_forward: qkv (B,T,3*NH*HS) = [q | k | v] with each of the
// NKV kv heads of k (B,T,NKV*HS) and v repeated for the NH/NKV query heads that share it.
template <class T>
void gqa_pack(T* qkv, const T* q, const T* k, const T* v, int B, int Tn, int NH, int NKV, int HS);
template <class T>
void gqa_pack_backward(T* dq, T* dk, T* dv, const T* dqkv, int B, int Tn, int NH, int NKV, int HS);

// SwiGLU: out = silu(gate) * up, silu(x) = x * sigmoid(x).
template <class T>
void swiglu_forward(T* out, const T* gate, const T* up, size_t n);
template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, size_t n);

// bias may be null (then dbias must be null too).
template <class T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC);
template <class T>
void linear_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int N,
                     int C, int OC);

// Row-major GEMM: C = alpha * op(A) @ op(B) + beta * C, op = transpose when the flag is set.
// A is (M,K) after op, B is (K,N) after op; lda/ldb/ldc are row strides.
template <class T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B,
          int ldb, T beta, T* C, int ldc);

// Causal multi-head self-attention. qkv is (B,T,3C) laid out [q | k | v], each C = NH*hs wide;
// out is (B,T,C); att (B,NH,T,T) keeps the softmax probabilities for the backward.
// Scores are scaled by 1/sqrt(hs).
template <class T>
void attention_forward(T* out, T* att, const T* qkv, int B, int Tn, int C, int NH);
template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, int B, int Tn, int C, int NH);

// GELU, tanh approximation (Hugging Face "gelu_new").
template <class T>
void gelu_forward(T* out, const T* inp, size_t n);
template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n);

template <class T>
void residual_forward(T* out, const T* a, const T* b, size_t n);
template <class T>
void residual_backward(T* da, T* db, const T* dout, size_t n);

// Fused softmax cross-entropy over rows of logits (N,V). Writes losses[i] = -log softmax(logits[i])[target].
// If dlogits is non-null it is SET (not accumulated, the one exception) to dloss * (softmax - onehot);
// dlogits may alias logits. Row i of logits and dlogits starts at i * ld (ld >= V: GPT-2's V = 50257 rows
// padded for aligned GEMMs); columns V..ld are neither read nor written. Returns the sum of the N losses
// (accumulated in double).
template <class T>
double cross_entropy_forward_backward(T* dlogits, T* losses, const T* logits, const int32_t* targets, int N,
                                      int V, int ld, T dloss);

struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // the caller passes 0 for biases and LayerNorm gains
  int step = 1;               // 1-based, for the bias correction
  float grad_scale = 1.0f;    // multiplies the gradient first (global-norm clipping)
};

// Decoupled weight decay (Loshchilov & Hutter), the PyTorch AdamW formula:
//   p -= lr*wd*p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)
// G is T, or bf16 with T = float: the host step of --offload optimizer on cuda, whose gradients come from
// the device in the compute dtype. param_bf16, when given (T = float), receives the updated parameters
// rounded to bf16 in the same pass. Each block of gradients is read before the block's results are
// written, so param_bf16 may be the gradient array itself (the offload's host staging holds the gradients,
// then the bf16 parameters that go back to the device).
template <class T, class G = T>
void adamw_step(T* param, const G* grad, T* m, T* v, size_t n, const AdamWParams& hp, bf16* param_bf16 = nullptr);

// Sum of squares in double (for the global gradient norm).
template <class T>
double sum_squares(const T* x, size_t n);

// y += alpha * x
template <class T>
void axpy(T* y, const T* x, T alpha, size_t n);

}  // namespace zshard::cpu
