// The bf16 CPU ops other than attention (kernels/cpu/bf16_attention.cpp), rounding where their CUDA twins
// store (kernels/cpu/ops.h). An op whose CUDA twin computes in fp32 from its bf16 inputs and rounds each
// output once runs the fp32 op on fp32 copies of its arrays, the outputs it accumulates into included,
// and rounds the results once; the others are written out.
#include <algorithm>
#include <numeric>
#include <vector>

#include <zshard/error.h>

#include "kernels/cpu/bf16_math.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

namespace zshard::cpu {

namespace bf16_math {

Fp32::Fp32(size_t n) : n_(n), absent_(false), buffer_(std::max<size_t>(n, 1) * sizeof(float), Device::cpu, Category::workspace) {}

Fp32::Fp32(const bf16* values, size_t n) : Fp32(n) {
  absent_ = values == nullptr;
  if (absent_) return;
  float* out = get();
  for (size_t i = 0; i < n; ++i) out[i] = float(values[i]);
}

Fp32::Fp32(const bf16* values, int rows, int cols, int ld)
    : Fp32(rows > 0 ? size_t(rows - 1) * size_t(ld) + size_t(cols) : 0) {
  float* out = get();
  std::fill(out, out + n_, 0.f);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) out[size_t(r) * ld + c] = float(values[size_t(r) * ld + c]);
}

void Fp32::round_into(bf16* dst) const {
  if (absent_) return;
  const float* in = get();
  for (size_t i = 0; i < n_; ++i) dst[i] = bf16(in[i]);
}

void Fp32::round_rows_into(bf16* dst, int rows, int cols, int ld) const {
  const float* in = get();
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) dst[size_t(r) * ld + c] = bf16(in[size_t(r) * ld + c]);
}

}  // namespace bf16_math

using bf16_math::Fp32;

namespace {
float wide(bf16 x) { return float(x); }
}  // namespace

template <>
void embedding_forward<bf16>(bf16* out, const int32_t* tokens, const bf16* wte, const bf16* wpe, int B, int Tn,
                             int C) {
  for (size_t bt = 0; bt < size_t(B) * Tn; ++bt) {
    ZS_CHECK(tokens[bt] >= 0, "embedding: negative token ", tokens[bt]);
    const bf16* e = wte + size_t(tokens[bt]) * C;
    const bf16* p = wpe ? wpe + (bt % size_t(Tn)) * C : nullptr;
    bf16* o = out + bt * C;
    for (int c = 0; c < C; ++c) o[c] = p ? bf16(wide(e[c]) + wide(p[c])) : e[c];
  }
}

namespace {
void add_token_rows(bf16* dwte, const bf16* dout, const int32_t* tokens, size_t N, int C) {
  std::vector<size_t> order(N);
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tokens[a] < tokens[b]; });
  std::vector<float> sum(static_cast<size_t>(C));
  for (size_t first = 0; first < N;) {
    const int32_t token = tokens[order[first]];
    size_t end = first;
    std::fill(sum.begin(), sum.end(), 0.f);
    for (; end < N && tokens[order[end]] == token; ++end)
      for (int c = 0; c < C; ++c) sum[c] += wide(dout[order[end] * C + c]);
    bf16* row = dwte + size_t(token) * C;
    for (int c = 0; c < C; ++c) row[c] = bf16(wide(row[c]) + sum[c]);
    first = end;
  }
}
}  // namespace

// As the CUDA twin: each token's rows summed in fp32, in position order, and added to its dwte row once
// (a running bf16 sum would round a frequent token's thousand additions away); dwpe sums over the batch.
template <>
void embedding_backward<bf16>(bf16* dwte, bf16* dwpe, const bf16* dout, const int32_t* tokens, int B, int Tn,
                              int C) {
  const size_t N = size_t(B) * Tn;
  if (dwte) add_token_rows(dwte, dout, tokens, N, C);
  if (!dwpe) return;
  for (size_t i = 0; i < size_t(Tn) * C; ++i) {
    float acc = wide(dwpe[i]);
    for (int b = 0; b < B; ++b) acc += wide(dout[size_t(b) * Tn * C + i]);
    dwpe[i] = bf16(acc);
  }
}

template <>
void layernorm_forward<bf16>(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* weight,
                             const bf16* bias, int N, int C) {
  const size_t n = size_t(N) * C;
  const Fp32 x(inp, n), w(weight, size_t(C)), b(bias, size_t(C)), o(n);
  layernorm_forward<float>(o.get(), mean, rstd, x.get(), w.get(), b.get(), N, C);
  o.round_into(out);
}

