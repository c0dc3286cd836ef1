// The ops a model computes with, forward and backward, dispatched on the device the data lives on: a CPU
// reference op or its CUDA twin, with the same arguments and a leading Device, so a model written
// against them runs on either without knowing which.
//
// Conventions: arrays are contiguous and row-major (N = rows, B*T; C = channels; OC = output channels;
// V = vocabulary; NH = heads). Backward ops ACCUMULATE (+=) into every gradient they write, activation
// gradients included, so the caller zeroes (fused_attention_backward, which writes, aside); tied weights
// and gradient accumulation come free. The fused forms (Model::set_fused_epilogues) SET an activation
// gradient that is a buffer's first contribution instead, where they say so, and spare the zeroing. A null
// parameter gradient (linear's dweight and dbias, the norms' dweight and dbias, the embedding's dwte and
// dwpe, each on its own) is a frozen parameter's
// (ParamContext::grads): the op skips it and still computes the input gradient, the same bits as with it.
// Linear weights use the Hugging Face GPT-2 Conv1D layout (in, out): out = inp @ W + b, unless an op takes a
// WeightLayout.
//
// Element types: float and bf16 on both devices, and double on cpu. Any other pairing throws, naming the op.
// bf16 computes in fp32 and rounds where the CUDA kernels store, on the cpu too.
// CUDA ops are queued on the compute stream (the legacy default stream, which also orders
// Tensor::zero_ and the runtime's copies); the ops that return a host value wait for it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include <zshard/dtype.h>

