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

Fp32::Fp32(const bf16* values, int rows, int cols, int ld) : Fp32(size_t(rows) * size_t(cols)) {
  float* out = get();
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) out[size_t(r) * cols + c] = float(values[size_t(r) * ld + c]);
}

void Fp32::round_into(bf16* dst) const {
  if (absent_) return;
  const float* in = get();
  for (size_t i = 0; i < n_; ++i) dst[i] = bf16(in[i]);
}

void Fp32::round_rows_into(bf16* dst, int rows, int cols, int ld) const {
  const float* in = get();
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) dst[size_t(r) * ld + c] = bf16(in[size_t(r) * cols + c]);
}

}  // namespace bf16_math

using bf16_math::Fp32;
using bf16_math::in_blocks;

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
  const Fp32 w(weight, size_t(C)), b(bias, size_t(C));
  in_blocks(size_t(N), 2 * C * sizeof(float), [&](size_t first, size_t rows) {
    const size_t at = first * C, n = rows * C;
    const Fp32 x(inp + at, n), o(n);
    layernorm_forward<float>(o.get(), mean + first, rstd + first, x.get(), w.get(), b.get(), int(rows), C);
    o.round_into(out + at);
  });
}

template <>
void layernorm_backward<bf16>(bf16* dinp, bf16* dweight, bf16* dbias, const bf16* dout, const bf16* inp,
                              const bf16* weight, const float* mean, const float* rstd, int N, int C) {
  // The gain's and bias's gradients sum over every block in fp32, row after row, and round once.
  const Fp32 dw(dweight, size_t(C)), db(dbias, size_t(C)), w(weight, size_t(C));
  in_blocks(size_t(N), 3 * C * sizeof(float), [&](size_t first, size_t rows) {
    const size_t at = first * C, n = rows * C;
    const Fp32 dx(dinp + at, n), d(dout + at, n), x(inp + at, n);
    layernorm_backward<float>(dx.get(), dw.get(), db.get(), d.get(), x.get(), w.get(), mean + first, rstd + first,
                              int(rows), C);
    dx.round_into(dinp + at);
  });
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
  const Fp32 w(weight, size_t(C));
  in_blocks(size_t(N), 2 * C * sizeof(float), [&](size_t first, size_t rows) {
    const size_t at = first * C, n = rows * C;
    const Fp32 x(inp + at, n), o(n);
    rmsnorm_forward<float>(o.get(), rstd + first, x.get(), w.get(), int(rows), C, eps);
    o.round_into(out + at);
  });
}

template <>
void rmsnorm_backward<bf16>(bf16* dinp, bf16* dweight, const bf16* dout, const bf16* inp, const bf16* weight,
                            const float* rstd, int N, int C) {
  const Fp32 dw(dweight, size_t(C)), w(weight, size_t(C));  // dw sums over the blocks, as in layernorm_backward
  in_blocks(size_t(N), 3 * C * sizeof(float), [&](size_t first, size_t rows) {
    const size_t at = first * C, n = rows * C;
    const Fp32 dx(dinp + at, n), d(dout + at, n), x(inp + at, n);
    rmsnorm_backward<float>(dx.get(), dw.get(), d.get(), x.get(), w.get(), rstd + first, int(rows), C);
    dx.round_into(dinp + at);
  });
  dw.round_into(dweight);
}

template <>
void rmsnorm_residual_forward<bf16>(bf16* residual, bf16* out, float* rstd, const bf16* a, const bf16* b,
                                    const bf16* weight, int N, int C, float eps) {
  residual_forward<bf16>(residual, a, b, size_t(N) * C);
  rmsnorm_forward<bf16>(out, rstd, residual, weight, N, C, eps);
}

template <>
void rope_forward<bf16>(bf16* x, int B, int Tn, int NH, int HS, const ops::RopeFrequencies& freq) {
  const size_t sequence = size_t(Tn) * NH * HS;
  in_blocks(size_t(B), sequence * sizeof(float), [&](size_t first, size_t count) {
    const Fp32 v(x + first * sequence, count * sequence);
    rope_forward<float>(v.get(), int(count), Tn, NH, HS, freq);
    v.round_into(x + first * sequence);
  });
}

template <>
void rope_backward<bf16>(bf16* dx, int B, int Tn, int NH, int HS, const ops::RopeFrequencies& freq) {
  const size_t sequence = size_t(Tn) * NH * HS;
  in_blocks(size_t(B), sequence * sizeof(float), [&](size_t first, size_t count) {
    const Fp32 v(dx + first * sequence, count * sequence);
    rope_backward<float>(v.get(), int(count), Tn, NH, HS, freq);
    v.round_into(dx + first * sequence);
  });
}

namespace {
// A sequence's dq, dk, dv and packed dqkv (3 q).
size_t gqa_backward_bytes(int Tn, int NH, int NKV, int HS) {
  const size_t q = size_t(Tn) * NH * HS, kv = size_t(Tn) * NKV * HS;
  return (4 * q + 2 * kv) * sizeof(float);
}
}  // namespace

int64_t bf16_gqa_pack_backward_scratch_bytes(int B, int Tn, int NH, int NKV, int HS) {
  return bf16_math::block_bytes(size_t(B), gqa_backward_bytes(Tn, NH, NKV, HS));
}