template <>
void layernorm_backward<bf16>(bf16* dinp, bf16* dweight, bf16* dbias, const bf16* dout, const bf16* inp,
                              const bf16* weight, const float* mean, const float* rstd, int N, int C) {
  const size_t n = size_t(N) * C;
  const Fp32 dx(dinp, n), dw(dweight, size_t(C)), db(dbias, size_t(C)), d(dout, n), x(inp, n), w(weight, size_t(C));
  layernorm_backward<float>(dx.get(), dw.get(), db.get(), d.get(), x.get(), w.get(), mean, rstd, N, C);
  dx.round_into(dinp);
  dw.round_into(dweight);
  db.round_into(dbias);
}

// The separate ops' bits, as on cuda: the residual rounded to bf16, and normalised as stored.
template <>
void layernorm_residual_forward<bf16>(bf16* residual, bf16* out, float* mean, float* rstd, const bf16* a,
                                      const bf16* b, const bf16* weight, const bf16* bias, int N, int C) {
  residual_forward<bf16>(residual, a, b, size_t(N) * C);
  layernorm_forward<bf16>(out, mean, rstd, residual, weight, bias, N, C);
}

template <>
void rmsnorm_forward<bf16>(bf16* out, float* rstd, const bf16* inp, const bf16* weight, int N, int C, float eps) {
  const size_t n = size_t(N) * C;
  const Fp32 x(inp, n), w(weight, size_t(C)), o(n);
  rmsnorm_forward<float>(o.get(), rstd, x.get(), w.get(), N, C, eps);
  o.round_into(out);
}

template <>
void rmsnorm_backward<bf16>(bf16* dinp, bf16* dweight, const bf16* dout, const bf16* inp, const bf16* weight,
                            const float* rstd, int N, int C) {
  const size_t n = size_t(N) * C;
  const Fp32 dx(dinp, n), dw(dweight, size_t(C)), d(dout, n), x(inp, n), w(weight, size_t(C));
  rmsnorm_backward<float>(dx.get(), dw.get(), d.get(), x.get(), w.get(), rstd, N, C);
  dx.round_into(dinp);
  dw.round_into(dweight);
}

template <>
void rmsnorm_residual_forward<bf16>(bf16* residual, bf16* out, float* rstd, const bf16* a, const bf16* b,
                                    const bf16* weight, int N, int C, float eps) {
  residual_forward<bf16>(residual, a, b, size_t(N) * C);
  rmsnorm_forward<bf16>(out, rstd, residual, weight, N, C, eps);
}

template <>
void rope_forward<bf16>(bf16* x, int B, int Tn, int NH, int HS, float theta) {
  const Fp32 v(x, size_t(B) * Tn * NH * HS);
  rope_forward<float>(v.get(), B, Tn, NH, HS, theta);
  v.round_into(x);
}

template <>
void rope_backward<bf16>(bf16* dx, int B, int Tn, int NH, int HS, float theta) {
  const Fp32 v(dx, size_t(B) * Tn * NH * HS);
  rope_backward<float>(v.get(), B, Tn, NH, HS, theta);
  v.round_into(dx);
}

template <>
void gqa_pack_backward<bf16>(bf16* dq, bf16* dk, bf16* dv, const bf16* dqkv, int B, int Tn, int NH, int NKV,
                             int HS) {
  ZS_CHECK(NKV > 0 && NH % NKV == 0, "gqa_pack_backward: ", NH, " query heads do not share ", NKV,
           " kv heads evenly");
  const size_t rows = size_t(B) * Tn, q = rows * NH * HS, kv = rows * NKV * HS;
  const Fp32 gq(dq, q), gk(dk, kv), gv(dv, kv), in(dqkv, 3 * q);
  gqa_pack_backward<float>(gq.get(), gk.get(), gv.get(), in.get(), B, Tn, NH, NKV, HS);
  gq.round_into(dq);
  gk.round_into(dk);
  gv.round_into(dv);
}

template <>
void swiglu_forward<bf16>(bf16* out, const bf16* gate, const bf16* up, size_t n) {
  const Fp32 g(gate, n), u(up, n), o(n);
  swiglu_forward<float>(o.get(), g.get(), u.get(), n);
  o.round_into(out);
}

template <>
void swiglu_backward<bf16>(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up, size_t n,
                           InputGrad mode) {
  const bool set = mode == InputGrad::set;  // then the fp32 op does not read the gradients' old values
  const Fp32 dg = set ? Fp32(n) : Fp32(dgate, n), du = set ? Fp32(n) : Fp32(dup, n), d(dout, n), g(gate, n), u(up, n);
  swiglu_backward<float>(dg.get(), du.get(), d.get(), g.get(), u.get(), n, mode);
  dg.round_into(dgate);
  du.round_into(dup);
}

