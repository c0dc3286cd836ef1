// bf16 causal attention as the CUDA twins compute it. Blocks (kernels/cuda/attention.cu): the same plan of
// GEMMs and softmax passes (kernels/causal_blocks.h), each GEMM a bf16 GEMM with fp32 accumulation, the
// scores, probabilities and score gradients stored in bf16 between them, and the softmax passes in fp32 on
// the stored values, each rounding once. Fused (cuDNN's SDPA, kernels/cuda/cudnn/): everything between the
// bf16 inputs and the bf16 outputs in fp32, the fp32 op on fp32 copies rounded once.
#include <algorithm>
#include <cmath>

#include "kernels/causal_blocks.h"
#include "kernels/cpu/bf16_math.h"
#include "kernels/cpu/ops.h"

namespace zshard::cpu {

using bf16_math::Fp32;
using bf16_math::in_blocks;

namespace {

// The block plan's GEMM over a grid of (batch element, head) matrices: one bf16 GEMM per matrix.
void grid_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const bf16* A, int lda, GridStrides sa,
               const bf16* B, int ldb, GridStrides sb, float beta, bf16* C, int ldc, GridStrides sc,
               GemmGrid grid) {
  for (int b = 0; b < grid.batches; ++b)
    for (int h = 0; h < grid.heads; ++h)
      gemm<bf16>(ta, tb, M, N, K, alpha, A + sa.offset(b, h), lda, B + sb.offset(b, h), ldb, beta,
                 C + sc.offset(b, h), ldc);
}

// Softmax over [0, t] of each (rows x Tn) score row, t = row % Tn; zero for the masked future.
void causal_softmax(bf16* att, int rows, int Tn) {
  for (int row = 0; row < rows; ++row) {
    bf16* a = att + size_t(row) * Tn;
    const int t = row % Tn;
    float mx = -INFINITY;
    for (int j = 0; j <= t; ++j) mx = std::max(mx, float(a[j]));
    float sum = 0;
    for (int j = 0; j <= t; ++j) sum += std::exp(float(a[j]) - mx);
    const float inv = 1.f / sum;
    for (int j = 0; j < Tn; ++j) a[j] = bf16(j <= t ? std::exp(float(a[j]) - mx) * inv : 0.f);
  }
}

// In place: dp <- p * (dp - sum(p * dp)); masked entries have p = 0 and come out 0.
void softmax_backward(bf16* dp, const bf16* att, int rows, int Tn) {
  for (int row = 0; row < rows; ++row) {
    bf16* d = dp + size_t(row) * Tn;
    const bf16* p = att + size_t(row) * Tn;
    const int t = row % Tn;
    float dot = 0;
    for (int j = 0; j <= t; ++j) dot += float(p[j]) * float(d[j]);
    for (int j = 0; j < Tn; ++j) d[j] = bf16(j <= t ? float(p[j]) * (float(d[j]) - dot) : 0.f);
  }
}

}  // namespace

template <>
void attention_forward<bf16>(bf16* out, bf16* att, const bf16* qkv, int B, int Tn, int C, int NH) {
  causal_blocks::attention_forward(grid_gemm, causal_softmax, out, att, qkv, B, Tn, C, NH);
}

// The score gradients beside the largest of a head's GEMMs, each block of causal_blocks.h's plan (GEMM
// tiles do not grow with the sizes everywhere: every shape is taken).
int64_t bf16_attention_backward_scratch_bytes(int B, int Tn, int C, int NH) {
  if (B == 0 || Tn == 0) return 0;
  const int hs = causal_blocks::attention_shape(Tn, C, NH).hs;
  int64_t gemm = 0;
  for (causal_blocks::Span s : causal_blocks::cuts(Tn))
    if (s.size() > 0)  // masked_outer's, lower_times's and lower_transposed_times's
      gemm = std::max({gemm, bf16_gemm_scratch_bytes(s.size(), s.end, hs), bf16_gemm_scratch_bytes(s.size(), hs, s.end),
                       bf16_gemm_scratch_bytes(s.size(), hs, Tn - s.begin)});
  return int64_t(causal_blocks::score_gradient_bytes(B, Tn, NH, sizeof(bf16))) + gemm;
}

template <>
void attention_backward<bf16>(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* att, int B, int Tn,
                              int C, int NH) {
  causal_blocks::attention_shape(Tn, C, NH);  // checks the heads before any allocation
  if (B == 0 || Tn == 0) return;
  Buffer scratch(causal_blocks::score_gradient_bytes(B, Tn, NH, sizeof(bf16)), Device::cpu, Category::workspace);
  causal_blocks::attention_backward(grid_gemm, softmax_backward, static_cast<bf16*>(scratch.data()), dqkv, dout,
                                    qkv, att, B, Tn, C, NH);
}

template <>
void fused_attention_forward<bf16>(bf16* out, float* lse, const bf16* qkv, int B, int Tn, int C, int NH) {
  const size_t row = size_t(Tn) * C, stats = size_t(NH) * Tn;  // a sequence's (T, C) and (heads, T)
  in_blocks(size_t(B), 4 * row * sizeof(float), [&](size_t first, size_t count) {
    const Fp32 qkv32(qkv + first * 3 * row, count * 3 * row), out32(count * row);
    fused_attention_forward<float>(out32.get(), lse + first * stats, qkv32.get(), int(count), Tn, C, NH);
    out32.round_into(out + first * row);
  });
}

namespace {
// A sequence's qkv (3 rows), dout, out and dqkv (3 rows), a row being its (T, C).
size_t fused_backward_bytes(int Tn, int C) { return 8 * size_t(Tn) * C * sizeof(float); }
}  // namespace

int64_t bf16_fused_attention_backward_scratch_bytes(int B, int Tn, int C) {
  return bf16_math::block_bytes(size_t(B), fused_backward_bytes(Tn, C));
}

template <>
void fused_attention_backward<bf16>(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out, const float* lse,
                                    int B, int Tn, int C, int NH) {
  const size_t row = size_t(Tn) * C, stats = size_t(NH) * Tn;  // as in the forward
  in_blocks(size_t(B), fused_backward_bytes(Tn, C), [&](size_t first, size_t count) {
    const Fp32 qkv32(qkv + first * 3 * row, count * 3 * row), dout32(dout + first * row, count * row),
        out32(out + first * row, count * row), dqkv32(count * 3 * row);
    fused_attention_backward<float>(dqkv32.get(), dout32.get(), qkv32.get(), out32.get(), lse + first * stats,
                                    int(count), Tn, C, NH);
    dqkv32.round_into(dqkv + first * 3 * row);
  });
}

}  // namespace zshard::cpu
