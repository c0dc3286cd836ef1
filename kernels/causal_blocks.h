// The GEMMs of causal attention with the causal structure used at block granularity. Rows and columns of
// the (T x T) score matrix are cut at T/2: row block [r0, r1) of the scores has non-zeros only in
// columns [0, r1), column block [c0, c1) only in rows [c0, T). So the upper-right quarter is neither
// computed nor read: a quarter of attention's GEMM work and of its T x T memory traffic. (More cuts save
// more, at one more GEMM launch per cut and per op.)
//
// Host code over any GEMM with the signature of kernels/cuda's gemm_grid:
//   gemm(trans_a, trans_b, M, N, K, alpha, A, lda, strides_a, B, ldb, strides_b, beta, C, ldc, strides_c,
//        grid)
// (row-major, over a grid of heads x batch elements, kernels/gemm_grid.h), so the plan is checked on the
// CPU (tests/unit/test_causal_blocks.cpp) and run with cuBLAS (kernels/cuda/attention.cu). Score-shaped
// buffers are (batches, heads, T, T), contiguous; per-position ones (q, k, v, their gradients, the output)
// have row stride `ld` and their own head and batch strides. attention_forward and attention_backward at
// the end are the whole attention over such a GEMM and softmax passes: the CUDA ops and the CPU's bf16 ops
// (kernels/cpu/bf16_attention.cpp) run the same plan, pass for pass.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>

#include <zshard/error.h>

#include "kernels/gemm_grid.h"