template <>
void gelu_forward<bf16>(bf16* out, const bf16* inp, size_t n) {
  const Fp32 x(inp, n), o(n);
  gelu_forward<float>(o.get(), x.get(), n);
  o.round_into(out);
}

template <>
void gelu_backward<bf16>(bf16* dinp, const bf16* inp, const bf16* dout, size_t n) {
  const Fp32 dx(dinp, n), x(inp, n), d(dout, n);
  gelu_backward<float>(dx.get(), x.get(), d.get(), n);
  dx.round_into(dinp);
}

template <>
void residual_forward<bf16>(bf16* out, const bf16* a, const bf16* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = bf16(wide(a[i]) + wide(b[i]));
}

template <>
void residual_backward<bf16>(bf16* da, bf16* db, const bf16* dout, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float d = wide(dout[i]);
    da[i] = bf16(wide(da[i]) + d);
    db[i] = bf16(wide(db[i]) + d);
  }
}

// cuBLAS's bf16 GEMM with fp32 compute: the bf16 operands exactly, fp32 products and sums, C read and
// written in bf16, one rounding per element.
template <>
void gemm<bf16>(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A, int lda,
                const bf16* B, int ldb, float beta, bf16* C, int ldc) {
  bf16_math::check_gemm_args(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  const Fp32 a(A, trans_a ? K : M, trans_a ? M : K, lda), b(B, trans_b ? N : K, trans_b ? K : N, ldb);
  const Fp32 c(C, M, N, ldc);
  gemm<float>(trans_a, trans_b, M, N, K, alpha, a.get(), lda, b.get(), ldb, beta, c.get(), ldc);
  c.round_rows_into(C, M, N, ldc);
}

// The bias is added to the GEMM's rounded output, and the sum rounded again, as the CUDA twin's bias kernel
// after cuBLAS.
template <>
void linear_forward<bf16>(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias, int N, int C, int OC) {
  gemm<bf16>(false, false, N, OC, C, 1.f, inp, C, weight, OC, 0.f, out, OC);
  if (!bias) return;
  for (size_t i = 0; i < size_t(N) * OC; ++i) out[i] = bf16(wide(out[i]) + wide(bias[i % size_t(OC)]));
}

template <>
void linear_backward<bf16>(bf16* dinp, bf16* dweight, bf16* dbias, const bf16* dout, const bf16* inp,
                           const bf16* weight, int N, int C, int OC) {
  ZS_CHECK(dinp, "linear_backward: dinp is required");
  gemm<bf16>(false, true, N, C, OC, 1.f, dout, OC, weight, OC, 1.f, dinp, C);
  if (dweight) gemm<bf16>(true, false, C, OC, N, 1.f, inp, C, dout, OC, 1.f, dweight, OC);
  if (!dbias) return;
  std::vector<float> sum(size_t(OC), 0.f);  // column sums in fp32, added once
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < OC; ++j) sum[j] += wide(dout[size_t(i) * OC + j]);
  for (int j = 0; j < OC; ++j) dbias[j] = bf16(wide(dbias[j]) + sum[j]);
}

// Each row's loss and logits gradient in fp32 from the bf16 logits, each rounded once; the returned sum is
// of the fp32 losses, as the CUDA twin's. dlogits may alias logits.
template <>
double cross_entropy_forward_backward<bf16>(bf16* dlogits, bf16* losses, const bf16* logits,
                                            const int32_t* targets, int N, int V, int ld, float dloss) {
  ZS_CHECK(ld >= V, "cross_entropy: row stride ", ld, " below the row length ", V);
  const bool in_place = dlogits == logits;
  const size_t extent = N > 0 ? size_t(N - 1) * size_t(ld) + size_t(V) : 0;
  const Fp32 x(logits, N, V, ld), loss(static_cast<size_t>(N)), separate(dlogits && !in_place ? extent : 0);
  float* d = !dlogits ? nullptr : in_place ? x.get() : separate.get();
  const double total = cross_entropy_forward_backward<float>(d, loss.get(), x.get(), targets, N, V, ld, dloss);
  loss.round_into(losses);
  if (dlogits) (in_place ? x : separate).round_rows_into(dlogits, N, V, ld);
  return total;
}

template <>
double sum_squares<bf16>(const bf16* x, size_t n) {
  return detail::lane_sum<double>(n, [x](size_t i) { return double(wide(x[i])) * double(wide(x[i])); });
}

template <>
void axpy<bf16>(bf16* y, const bf16* x, float alpha, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = bf16(wide(y[i]) + alpha * wide(x[i]));
}

}  // namespace zshard::cpu
