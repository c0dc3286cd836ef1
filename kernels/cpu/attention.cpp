// Causal multi-head self-attention with per-(batch, head) GEMMs on the strided q/k/v slices of qkv, in two
// forms over one code: `blocks` keeps the (B, NH, T, T) probabilities for its backward; `fused` keeps each
// query row's log-sum-exp only and its backward recomputes the probabilities from q, k and those
// statistics, a row block at a time (flash attention's backward, without its tiling of the keys).
//
// The T x T score matrix is processed in blocks of kRowBlock query rows; block [r0, r1) only needs key
// columns [0, r1), so the GEMMs skip most of the masked upper triangle (about half the flops for long
// sequences) and each pass needs a kRowBlock x T scratch at most.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include <zshard/error.h>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

namespace zshard::cpu {

namespace {

constexpr int kRowBlock = 64;

// Softmax over row[0, n); row[n, len) is set to 0 (the masked future). Returns the row's log-sum-exp.
template <class T>
T causal_softmax_row(T* row, int n, int len) {
  T mx = row[0];
  for (int j = 1; j < n; ++j) mx = std::max(mx, row[j]);
  for (int j = 0; j < n; ++j) row[j] = detail::exp_nonpositive(row[j] - mx);
  const T sum = detail::sum_of(row, n);
  const T inv = T(1) / sum;
  for (int j = 0; j < n; ++j) row[j] *= inv;
  std::fill(row + n, row + len, T(0));
  return mx + std::log(sum);
}

// Softmax backward in place: dp <- p * (dp - dot), dot = sum(p * dp) (the blocks form) or, equal to it,
// the row's dO . O (the fused form, which has no row of p to sum over in the forward's bits). Masked
// entries have p = 0 and come out 0.
template <class T>
void softmax_backward_row(T* dp, const T* p, int len, T dot) {
  for (int j = 0; j < len; ++j) dp[j] = p[j] * (dp[j] - dot);
}

void check_heads(int C, int NH) {
  ZS_CHECK(NH > 0 && C % NH == 0, "attention: C=", C, " is not a multiple of NH=", NH);
}

// One (batch element, head) slice: q, k and v rows C3 apart in qkv, the output's (or output gradient's)
// rows C apart.
template <class T>
struct Head {
  const T *q, *k, *v;
  int C3, C, hs;
  T scale;  // 1/sqrt(hs)
};

// Calls f(head, b, h, qkv offset, output offset) for every slice.
template <class T, class F>
void for_each_head(const T* qkv, int B, int Tn, int C, int NH, F&& f) {
  check_heads(C, NH);
  const int hs = C / NH, C3 = 3 * C;
  const T scale = T(1) / std::sqrt(T(hs));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const size_t qkv_offset = size_t(b) * Tn * C3 + size_t(h) * hs;
      const T* q = qkv + qkv_offset;
      f(Head<T>{q, q + C, q + 2 * C, C3, C, hs, scale}, b, h, qkv_offset, size_t(b) * Tn * C + size_t(h) * hs);
    }
}

// Rows [r0, r1) of one head's forward: P = softmax(scale q k^T) over the causal columns [0, t] of row t into
// p (rows x r1 at leading dimension ldp, zero from t + 1 to len), then o = P v. Row t's log-sum-exp goes to
// lse[t] when lse is given.
template <class T>
void forward_rows(const Head<T>& x, T* o, int r0, int r1, T* p, int ldp, int len, T* lse) {
  const int rows = r1 - r0;
  gemm<T>(false, true, rows, r1, x.hs, x.scale, x.q + size_t(r0) * x.C3, x.C3, x.k, x.C3, T(0), p, ldp);
  for (int t = r0; t < r1; ++t) {
    const T row_lse = causal_softmax_row(p + size_t(t - r0) * ldp, t + 1, len);
    if (lse) lse[t] = row_lse;
  }
  gemm<T>(false, false, rows, x.hs, r1, T(1), p, ldp, x.v, x.C3, T(0), o + size_t(r0) * x.C, x.C);
}

// The gradients of one head's q, k and v slices (rows C3 apart).
template <class T>
struct HeadGrads {
  T *dq, *dk, *dv;
};

// Rows [r0, r1) of one head's backward from their probabilities p (rows x r1 at leading dimension ldp) and
// dout's rows: dV += P^T dO, dP = dO V^T into ds (rows x r1), dS = P * (dP - dot(t)), then dQ += dS K and
// dK += dS^T Q with the scores' 1/sqrt(hs) folded into alpha.
template <class T, class Dot>
void backward_rows(const Head<T>& x, const HeadGrads<T>& g, const T* d_o, int r0, int r1, const T* p, int ldp,
                   T* ds, Dot&& dot) {
  const int rows = r1 - r0, C3 = x.C3;
  const T* dob = d_o + size_t(r0) * x.C;
  gemm<T>(false, true, rows, r1, x.hs, T(1), dob, x.C, x.v, C3, T(0), ds, r1);  // dP = dO V^T
  gemm<T>(true, false, r1, x.hs, rows, T(1), p, ldp, dob, x.C, T(1), g.dv, C3);  // dV += P^T dO
  for (int i = 0; i < rows; ++i) {
    T* dsi = ds + size_t(i) * r1;
    const T* pi = p + size_t(i) * ldp;
    softmax_backward_row(dsi, pi, r1, dot(r0 + i, dsi, pi));
  }
  gemm<T>(false, false, rows, x.hs, r1, x.scale, ds, r1, x.k, C3, T(1), g.dq + size_t(r0) * C3, C3);
  gemm<T>(true, false, r1, x.hs, rows, x.scale, ds, r1, x.q + size_t(r0) * C3, C3, T(1), g.dk, C3);
}

}  // namespace