template <>
void gqa_pack_backward<bf16>(bf16* dq, bf16* dk, bf16* dv, const bf16* dqkv, int B, int Tn, int NH, int NKV,
                             int HS) {
  ZS_CHECK(NKV > 0 && NH % NKV == 0, "gqa_pack_backward: ", NH, " query heads do not share ", NKV,
           " kv heads evenly");
  const size_t q = size_t(Tn) * NH * HS, kv = size_t(Tn) * NKV * HS;  // a sequence's
  in_blocks(size_t(B), gqa_backward_bytes(Tn, NH, NKV, HS), [&](size_t first, size_t count) {
    const Fp32 gq(dq + first * q, count * q), gk(dk + first * kv, count * kv), gv(dv + first * kv, count * kv),
        in(dqkv + first * 3 * q, count * 3 * q);
    gqa_pack_backward<float>(gq.get(), gk.get(), gv.get(), in.get(), int(count), Tn, NH, NKV, HS);
    gq.round_into(dq + first * q);
    gk.round_into(dk + first * kv);
    gv.round_into(dv + first * kv);
  });
}

template <>
void swiglu_forward<bf16>(bf16* out, const bf16* gate, const bf16* up, size_t n) {
  in_blocks(n, 3 * sizeof(float), [&](size_t first, size_t count) {
    const Fp32 g(gate + first, count), u(up + first, count), o(count);
    swiglu_forward<float>(o.get(), g.get(), u.get(), count);
    o.round_into(out + first);
  });
}

namespace {
constexpr size_t kSwigluBackwardBytes = 5 * sizeof(float);  // dgate, dup, dout, gate and up
constexpr size_t kGeluBackwardBytes = 3 * sizeof(float);    // dinp, inp and dout
}  // namespace

int64_t bf16_swiglu_backward_scratch_bytes(size_t n) { return bf16_math::block_bytes(n, kSwigluBackwardBytes); }
int64_t bf16_gelu_backward_scratch_bytes(size_t n) { return bf16_math::block_bytes(n, kGeluBackwardBytes); }

template <>
void swiglu_backward<bf16>(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up, size_t n,
                           InputGrad mode) {
  const bool set = mode == InputGrad::set;  // then the fp32 op does not read the gradients' old values
  in_blocks(n, kSwigluBackwardBytes, [&](size_t first, size_t count) {
    const Fp32 dg = set ? Fp32(count) : Fp32(dgate + first, count), du = set ? Fp32(count) : Fp32(dup + first, count),
               d(dout + first, count), g(gate + first, count), u(up + first, count);
    swiglu_backward<float>(dg.get(), du.get(), d.get(), g.get(), u.get(), count, mode);
    dg.round_into(dgate + first);
    du.round_into(dup + first);
  });
}

template <>
void gelu_forward<bf16>(bf16* out, const bf16* inp, size_t n) {
  in_blocks(n, 2 * sizeof(float), [&](size_t first, size_t count) {
    const Fp32 x(inp + first, count), o(count);
    gelu_forward<float>(o.get(), x.get(), count);
    o.round_into(out + first);
  });
}

template <>
void gelu_backward<bf16>(bf16* dinp, const bf16* inp, const bf16* dout, size_t n) {
  in_blocks(n, kGeluBackwardBytes, [&](size_t first, size_t count) {
    const Fp32 dx(dinp + first, count), x(inp + first, count), d(dout + first, count);
    gelu_backward<float>(dx.get(), x.get(), d.get(), count);
    dx.round_into(dinp + first);
  });
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
// of the fp32 losses in row order, as the CUDA twin's. dlogits may alias logits. The rows go in blocks whose
// fp32 copy stays within kOpScratchBytes: all rows at once would take four bytes a logit.
namespace {
int64_t cross_entropy_block_rows(int64_t N, int V) {
  ZS_CHECK(V > 0, "cross_entropy: ", V, " logits a row");
  return std::clamp<int64_t>(int64_t(kOpScratchBytes / (size_t(V) * sizeof(float))), 1, std::max<int64_t>(N, 1));
}
}  // namespace

int64_t bf16_cross_entropy_scratch_bytes(int64_t N, int V) {
  return (cross_entropy_block_rows(N, V) * V + std::max<int64_t>(N, 1)) * int64_t(sizeof(float));
}

template <>
double cross_entropy_forward_backward<bf16>(bf16* dlogits, bf16* losses, const bf16* logits,
                                            const int32_t* targets, int N, int V, int ld, float dloss) {
  ZS_CHECK(ld >= V, "cross_entropy: row stride ", ld, " below the row length ", V);
  if (N == 0) return 0;
  const Fp32 loss(static_cast<size_t>(N));
  const int block = int(cross_entropy_block_rows(N, V));
  for (int first = 0; first < N; first += block) {
    const int rows = std::min(block, N - first);
    const Fp32 x(logits + size_t(first) * ld, rows, V, ld);  // the gradient overwrites it
    cross_entropy_forward_backward<float>(dlogits ? x.get() : nullptr, loss.get() + first, x.get(), targets + first,
                                          rows, V, V, dloss);
    if (dlogits) x.round_rows_into(dlogits + size_t(first) * ld, rows, V, ld);
  }
  double total = 0;
  for (int i = 0; i < N; ++i) total += double(loss.get()[i]);
  loss.round_into(losses);
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
