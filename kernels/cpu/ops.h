// CPU reference ops, forward and backward, for T = float and T = double (double exists so that tests can
// check every backward against central finite differences), and for T = bf16, mixed precision's storage
// type, as the CUDA twins compute it (see the end of this file).
//
// Conventions shared by every op (the CUDA twins in kernels/cuda/ops.cuh keep them):
// - Arrays are contiguous and row-major. N = rows (B*T), C = channels, OC = output channels,
//   V = vocabulary, NH = heads.
// - Backward ops ACCUMULATE (+=) into every gradient they write, activation gradients included; the
//   caller zeroes. This makes tied weights and gradient accumulation free. The fused forms set the
//   activation gradients they say they set (<zshard/ops.h>).
// - Linear weights use the Hugging Face GPT-2 Conv1D layout (in, out): out = inp @ W + b.
#pragma once
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <zshard/dtype.h>
#include <zshard/ops.h>

#include "kernels/step_scalars.h"

namespace zshard::cpu {

using ops::InputGrad;
using ops::WeightLayout;

constexpr double kLayerNormEps = 1e-5;

// What an op on elements of T computes in: T itself, or fp32 for bf16. Saved statistics (LayerNorm's mean
// and rstd, RMSNorm's rstd) and scalars (alpha, beta, dloss) are kept in it: a bf16 rstd would be off by
// up to 0.4%, and so would a loss scale like 1/96.
template <class T>
using Compute = std::conditional_t<std::is_same_v<T, bf16>, float, T>;

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]; wpe (and dwpe) may be null: no position table. A null dwte or
// dwpe, a null dweight or dbias in the backwards below: a frozen parameter, skipped (<zshard/ops.h>).
template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int Tn, int C);
template <class T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int Tn, int C);

// mean and rstd (N each) are saved for the backward.
template <class T>
void layernorm_forward(T* out, Compute<T>* mean, Compute<T>* rstd, const T* inp, const T* weight, const T* bias,
                       int N, int C);
template <class T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const Compute<T>* mean, const Compute<T>* rstd, int N, int C);
// residual = a + b, then out = layernorm(residual), row by row (<zshard/ops.h>).
template <class T>
void layernorm_residual_forward(T* residual, T* out, Compute<T>* mean, Compute<T>* rstd, const T* a, const T* b,
                                const T* weight, const T* bias, int N, int C);

// RMSNorm (Llama): out = inp * rstd * weight, rstd = 1 / sqrt(mean(inp^2) + eps) per row, saved (N).
template <class T>
void rmsnorm_forward(T* out, Compute<T>* rstd, const T* inp, const T* weight, int N, int C, float eps);
template <class T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const Compute<T>* rstd,
                      int N, int C);
template <class T>
void rmsnorm_residual_forward(T* residual, T* out, Compute<T>* rstd, const T* a, const T* b, const T* weight, int N,
                              int C, float eps);

// Rotary position embedding in place on x (B,T,NH,HS), Hugging Face's rotate_half layout: element i of a
// head pairs with i + HS/2 and turns by t * f(i) at position t (kernels/rope_frequencies.h). The backward turns a gradient
// back, in place: the one op besides cross-entropy that does not accumulate.
template <class T>
void rope_forward(T* x, int B, int Tn, int NH, int HS, const ops::RopeFrequencies& rope);
template <class T>
void rope_backward(T* dx, int B, int Tn, int NH, int HS, const ops::RopeFrequencies& rope);

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
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, size_t n,
                     InputGrad mode = InputGrad::accumulate);

// bias may be null (then dbias must be null too).
template <class T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC);
template <class T>
void linear_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int N,
                     int C, int OC);
// The linear layer with its epilogues (<zshard/ops.h>): in f32 and f64 linear_forward, gelu_forward and
// linear_backward's own operations in their order; in bf16 cuBLASLt's roundings (kernels/cpu/linear_epilogues.cpp).
template <class T>
void linear_epilogue_forward(T* out, T* pre, const T* inp, const T* weight, const T* bias, int N, int C, int OC);
template <class T>
void linear_epilogue_backward(T* dinp, T* dweight, T* dbias, T* pre_dbias, const T* dout, const T* inp, const T* pre,
                              const T* weight, int N, int C, int OC);

// LoRA on the frozen linear layer (weight, bias) in `layout`; the arguments, what is saved and the gradients
// are <zshard/ops.h>'s lora_linear_forward. Written over gemm<T> (kernels/lora_linear.h), so the bf16
// instantiation rounds where the CUDA twin stores without an op of its own.
template <class T>
void lora_linear_forward(T* out, T* lora_hidden, const T* inp, const T* weight, const T* bias, const T* lora_a,
                         const T* lora_b, int N, int C, int OC, int R, Compute<T> scale, WeightLayout layout);
template <class T>
void lora_linear_backward(T* dinp, T* dlora_a, T* dlora_b, const T* dout, const T* inp, const T* weight,
                          const T* lora_a, const T* lora_b, const T* lora_hidden, int N, int C, int OC, int R,
                          Compute<T> scale, WeightLayout layout);