template <class T>
void attention_forward(T* out, T* att, const T* qkv, int B, int Tn, int C, int NH) {
  for_each_head(qkv, B, Tn, C, NH, [&](const Head<T>& x, int b, int h, size_t, size_t out_offset) {
    T* a = att + (size_t(b) * NH + h) * Tn * Tn;
    for (int r0 = 0; r0 < Tn; r0 += kRowBlock)
      forward_rows<T>(x, out + out_offset, r0, std::min(Tn, r0 + kRowBlock), a + size_t(r0) * Tn, Tn, Tn, nullptr);
  });
}

template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, int B, int Tn, int C, int NH) {
  std::vector<T> dscores(size_t(std::min(Tn, kRowBlock)) * Tn);
  for_each_head(qkv, B, Tn, C, NH, [&](const Head<T>& x, int b, int h, size_t qkv_offset, size_t out_offset) {
    T* dq = dqkv + qkv_offset;
    const T* a = att + (size_t(b) * NH + h) * Tn * Tn;
    for (int r0 = 0; r0 < Tn; r0 += kRowBlock) {
      const int r1 = std::min(Tn, r0 + kRowBlock);
      const auto p_dot_dp = [r1](int, const T* dp, const T* p) {
        return detail::lane_sum<T>(size_t(r1), [=](size_t j) { return p[j] * dp[j]; });
      };
      backward_rows(x, {dq, dq + C, dq + 2 * C}, dout + out_offset, r0, r1, a + size_t(r0) * Tn, Tn,
                    dscores.data(), p_dot_dp);
    }
  });
}

template <class T>
void fused_attention_forward(T* out, Compute<T>* lse, const T* qkv, int B, int Tn, int C, int NH) {
  std::vector<T> probs(size_t(std::min(Tn, kRowBlock)) * Tn);
  for_each_head(qkv, B, Tn, C, NH, [&](const Head<T>& x, int b, int h, size_t, size_t out_offset) {
    T* head_lse = lse + (size_t(b) * NH + h) * Tn;
    for (int r0 = 0; r0 < Tn; r0 += kRowBlock) {
      const int r1 = std::min(Tn, r0 + kRowBlock);
      forward_rows(x, out + out_offset, r0, r1, probs.data(), r1, r1, head_lse);
    }
  });
}