namespace zshard::ops {

template <class T>
void embedding_forward(Device d, T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int Tn,
                       int C);
template <class T>
void embedding_backward(Device d, T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int Tn,
                        int C);
// LayerNorm's saved mean and rstd are NormStat<T>: fp32 for bf16, since the backward rebuilds xhat from
// them and an rstd rounded to bf16 would be off by up to 0.4%; the compute type otherwise. Fused
// attention's log-sum-exp is kept the same way (AttentionStat).
template <class T>
using NormStat = std::conditional_t<std::is_same_v<T, bf16>, float, T>;
inline DType norm_stat_dtype(DType compute) { return compute == DType::bf16 ? DType::f32 : compute; }

template <class T>
void layernorm_forward(Device d, T* out, NormStat<T>* mean, NormStat<T>* rstd, const T* inp, const T* weight,
                       const T* bias, int N, int C);
template <class T>
void layernorm_backward(Device d, T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                        const T* weight, const NormStat<T>* mean, const NormStat<T>* rstd, int N, int C);
// The residual add fused into the norm after it: residual = a + b, then out = layernorm(residual) with its
// statistics, one pass over the rows. residual is rounded to T before it is normalised, so both outputs
// are residual_forward's and layernorm_forward's bits. Its backward is layernorm_backward adding into the
// residual stream's gradient, which is both a's and b's.
template <class T>
void layernorm_residual_forward(Device d, T* residual, T* out, NormStat<T>* mean, NormStat<T>* rstd, const T* a,
                                const T* b, const T* weight, const T* bias, int N, int C);
// RMSNorm (Llama); rstd is a NormStat<T> like LayerNorm's.
template <class T>
void rmsnorm_forward(Device d, T* out, NormStat<T>* rstd, const T* inp, const T* weight, int N, int C, float eps);
template <class T>
void rmsnorm_backward(Device d, T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                      const NormStat<T>* rstd, int N, int C);
// residual = a + b, then out = rmsnorm(residual): layernorm_residual_forward's fusion for RMSNorm.
template <class T>
void rmsnorm_residual_forward(Device d, T* residual, T* out, NormStat<T>* rstd, const T* a, const T* b,
                              const T* weight, int N, int C, float eps);
// Rotary embedding's frequencies: pair i of a head of HS elements turns by t * f(i) at position t, with
// f(i) = theta^(-2i/HS), rescaled as Llama 3.1 and 3.2 do when scaling.factor > 0 (Hugging Face's
// rope_scaling of rope_type "llama3"; kernels/rope_frequencies.h): the long wavelengths stretched by the
// factor, the short ones kept, those between interpolated.
struct RopeScaling {
  double factor = 0;  // 0: no rescaling
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  double original_ctx = 8192;  // original_max_position_embeddings
};
struct RopeFrequencies {
  double theta = 10000;
  RopeScaling scaling;
};
// Rotary embedding in place (Hugging Face's rotate_half layout); the backward turns a gradient back in place.
template <class T>
void rope_forward(Device d, T* x, int B, int Tn, int NH, int HS, const RopeFrequencies& rope);
template <class T>
void rope_backward(Device d, T* dx, int B, int Tn, int NH, int HS, const RopeFrequencies& rope);
// Grouped-query attention's packed input for attention_forward, and its backward (accumulating).
template <class T>
void gqa_pack(Device d, T* qkv, const T* q, const T* k, const T* v, int B, int Tn, int NH, int NKV, int HS);
template <class T>
void gqa_pack_backward(Device d, T* dq, T* dk, T* dv, const T* dqkv, int B, int Tn, int NH, int NKV, int HS);
template <class T>
void swiglu_forward(Device d, T* out, const T* gate, const T* up, size_t n);
// Whether a backward adds into its input gradients (the convention) or sets them: their first contribution.
enum class InputGrad { accumulate, set };
template <class T>
void swiglu_backward(Device d, T* dgate, T* dup, const T* dout, const T* gate, const T* up, size_t n,
                     InputGrad mode = InputGrad::accumulate);

template <class T>
void linear_forward(Device d, T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC);
template <class T>
void linear_backward(Device d, T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int N, int C, int OC);

// LoRA on a frozen linear layer, PEFT's semantics: out = inp @ W + bias + scale * (inp @ A^T) @ B^T, W here
// the (C, OC) matrix whatever the layout it is stored in. The adapter is in PEFT's layout: A (R, C) is
// lora_A.weight, B (OC, R) lora_B.weight. The stored W is (C, OC), as linear_forward's (in_out: GPT-2's
// Conv1D, PEFT's fan_in_fan_out), or (OC, C) (out_in: nn.Linear, Llama's projections). scale is PEFT's
// scaling, lora_alpha / R (lora_alpha / sqrt(R) with rsLoRA). bias may be null.
// The forward saves lora_hidden = inp @ A^T (N, R: R values a token) for the backward, which reads it with
// inp, so that nothing wider than R a token is kept. The backward accumulates dinp += dout @ W^T +
// scale * (dout @ B) @ A, dlora_a += scale * (dout @ B)^T @ inp and dlora_b += scale * dout^T @ lora_hidden,
// dinp required (a frozen layer's input still needs its gradient), dlora_a or dlora_b null for a frozen
// adapter matrix; W and bias are frozen: no gradient.
enum class WeightLayout { in_out, out_in };
template <class T>
void lora_linear_forward(Device d, T* out, T* lora_hidden, const T* inp, const T* weight, const T* bias,
                         const T* lora_a, const T* lora_b, int N, int C, int OC, int R, float scale,
                         WeightLayout layout);
template <class T>
void lora_linear_backward(Device d, T* dinp, T* dlora_a, T* dlora_b, const T* dout, const T* inp,
                          const T* weight, const T* lora_a, const T* lora_b, const T* lora_hidden, int N, int C,
                          int OC, int R, float scale, WeightLayout layout);

// The linear layer with its bias, a GELU after it and its bias gradients inside the GEMMs (on cuda,
// cuBLASLt's epilogues; the plain GEMM and the separate kernels where cuBLASLt has no kernel for a shape).
// What linear_forward, gelu_forward and linear_backward compute, but for the roundings in bf16: each output
// is rounded once, where the separate ops round the GEMM's output, then the bias added to it, then its
// GELU; a bias gradient is rounded to T before it is added. The forward: out = inp @ W + bias, or with
// `pre`, pre = inp @ W + bias (kept for the backward) and out = gelu(pre). bias may be null.
template <class T>
void linear_epilogue_forward(Device d, T* out, T* pre, const T* inp, const T* weight, const T* bias, int N, int C,
                             int OC);
// linear_backward, but dinp is SET to dout @ W^T. With `pre`, the layer's input was gelu(pre)
// (linear_epilogue_forward's out) and the gradient goes on through the GELU: dinp = gelu'(pre) * (dout @ W^T)
// = d(pre), and pre_dbias, the bias gradient of the layer that made pre (null: none, or frozen), adds its
// column sums.
template <class T>
void linear_epilogue_backward(Device d, T* dinp, T* dweight, T* dbias, T* pre_dbias, const T* dout, const T* inp,
                              const T* pre, const T* weight, int N, int C, int OC);
// Scalars (alpha and beta, axpy's alpha, cross-entropy's dloss, LoRA's scale) are fp32 whatever T is, down
// to the kernels: a bf16 loss scale would be off by up to 0.4%.
// Row-major GEMM: C (M,N) = alpha * op(A) @ op(B) + beta * C, op transposing where its flag is set; op(A)
// is (M,K) and op(B) (K,N); lda, ldb and ldc are the row strides of A, B and C as stored. A tied head's
// logits are gemm(d, false, true, N, V, C, 1, x, C, wte, C, 0, logits, V).
template <class T>
void gemm(Device d, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const T* A, int lda,
          const T* B, int ldb, float beta, T* C, int ldc);
template <class T>
void attention_forward(Device d, T* out, T* att, const T* qkv, int B, int Tn, int C, int NH);
template <class T>
void attention_backward(Device d, T* dqkv, const T* dout, const T* qkv, const T* att, int B, int Tn, int C,
                        int NH);
// Causal attention that never holds (B,NH,T,T): the forward saves each query row's log-sum-exp, lse
// (B,NH,T) in AttentionStat<T>, and the backward recomputes the probabilities from qkv and lse, reading the
// forward's output `out`. The backward WRITES dqkv (cuDNN's kernel has no accumulating form). On cuda in
// bf16 only, through cuDNN loaded at run time; on cpu in every element type. fused_attention_unavailable
// says why it cannot run where it cannot.
template <class T>
using AttentionStat = NormStat<T>;
inline DType attention_stat_dtype(DType compute) { return norm_stat_dtype(compute); }
template <class T>
void fused_attention_forward(Device d, T* out, AttentionStat<T>* lse, const T* qkv, int B, int Tn, int C, int NH);
template <class T>
void fused_attention_backward(Device d, T* dqkv, const T* dout, const T* qkv, const T* out,
                              const AttentionStat<T>* lse, int B, int Tn, int C, int NH);
// Why fused attention cannot compute in `dtype` on `device` in this process ("" where it can): e.g. fp32
// on cuda, or no libcudnn to load.
std::string fused_attention_unavailable(Device device, DType dtype);
template <class T>
void gelu_forward(Device d, T* out, const T* inp, size_t n);
template <class T>
void gelu_backward(Device d, T* dinp, const T* inp, const T* dout, size_t n);
template <class T>
void residual_forward(Device d, T* out, const T* a, const T* b, size_t n);
// Returns the sum of the token losses, which waits for the device; given `loss_sum` (a double on d) it adds
// the sum there in stream order instead and returns 0 at once.
template <class T>
double cross_entropy_forward_backward(Device d, T* dlogits, T* losses, const T* logits,
                                      const int32_t* targets, int N, int V, int ld, float dloss,
                                      double* loss_sum = nullptr);

}  // namespace zshard::ops