// Row-major GEMM: C = alpha * op(A) @ op(B) + beta * C, op = transpose when the flag is set.
// A is (M,K) after op, B is (K,N) after op; lda/ldb/ldc are row strides.
template <class T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, Compute<T> alpha, const T* A, int lda, const T* B,
          int ldb, Compute<T> beta, T* C, int ldc);

// Causal multi-head self-attention. qkv is (B,T,3C) laid out [q | k | v], each C = NH*hs wide;
// out is (B,T,C); att (B,NH,T,T) keeps the softmax probabilities for the backward.
// Scores are scaled by 1/sqrt(hs).
template <class T>
void attention_forward(T* out, T* att, const T* qkv, int B, int Tn, int C, int NH);
template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, int B, int Tn, int C, int NH);
// The same attention without the (B,NH,T,T) probabilities: the forward saves each query row's
// log-sum-exp of its scaled scores, lse (B,NH,T); the backward recomputes the probabilities from qkv and
// lse, reads the forward's output `out`, and WRITES dqkv (not accumulated: cuDNN's twin has no beta).
template <class T>
void fused_attention_forward(T* out, Compute<T>* lse, const T* qkv, int B, int Tn, int C, int NH);
template <class T>
void fused_attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const Compute<T>* lse, int B,
                              int Tn, int C, int NH);

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
                                      int V, int ld, Compute<T> dloss);
// The most a bf16 op's fp32 copies take at once: each op copies its arrays a block of rows (or sequences,
// or tiles) at a time (kernels/cpu/bf16_math.h), so that its scratch does not grow with the batch. Whole
// copies would cost twice the bf16 bytes of the largest arrays: an LM head's weight and logits, a layer's
// activations. The memory estimator counts the bound.
inline constexpr size_t kOpScratchBytes = size_t(64) << 20;
// The fp32 copies the bf16 cross-entropy holds at once for N rows of V logits: a block of rows within
// kOpScratchBytes, and every row's loss.
int64_t bf16_cross_entropy_scratch_bytes(int64_t N, int V);
// The copies the other bf16 ops that a model's largest arrays pass through hold at once, each defined
// beside its op with the op's own blocks: what a model's workspace_bytes takes the largest of. The GEMM's
// tiles (gemm's M, N, K); the SwiGLU's and GELU's backward over n elements; the grouped-query packing's
// backward (gqa_pack_backward's sizes); a fused linear layer's (linear_epilogue_forward's and _backward's,
// N rows of C in and OC out); attention's backward over B sequences of T tokens of C channels: blocks'
// score gradients (NH heads) and their GEMMs, or fused's.
int64_t bf16_gemm_scratch_bytes(int M, int N, int K);
int64_t bf16_swiglu_backward_scratch_bytes(size_t n);
int64_t bf16_gqa_pack_backward_scratch_bytes(int B, int Tn, int NH, int NKV, int HS);
int64_t bf16_gelu_backward_scratch_bytes(size_t n);
int64_t bf16_linear_epilogue_scratch_bytes(int N, int C, int OC);
int64_t bf16_attention_backward_scratch_bytes(int B, int Tn, int C, int NH);
int64_t bf16_fused_attention_backward_scratch_bytes(int B, int Tn, int C);

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
// The scalars adamw_step computes from hp (hp.grad_scale aside), and the step itself from them: `decayed`
// picks decay[1] (hp.weight_decay) or decay[0] (none). The engine's step (kernels/engine_ops.h) takes
// them from StepScalars, where the CUDA kernel reads the same bits.
template <class T>
AdamWFactors<T> adamw_factors(const AdamWParams& hp);
template <class T, class G = T>
void adamw_update(T* param, const G* grad, T* m, T* v, size_t n, const AdamWFactors<T>& f, bool decayed, T grad_scale,
                  bf16* param_bf16 = nullptr);

// Sum of squares in double (for the global gradient norm).
template <class T>
double sum_squares(const T* x, size_t n);

// y += alpha * x
template <class T>
void axpy(T* y, const T* x, Compute<T> alpha, size_t n);

// Block quantization, kernels/engine_ops.h's quantize_blocks and dequantize_blocks, for T = float and bf16.
// The caller has checked the format and the pointers. The arithmetic is kernels/quantize_blocks.h's,
// shared with the CUDA kernels.
struct QuantFormat {
  int block;  // the most consecutive elements that share a scale
  int bits;   // 8 or 4
};
// Where a chunk's blocks lie (kernels/engine_ops.h's HostBlockTable builds one): the chunk is cut into
// pieces [piece_begin[p], piece_begin[p + 1]), piece_begin[0] = 0 and piece_begin[pieces] = n, and each
// piece into blocks of `block` elements from its own start, its last block shorter; first_block[p] is
// the index of piece p's first block, first_block[pieces] = blocks. The arrays are in the memory of the
// device the op runs on; the counts are the host's, for the launch.
struct BlockTable {
  const int64_t* piece_begin = nullptr;  // pieces + 1 entries
  const int64_t* first_block = nullptr;  // pieces + 1 entries
  int pieces = 0;
  int block = 0;  // what the table was cut for: the format's
  size_t blocks = 0;
};
template <class T>
void quantize_blocks(int8_t* q, float* scales, const T* x, size_t n, QuantFormat f, BlockTable blocks);
template <class T>
void dequantize_blocks(T* out, const int8_t* q, const float* scales, size_t n, QuantFormat f, BlockTable blocks,
                       bool accumulate);

