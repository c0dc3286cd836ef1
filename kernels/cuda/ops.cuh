// CUDA twins of the CPU reference ops (kernels/cpu/ops.h): same names, same arguments, same conventions
// (row-major, backward ACCUMULATES into every gradient, Conv1D weight layout), in namespace zshard::cuda.
// Pointers are device pointers. Instantiated for T = float and T = __nv_bfloat16; bf16 ops compute in fp32
// and round once on store.
//
// Streams: every op takes a trailing `cudaStream_t stream` (default: the thread's compute stream,
// kernels/cuda/runtime.h) and only enqueues work on it, except cross_entropy_forward_backward without a
// device loss sum, which returns a host value and so synchronises that stream. Every launch is followed
// by a cudaGetLastError check. Ops that need scratch (attention, the bias, LayerNorm and RMSNorm parameter
// gradients, the embedding backward, the LoRA linear backward, the fused linear layer, the two reductions)
// take it from the tracking allocator as `workspace`, so cuda_init (kernels/cuda/runtime.h) must have run,
// and they refuse non-blocking streams other than the compute stream (see runtime.h). Needs sm_80 or newer.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/runtime.h"

namespace zshard::cuda {

using cpu::AdamWParams;
using cpu::BlockTable;
using cpu::QuantFormat;
using cpu::ShardSegment;
using cpu::StepScalars;
using ops::WeightLayout;
using bf16 = __nv_bfloat16;

// wpe (and dwpe) may be null: no position table.
template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int Tn, int C,
                       cudaStream_t stream = compute_stream());
// Each dwte row gets its token's rows of dout summed in fp32, in a fixed order, and added once.
template <class T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int Tn, int C,
                        cudaStream_t stream = compute_stream());

// mean and rstd are fp32 for both T (<zshard/ops.h>, NormStat).
template <class T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int N,
                       int C, cudaStream_t stream = compute_stream());
template <class T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const float* mean, const float* rstd, int N, int C, cudaStream_t stream = compute_stream());
// residual = a + b, rounded to T, then out = layernorm(residual): a warp per row writes the row's residual
// and normalises it as layernorm_forward does, while the row is in its cache.
template <class T>
void layernorm_residual_forward(T* residual, T* out, float* mean, float* rstd, const T* a, const T* b,
                                const T* weight, const T* bias, int N, int C, cudaStream_t stream = compute_stream());

// RMSNorm; rstd is fp32 for both T, as LayerNorm's statistics.
template <class T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, int N, int C, float eps,
                     cudaStream_t stream = compute_stream());
template <class T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const float* rstd, int N,
                      int C, cudaStream_t stream = compute_stream());
template <class T>
void rmsnorm_residual_forward(T* residual, T* out, float* rstd, const T* a, const T* b, const T* weight, int N, int C,
                              float eps, cudaStream_t stream = compute_stream());
// Rotary embedding in place (forward), and its transpose in place on a gradient (backward).
template <class T>
void rope_forward(T* x, int B, int Tn, int NH, int HS, const ops::RopeFrequencies& rope,
                  cudaStream_t stream = compute_stream());
template <class T>
void rope_backward(T* dx, int B, int Tn, int NH, int HS, const ops::RopeFrequencies& rope,
                   cudaStream_t stream = compute_stream());
template <class T>
void gqa_pack(T* qkv, const T* q, const T* k, const T* v, int B, int Tn, int NH, int NKV, int HS,
              cudaStream_t stream = compute_stream());
template <class T>
void gqa_pack_backward(T* dq, T* dk, T* dv, const T* dqkv, int B, int Tn, int NH, int NKV, int HS,
                       cudaStream_t stream = compute_stream());
template <class T>
void swiglu_forward(T* out, const T* gate, const T* up, size_t n, cudaStream_t stream = compute_stream());
template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, size_t n,
                     ops::InputGrad mode = ops::InputGrad::accumulate, cudaStream_t stream = compute_stream());

// cuBLAS with fp32 accumulation (CUBLAS_COMPUTE_32F: no TF32 for fp32 inputs). Scalars (alpha, beta here,
// dloss and axpy's alpha below) are fp32 for every T: rounding a factor like 1/96 to bf16 would bias every
// result by up to 0.4%.
template <class T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const T* A, int lda, const T* B,
          int ldb, float beta, T* C, int ldc, cudaStream_t stream = compute_stream());
template <class T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC,
                    cudaStream_t stream = compute_stream());
template <class T>
void linear_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int N,
                     int C, int OC, cudaStream_t stream = compute_stream());

// <zshard/ops.h>'s linear_epilogue_forward and backward, through cuBLASLt's epilogues
// (kernels/cuda/linear_epilogues.cu).
template <class T>
void linear_epilogue_forward(T* out, T* pre, const T* inp, const T* weight, const T* bias, int N, int C, int OC,
                             cudaStream_t stream = compute_stream());
template <class T>
void linear_epilogue_backward(T* dinp, T* dweight, T* dbias, T* pre_dbias, const T* dout, const T* inp, const T* pre,
                              const T* weight, int N, int C, int OC, cudaStream_t stream = compute_stream());