template <class T>
void fused_attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const Compute<T>* lse, int B,
                              int Tn, int C, int NH) {
  check_heads(C, NH);
  std::fill(dqkv, dqkv + size_t(B) * Tn * 3 * C, T(0));  // written, not accumulated (ops.h)
  const size_t block = size_t(std::min(Tn, kRowBlock)) * Tn;
  std::vector<T> probs(block), dscores(block);
  for_each_head(qkv, B, Tn, C, NH, [&](const Head<T>& x, int b, int h, size_t qkv_offset, size_t out_offset) {
    T* dq = dqkv + qkv_offset;
    const T* head_lse = lse + (size_t(b) * NH + h) * Tn;
    const T *o = out + out_offset, *d_o = dout + out_offset;
    for (int r0 = 0; r0 < Tn; r0 += kRowBlock) {
      const int r1 = std::min(Tn, r0 + kRowBlock);
      T* p = probs.data();
      // The forward's probabilities again, exp(s - lse) over the causal columns.
      gemm<T>(false, true, r1 - r0, r1, x.hs, x.scale, x.q + size_t(r0) * x.C3, x.C3, x.k, x.C3, T(0), p, r1);
      for (int t = r0; t < r1; ++t) {
        T* row = p + size_t(t - r0) * r1;
        for (int j = 0; j <= t; ++j) row[j] = detail::exp_nonpositive(row[j] - head_lse[t]);
        std::fill(row + t + 1, row + r1, T(0));
      }
      const auto dout_dot_out = [&](int t, const T*, const T*) {
        const T *dot_row = d_o + size_t(t) * C, *o_row = o + size_t(t) * C;
        return detail::lane_sum<T>(size_t(x.hs), [=](size_t i) { return dot_row[i] * o_row[i]; });
      };
      backward_rows(x, {dq, dq + C, dq + 2 * C}, d_o, r0, r1, p, r1, dscores.data(), dout_dot_out);
    }
  });
}

template <class T>
void gqa_pack(T* qkv, const T* q, const T* k, const T* v, int B, int Tn, int NH, int NKV, int HS) {
  ZS_CHECK(NKV > 0 && NH % NKV == 0, "gqa_pack: ", NH, " query heads do not share ", NKV, " kv heads evenly");
  const int group = NH / NKV, C = NH * HS, KC = NKV * HS;
  for (size_t row = 0; row < size_t(B) * Tn; ++row) {
    T* out = qkv + row * 3 * C;
    std::copy(q + row * C, q + (row + 1) * C, out);
    for (int h = 0; h < NH; ++h) {
      const size_t src = row * KC + size_t(h / group) * HS;
      std::copy(k + src, k + src + HS, out + C + size_t(h) * HS);
      std::copy(v + src, v + src + HS, out + 2 * C + size_t(h) * HS);
    }
  }
}

template <class T>
void gqa_pack_backward(T* dq, T* dk, T* dv, const T* dqkv, int B, int Tn, int NH, int NKV, int HS) {
  ZS_CHECK(NKV > 0 && NH % NKV == 0, "gqa_pack_backward: ", NH, " query heads do not share ", NKV,
           " kv heads evenly");
  const int group = NH / NKV, C = NH * HS, KC = NKV * HS;
  for (size_t row = 0; row < size_t(B) * Tn; ++row) {
    const T* in = dqkv + row * 3 * C;
    for (int c = 0; c < C; ++c) dq[row * C + c] += in[c];
    for (int h = 0; h < NH; ++h) {
      T* dkh = dk + row * KC + size_t(h / group) * HS;
      T* dvh = dv + row * KC + size_t(h / group) * HS;
      for (int i = 0; i < HS; ++i) {
        dkh[i] += in[C + size_t(h) * HS + i];
        dvh[i] += in[2 * C + size_t(h) * HS + i];
      }
    }
  }
}

#define ZS_INSTANTIATE(T)                                                                               \
  template void attention_forward<T>(T*, T*, const T*, int, int, int, int);                             \
  template void attention_backward<T>(T*, const T*, const T*, const T*, int, int, int, int);            \
  template void gqa_pack<T>(T*, const T*, const T*, const T*, int, int, int, int, int);                 \
  template void gqa_pack_backward<T>(T*, T*, T*, const T*, int, int, int, int, int);                    \
  template void fused_attention_forward<T>(T*, Compute<T>*, const T*, int, int, int, int);               \
  template void fused_attention_backward<T>(T*, const T*, const T*, const T*, const Compute<T>*, int, int, int,  \
                                            int);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(double)
#undef ZS_INSTANTIATE
// A copy: bf16 moves as it is.
template void gqa_pack<bf16>(bf16*, const bf16*, const bf16*, const bf16*, int, int, int, int, int);

}  // namespace zshard::cpu