// bf16: every op reads bf16, computes in fp32 and rounds once where its CUDA twin (kernels/cuda) stores,
// so that the cpu runs mixed precision through the same code above the kernels as a GPU and is the
// reference for it: GEMMs take the bf16 values and accumulate in fp32 (out = bf16(alpha A B + beta C); the
// cuda GEMM cuts an unaligned K of 64 or more in two and rounds once more, kernels/cuda/linear.cu);
// a linear layer's bias is added to the GEMM's rounded output and rounded again (but in the fused
// linear_epilogue ops, which round as cuBLASLt's epilogues: once); attention stores its scores,
// probabilities and score gradients in bf16 between its GEMMs and softmax passes, while fused attention
// keeps them in fp32, as cuDNN's kernel does, and rounds its output and qkv's gradient once; a backward adds
// its fp32 result into the bf16 gradient with one rounding; the embedding backward sums each token's rows
// in fp32 and adds once; cross-entropy's returned sum is of the fp32 row losses. Where an op's arithmetic
// is the fp32 op's, it runs that op on fp32 copies (kernels/cpu/bf16_ops.cpp, bf16_attention.cpp).
// gqa_pack is a copy, instantiated for bf16 as it is.
template <> void embedding_forward<bf16>(bf16*, const int32_t*, const bf16*, const bf16*, int, int, int);
template <> void embedding_backward<bf16>(bf16*, bf16*, const bf16*, const int32_t*, int, int, int);
template <> void layernorm_forward<bf16>(bf16*, float*, float*, const bf16*, const bf16*, const bf16*, int,
                                         int);
template <> void layernorm_backward<bf16>(bf16*, bf16*, bf16*, const bf16*, const bf16*, const bf16*,
                                          const float*, const float*, int, int);
template <> void layernorm_residual_forward<bf16>(bf16*, bf16*, float*, float*, const bf16*, const bf16*,
                                                  const bf16*, const bf16*, int, int);
template <> void rmsnorm_forward<bf16>(bf16*, float*, const bf16*, const bf16*, int, int, float);
template <> void rmsnorm_backward<bf16>(bf16*, bf16*, const bf16*, const bf16*, const bf16*, const float*,
                                        int, int);
template <> void rmsnorm_residual_forward<bf16>(bf16*, bf16*, float*, const bf16*, const bf16*, const bf16*, int,
                                                int, float);
template <> void rope_forward<bf16>(bf16*, int, int, int, int, const ops::RopeFrequencies&);
template <> void rope_backward<bf16>(bf16*, int, int, int, int, const ops::RopeFrequencies&);
template <> void gqa_pack_backward<bf16>(bf16*, bf16*, bf16*, const bf16*, int, int, int, int, int);
template <> void swiglu_forward<bf16>(bf16*, const bf16*, const bf16*, size_t);
template <> void swiglu_backward<bf16>(bf16*, bf16*, const bf16*, const bf16*, const bf16*, size_t, InputGrad);
template <> void linear_forward<bf16>(bf16*, const bf16*, const bf16*, const bf16*, int, int, int);
template <> void linear_backward<bf16>(bf16*, bf16*, bf16*, const bf16*, const bf16*, const bf16*, int, int,
                                       int);
template <> void linear_epilogue_forward<bf16>(bf16*, bf16*, const bf16*, const bf16*, const bf16*, int, int, int);
template <> void linear_epilogue_backward<bf16>(bf16*, bf16*, bf16*, bf16*, const bf16*, const bf16*, const bf16*,
                                                const bf16*, int, int, int);
template <> void gemm<bf16>(bool, bool, int, int, int, float, const bf16*, int, const bf16*, int, float,
                            bf16*, int);
template <> void attention_forward<bf16>(bf16*, bf16*, const bf16*, int, int, int, int);
template <> void attention_backward<bf16>(bf16*, const bf16*, const bf16*, const bf16*, int, int, int, int);
template <> void fused_attention_forward<bf16>(bf16*, float*, const bf16*, int, int, int, int);
template <> void fused_attention_backward<bf16>(bf16*, const bf16*, const bf16*, const bf16*, const float*, int,
                                                int, int, int);
template <> void gelu_forward<bf16>(bf16*, const bf16*, size_t);
template <> void gelu_backward<bf16>(bf16*, const bf16*, const bf16*, size_t);
template <> void residual_forward<bf16>(bf16*, const bf16*, const bf16*, size_t);
template <> void residual_backward<bf16>(bf16*, bf16*, const bf16*, size_t);
template <> double cross_entropy_forward_backward<bf16>(bf16*, bf16*, const bf16*, const int32_t*, int, int,
                                                        int, float);
template <> double sum_squares<bf16>(const bf16*, size_t);
template <> void axpy<bf16>(bf16*, const bf16*, float, size_t);

}  // namespace zshard::cpu