namespace zshard::causal_blocks {

struct Span {
  int begin, end;
  int size() const { return end - begin; }
};

inline std::array<Span, 2> cuts(int Tn) { return {{{0, Tn / 2}, {Tn / 2, Tn}}}; }

// Per-position operand: base pointer, row stride, where each (batch element, head) slice starts.
template <class T>
struct Rows {
  T* data;
  int ld;
  GridStrides stride;
  T* row(int r) const { return data + (long long)r * ld; }
};

// Contiguous (batches, heads, T, T) scores.
inline GridStrides score_strides(int Tn, GemmGrid grid) {
  const long long tt = (long long)Tn * Tn;
  return {tt, grid.heads * tt};
}

// How many batch elements one pass of the backward takes so that its score-gradient scratch stays within
// `budget` bytes (at least one element, at most B).
inline int batch_chunk(int B, size_t bytes_per_element, size_t budget) {
  const size_t fit = bytes_per_element > 0 ? budget / bytes_per_element : size_t(B);
  return int(std::clamp<size_t>(fit, 1, size_t(std::max(B, 1))));
}

// S[r0:r1, 0:r1] = alpha * A[r0:r1] @ B[0:r1]^T for each row block (the scores QK^T, and dP = dO V^T).
template <class T, class Gemm>
void masked_outer(Gemm&& gemm, T* S, int Tn, Rows<const T> A, Rows<const T> B, int hs, float alpha,
                  GemmGrid grid) {
  for (Span r : cuts(Tn))
    if (r.size() > 0)
      gemm(false, true, r.size(), r.end, hs, alpha, A.row(r.begin), A.ld, A.stride, B.data, B.ld, B.stride,
           0.f, S + (long long)r.begin * Tn, Tn, score_strides(Tn, grid), grid);
}

// Out[r0:r1] = alpha * P[r0:r1, 0:r1] @ X[0:r1] + beta * Out[r0:r1] (the output P V, and dQ = dS K).
template <class T, class Gemm>
void lower_times(Gemm&& gemm, Rows<T> Out, const T* P, int Tn, Rows<const T> X, int hs, float alpha,
                 float beta, GemmGrid grid) {
  for (Span r : cuts(Tn))
    if (r.size() > 0)
      gemm(false, false, r.size(), hs, r.end, alpha, P + (long long)r.begin * Tn, Tn, score_strides(Tn, grid),
           X.data, X.ld, X.stride, beta, Out.row(r.begin), Out.ld, Out.stride, grid);
}

// Out[c0:c1] += alpha * P[c0:T, c0:c1]^T @ X[c0:T] for each column block (dV = P^T dO, dK = dS^T Q).
template <class T, class Gemm>
void lower_transposed_times(Gemm&& gemm, Rows<T> Out, const T* P, int Tn, Rows<const T> X, int hs,
                            float alpha, GemmGrid grid) {
  for (Span c : cuts(Tn))
    if (c.size() > 0)
      gemm(true, false, c.size(), hs, Tn - c.begin, alpha, P + (long long)c.begin * Tn + c.begin, Tn,
           score_strides(Tn, grid), X.row(c.begin), X.ld, X.stride, 1.f, Out.row(c.begin), Out.ld, Out.stride,
           grid);
}

// What attention derives from (T, C, NH): the head size, the scale of the scores, the elements of one
// head's score matrix, and where each batch element's heads sit in qkv (rows of 3C) and in the output and
// its gradient (rows of C).
struct AttentionShape {
  int hs, C3;
  long long tt;
  float scale;  // 1/sqrt(hs)
  GridStrides qkv, out;
};

inline AttentionShape attention_shape(int Tn, int C, int NH) {
  ZS_CHECK(NH > 0 && C % NH == 0, "attention: C=", C, " is not a multiple of NH=", NH);
  const int hs = C / NH;
  return {hs, 3 * C, (long long)Tn * Tn, 1.f / std::sqrt(float(hs)), {hs, (long long)Tn * 3 * C},
          {hs, (long long)Tn * C}};
}

// Batch elements per pass of attention_backward: its (chunk, NH, T, T) score-gradient scratch stays within
// 256 MiB (or one batch element), big enough that each GEMM covers many batch elements, small beside the
// saved probabilities of a GPT-2 layer.
inline int attention_backward_chunk(int B, int Tn, int NH, size_t element_size) {
  constexpr size_t kScoreScratchBudget = size_t(256) << 20;
  return batch_chunk(B, size_t(NH) * Tn * Tn * element_size, kScoreScratchBudget);
}
// That scratch's bytes: what the backward allocates, and what a model's workspace_bytes counts for it.
inline size_t score_gradient_bytes(int B, int Tn, int NH, size_t element_size) {
  return size_t(attention_backward_chunk(B, Tn, NH, element_size)) * NH * Tn * Tn * element_size;
}

// Causal attention forward: scores = scale * Q K^T into att (all but the upper-right quarter), then
// softmax(att, rows, Tn) over its B * NH * Tn rows in place (the masked future set to 0), then out = P V.
template <class T, class Gemm, class Softmax>
void attention_forward(Gemm&& gemm, Softmax&& softmax, T* out, T* att, const T* qkv, int B, int Tn, int C, int NH) {
  const AttentionShape g = attention_shape(Tn, C, NH);
  if (B == 0 || Tn == 0) return;
  const GemmGrid grid{NH, B};
  const Rows<const T> q{qkv, g.C3, g.qkv}, k{qkv + C, g.C3, g.qkv}, v{qkv + 2 * C, g.C3, g.qkv};
  masked_outer(gemm, att, Tn, q, k, g.hs, g.scale, grid);
  softmax(att, B * NH * Tn, Tn);
  lower_times(gemm, Rows<T>{out, C, g.out}, att, Tn, v, g.hs, 1.f, 0.f, grid);
}

// Its backward, accumulating into dqkv, in passes of attention_backward_chunk(...) batch elements whose
// score gradients go to `ds` (that many (NH, T, T) matrices); softmax_backward(ds, att, rows, Tn) turns
// dP into dS in place.
template <class T, class Gemm, class SoftmaxBackward>
void attention_backward(Gemm&& gemm, SoftmaxBackward&& softmax_backward, T* ds, T* dqkv, const T* dout,
                        const T* qkv, const T* att, int B, int Tn, int C, int NH) {
  const AttentionShape g = attention_shape(Tn, C, NH);
  if (B == 0 || Tn == 0) return;
  const int chunk = attention_backward_chunk(B, Tn, NH, sizeof(T));
  for (int b0 = 0; b0 < B; b0 += chunk) {
    const GemmGrid grid{NH, std::min(chunk, B - b0)};
    const Rows<const T> q{qkv + b0 * g.qkv.batch, g.C3, g.qkv};
    const Rows<const T> k{q.data + C, g.C3, g.qkv}, v{q.data + 2 * C, g.C3, g.qkv};
    const Rows<T> dq{dqkv + b0 * g.qkv.batch, g.C3, g.qkv};
    const Rows<T> dk{dq.data + C, g.C3, g.qkv}, dv{dq.data + 2 * C, g.C3, g.qkv};
    const Rows<const T> d_o{dout + b0 * g.out.batch, C, g.out};
    const T* a = att + b0 * NH * g.tt;
    masked_outer(gemm, ds, Tn, d_o, v, g.hs, 1.f, grid);                // dP = dO V^T
    lower_transposed_times(gemm, dv, a, Tn, d_o, g.hs, 1.f, grid);      // dV += P^T dO
    softmax_backward(ds, a, grid.count() * Tn, Tn);
    // The 1/sqrt(hs) of the scores is folded into alpha.
    lower_times(gemm, dq, ds, Tn, k, g.hs, g.scale, 1.f, grid);         // dQ += dS K
    lower_transposed_times(gemm, dk, ds, Tn, q, g.hs, g.scale, grid);   // dK += dS^T Q
  }
}

}  // namespace zshard::causal_blocks