// The GEMMs this thread's fused linear layers have run with a cuBLASLt epilogue, rather than through the
// plain GEMM and the separate kernels that stand in where cuBLASLt has none: what shows that they ran.
size_t epilogue_gemms();

// <zshard/ops.h>'s lora_linear_forward and backward.
template <class T>
void lora_linear_forward(T* out, T* lora_hidden, const T* inp, const T* weight, const T* bias, const T* lora_a,
                         const T* lora_b, int N, int C, int OC, int R, float scale, WeightLayout layout,
                         cudaStream_t stream = compute_stream());
template <class T>
void lora_linear_backward(T* dinp, T* dlora_a, T* dlora_b, const T* dout, const T* inp, const T* weight,
                          const T* lora_a, const T* lora_b, const T* lora_hidden, int N, int C, int OC, int R,
                          float scale, WeightLayout layout, cudaStream_t stream = compute_stream());

template <class T>
void attention_forward(T* out, T* att, const T* qkv, int B, int Tn, int C, int NH,
                       cudaStream_t stream = compute_stream());
template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, int B, int Tn, int C, int NH,
                        cudaStream_t stream = compute_stream());
// Batch elements per pass of attention_backward: its (chunk, NH, T, T) score-gradient scratch is bounded.
int attention_backward_chunk(int B, int Tn, int NH, size_t element_size);

// <zshard/ops.h>'s fused attention through cuDNN's SDPA, bf16 with fp32 statistics (kernels/cuda/cudnn/,
// compiled where cuDNN's frontend headers were found: ZSHARD_WITH_CUDNN). libcudnn is loaded at run time,
// by the first call of cudnn_unavailable, which returns "" once it is loaded and else why it cannot be.
std::string cudnn_unavailable();
void fused_attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int Tn, int C, int NH,
                             cudaStream_t stream = compute_stream());
void fused_attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out, const float* lse,
                              int B, int Tn, int C, int NH, cudaStream_t stream = compute_stream());

template <class T>
void gelu_forward(T* out, const T* inp, size_t n, cudaStream_t stream = compute_stream());
template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n, cudaStream_t stream = compute_stream());

template <class T>
void residual_forward(T* out, const T* a, const T* b, size_t n, cudaStream_t stream = compute_stream());
template <class T>
void residual_backward(T* da, T* db, const T* dout, size_t n, cudaStream_t stream = compute_stream());

// One block per row; rows ld apart. dlogits may alias logits. Returns the sum of the N losses (synchronises
// `stream`), or, given `loss_sum` (a device double), adds it there on the stream and returns 0.
template <class T>
double cross_entropy_forward_backward(T* dlogits, T* losses, const T* logits, const int32_t* targets, int N,
                                      int V, int ld, float dloss, double* loss_sum = nullptr,
                                      cudaStream_t stream = compute_stream());

// AdamW on the segments of the fp32 master shard (param, m, v) with gradients G = float or bf16
// (kernels/engine_ops.h): one launch per 64 segments, each decayed as it says, the padding untouched, the
// gradient scaled by step->grad_scale and nothing written when step->skip is set, the factors from
// step->settings.adamw (`step` in device memory). When `param_bf16` is not null the kernel also writes the bf16
// compute copy of the updated parameters, in the same pass.
template <class G>
void adamw_step(float* param, const G* grad, float* m, float* v, std::span<const ShardSegment> segments,
                const StepScalars* step, bf16* param_bf16 = nullptr, cudaStream_t stream = compute_stream());

// Adds to *sum (device) the sum of squares of every element of every part: each part's sum in double, in a
// fixed order, added in part order. One launch per 64 parts; nothing waits.
template <class T>
void sum_squares(double* sum, std::span<const std::span<const T>> parts, cudaStream_t stream = compute_stream());
// The step's scalars (kernels/step_scalars.h), one thread each: *sum = first + values[0] + ... in order;
// torch's clip_grad_norm_ on step->norm_squares.
void sum_in_order(double* sum, const double* values, size_t n, double first, cudaStream_t stream = compute_stream());
void clip_grad_norm(StepScalars* step, cudaStream_t stream = compute_stream());

// y += alpha * x
template <class T>
void axpy(T* y, const T* x, float alpha, size_t n, cudaStream_t stream = compute_stream());

// dst[i] = src[i] between float and bf16 (round to nearest even). Instantiated for <float, bf16> and
// <bf16, float>.
template <class Dst, class Src>
void convert(Dst* dst, const Src* src, size_t n, cudaStream_t stream = compute_stream());

// Block quantization (kernels/engine_ops.h), the CPU reference's bits: a warp per block finds the scales,
// then a thread per payload byte writes the integers, element by element as kernels/cpu/quantize.cpp does;
// the table's arrays are device memory. One launch per pass whatever the table's pieces.
template <class T>
void quantize_blocks(int8_t* q, float* scales, const T* x, size_t n, QuantFormat f, BlockTable blocks,
                     cudaStream_t stream = compute_stream());
template <class T>
void dequantize_blocks(T* out, const int8_t* q, const float* scales, size_t n, QuantFormat f, BlockTable blocks,
                       bool accumulate, cudaStream_t stream = compute_stream());

}  // namespace zshard::cuda
