// Causal multi-head self-attention with per-(batch, head) GEMMs on the strided q/k/v slices of qkv.
//
// The T x T score matrix is processed in blocks of kRowBlock query rows; block [r0, r1) only needs key
// columns [0, r1), so the GEMMs skip most of the masked upper triangle (about half the flops for long
// sequences) and the backward needs only a kRowBlock x T scratch.
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

// Softmax over row[0, n); row[n, len) is set to 0 (the masked future).
template <class T>
void causal_softmax_row(T* row, int n, int len) {
  T mx = row[0];
  for (int j = 1; j < n; ++j) mx = std::max(mx, row[j]);
  for (int j = 0; j < n; ++j) row[j] = detail::exp_nonpositive(row[j] - mx);
  const T inv = T(1) / detail::sum_of(row, n);
  for (int j = 0; j < n; ++j) row[j] *= inv;
  std::fill(row + n, row + len, T(0));
}

// Softmax backward in place: dp <- p * (dp - sum(p * dp)). Masked entries have p = 0 and come out 0.
template <class T>
void softmax_backward_row(T* dp, const T* p, int len) {
  const T dot = detail::lane_sum<T>(len, [=](size_t j) { return p[j] * dp[j]; });
  for (int j = 0; j < len; ++j) dp[j] = p[j] * (dp[j] - dot);
}

void check_heads(int C, int NH) {
  ZS_CHECK(NH > 0 && C % NH == 0, "attention: C=", C, " is not a multiple of NH=", NH);
}

}  // namespace

template <class T>
void attention_forward(T* out, T* att, const T* qkv, int B, int Tn, int C, int NH) {
  check_heads(C, NH);
  const int hs = C / NH, C3 = 3 * C;
  const T scale = T(1) / std::sqrt(T(hs));
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const T* q = qkv + size_t(b) * Tn * C3 + size_t(h) * hs;
      const T* k = q + C;
      const T* v = q + 2 * C;
      T* a = att + (size_t(b) * NH + h) * Tn * Tn;
      T* o = out + size_t(b) * Tn * C + size_t(h) * hs;
      for (int r0 = 0; r0 < Tn; r0 += kRowBlock) {
        const int r1 = std::min(Tn, r0 + kRowBlock), rows = r1 - r0;
        T* ab = a + size_t(r0) * Tn;
        gemm<T>(false, true, rows, r1, hs, scale, q + size_t(r0) * C3, C3, k, C3, T(0), ab, Tn);
        for (int t = r0; t < r1; ++t) causal_softmax_row(a + size_t(t) * Tn, t + 1, Tn);
        gemm<T>(false, false, rows, hs, r1, T(1), ab, Tn, v, C3, T(0), o + size_t(r0) * C, C);
      }
    }
  }
}

template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, int B, int Tn, int C, int NH) {
  check_heads(C, NH);
  const int hs = C / NH, C3 = 3 * C;
  const T scale = T(1) / std::sqrt(T(hs));
  std::vector<T> dscores(size_t(std::min(Tn, kRowBlock)) * Tn);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const size_t qkv_offset = size_t(b) * Tn * C3 + size_t(h) * hs;
      const T* q = qkv + qkv_offset;
      const T* k = q + C;
      const T* v = q + 2 * C;
      T* dq = dqkv + qkv_offset;
      T* dk = dq + C;
      T* dv = dq + 2 * C;
      const T* a = att + (size_t(b) * NH + h) * Tn * Tn;
      const T* d_o = dout + size_t(b) * Tn * C + size_t(h) * hs;
      for (int r0 = 0; r0 < Tn; r0 += kRowBlock) {
        const int r1 = std::min(Tn, r0 + kRowBlock), rows = r1 - r0;
        const T* ab = a + size_t(r0) * Tn;
        const T* dob = d_o + size_t(r0) * C;
        T* ds = dscores.data();  // rows x r1, leading dimension r1
        gemm<T>(false, true, rows, r1, hs, T(1), dob, C, v, C3, T(0), ds, r1);  // dP = dO V^T
        gemm<T>(true, false, r1, hs, rows, T(1), ab, Tn, dob, C, T(1), dv, C3);  // dV += P^T dO
        for (int i = 0; i < rows; ++i) softmax_backward_row(ds + size_t(i) * r1, ab + size_t(i) * Tn, r1);
        // The 1/sqrt(hs) of the scores is folded into alpha.
        gemm<T>(false, false, rows, hs, r1, scale, ds, r1, k, C3, T(1), dq + size_t(r0) * C3, C3);
        gemm<T>(true, false, r1, hs, rows, scale, ds, r1, q + size_t(r0) * C3, C3, T(1), dk, C3);
      }
    }
  }
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
  template void gqa_pack_backward<T>(T*, T*, T*, const T*, int, int, int, int, int);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(double)
#undef ZS_INSTANTIATE
// A copy: bf16 moves as it is.
template void gqa_pack<bf16>(bf16*, const bf16*, const bf16*, const bf16*, int, int, int, int, int);

}  // namespace zshard::cpu
