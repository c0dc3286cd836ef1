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
// have row stride `ld` and their own head and batch strides.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>

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

}  // namespace zshard::causal_blocks
