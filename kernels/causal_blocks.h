// The GEMMs of causal attention with the causal structure used at block granularity. Rows and columns of
// the (T x T) score matrix are cut at T/2: row block [r0, r1) of the scores has non-zeros only in
// columns [0, r1), column block [c0, c1) only in rows [c0, T). So the upper-right quarter is neither
// computed nor read: a quarter of attention's GEMM work and of its T x T memory traffic. (More cuts save
// more, at one more GEMM launch per cut, per op and per batch element.)
//
// Host code over any strided-batched GEMM with the signature of kernels/cuda's gemm_batched:
//   gemm(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc, stride_c, batch)
// (row-major, the batch being the heads), so the plan is checked on the CPU (tests/unit/
// test_causal_blocks.cpp) and run with cuBLAS (kernels/cuda/attention.cu). Score-shaped buffers are
// (heads, T, T) with row stride T; per-position ones (q, k, v, their gradients, the output) have row
// stride `ld` and heads `hs` apart.
#pragma once
#include <array>

namespace zshard::causal_blocks {

struct Span {
  int begin, end;
  int size() const { return end - begin; }
};

inline std::array<Span, 2> cuts(int Tn) { return {{{0, Tn / 2}, {Tn / 2, Tn}}}; }

// Per-position operand: base pointer, row stride, head stride.
template <class T>
struct Rows {
  T* data;
  int ld;
  long long head_stride;
  T* row(int r) const { return data + (long long)r * ld; }
};

// S[r0:r1, 0:r1] = alpha * A[r0:r1] @ B[0:r1]^T for each row block (the scores QK^T, and dP = dO V^T).
template <class T, class Gemm>
void masked_outer(Gemm&& gemm, T* S, int Tn, Rows<const T> A, Rows<const T> B, int hs, float alpha,
                  int heads) {
  const long long tt = (long long)Tn * Tn;
  for (Span r : cuts(Tn))
    if (r.size() > 0)
      gemm(false, true, r.size(), r.end, hs, alpha, A.row(r.begin), A.ld, A.head_stride, B.data, B.ld,
           B.head_stride, 0.f, S + (long long)r.begin * Tn, Tn, tt, heads);
}

// Out[r0:r1] = alpha * P[r0:r1, 0:r1] @ X[0:r1] + beta * Out[r0:r1] (the output P V, and dQ = dS K).
template <class T, class Gemm>
void lower_times(Gemm&& gemm, Rows<T> Out, const T* P, int Tn, Rows<const T> X, int hs, float alpha,
                 float beta, int heads) {
  const long long tt = (long long)Tn * Tn;
  for (Span r : cuts(Tn))
    if (r.size() > 0)
      gemm(false, false, r.size(), hs, r.end, alpha, P + (long long)r.begin * Tn, Tn, tt, X.data, X.ld,
           X.head_stride, beta, Out.row(r.begin), Out.ld, Out.head_stride, heads);
}

// Out[c0:c1] += alpha * P[c0:T, c0:c1]^T @ X[c0:T] for each column block (dV = P^T dO, dK = dS^T Q).
template <class T, class Gemm>
void lower_transposed_times(Gemm&& gemm, Rows<T> Out, const T* P, int Tn, Rows<const T> X, int hs,
                            float alpha, int heads) {
  const long long tt = (long long)Tn * Tn;
  for (Span c : cuts(Tn))
    if (c.size() > 0)
      gemm(true, false, c.size(), hs, Tn - c.begin, alpha, P + (long long)c.begin * Tn + c.begin, Tn, tt,
           X.row(c.begin), X.ld, X.head_stride, 1.f, Out.row(c.begin), Out.ld, Out.head_stride, heads);
}

}  // namespace zshard::causal_blocks
