// bf16 causal attention as the CUDA twin computes it (kernels/cuda/attention.cu): the same block plan of
// GEMMs (kernels/causal_blocks.h), each a bf16 GEMM with fp32 accumulation, the scores, probabilities and
// score gradients stored in bf16 between them, and the softmax passes in fp32 on the stored values, each
// rounding once.
#include <algorithm>
#include <cmath>

#include <zshard/error.h>

#include "kernels/causal_blocks.h"
#include "kernels/cpu/bf16_math.h"
#include "kernels/cpu/ops.h"

namespace zshard::cpu {

namespace {

// The score-gradient scratch of one backward pass is bounded as on a GPU: the same plan, pass for pass.
constexpr size_t kScoreScratchBudget = size_t(256) << 20;

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

struct Geometry {
  int hs, C3;
  size_t tt;     // elements of one head's score matrix
  float scale;   // 1/sqrt(hs)
  GridStrides qkv, out;
};

Geometry geometry(int Tn, int C, int NH) {
  ZS_CHECK(NH > 0 && C % NH == 0, "attention: C=", C, " is not a multiple of NH=", NH);
  const int hs = C / NH;
  return {hs, 3 * C, size_t(Tn) * Tn, 1.f / std::sqrt(float(hs)), {hs, (long long)Tn * 3 * C},
          {hs, (long long)Tn * C}};
}

}  // namespace

template <>
void attention_forward<bf16>(bf16* out, bf16* att, const bf16* qkv, int B, int Tn, int C, int NH) {
  using causal_blocks::Rows;
  const Geometry g = geometry(Tn, C, NH);
  if (B == 0 || Tn == 0) return;
  const GemmGrid grid{NH, B};
  const Rows<const bf16> q{qkv, g.C3, g.qkv}, k{qkv + C, g.C3, g.qkv}, v{qkv + 2 * C, g.C3, g.qkv};
  causal_blocks::masked_outer(grid_gemm, att, Tn, q, k, g.hs, g.scale, grid);
  causal_softmax(att, B * NH * Tn, Tn);
  causal_blocks::lower_times(grid_gemm, Rows<bf16>{out, C, g.out}, att, Tn, v, g.hs, 1.f, 0.f, grid);
}

template <>
void attention_backward<bf16>(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* att, int B, int Tn,
                              int C, int NH) {
  using causal_blocks::Rows;
  const Geometry g = geometry(Tn, C, NH);
  if (B == 0 || Tn == 0) return;
  const int chunk = causal_blocks::batch_chunk(B, size_t(NH) * g.tt * sizeof(bf16), kScoreScratchBudget);
  Buffer scratch(size_t(chunk) * NH * g.tt * sizeof(bf16), Device::cpu, Category::workspace);
  bf16* ds = static_cast<bf16*>(scratch.data());
  for (int b0 = 0; b0 < B; b0 += chunk) {
    const GemmGrid grid{NH, std::min(chunk, B - b0)};
    const Rows<const bf16> q{qkv + b0 * g.qkv.batch, g.C3, g.qkv};
    const Rows<const bf16> k{q.data + C, g.C3, g.qkv}, v{q.data + 2 * C, g.C3, g.qkv};
    const Rows<bf16> dq{dqkv + b0 * g.qkv.batch, g.C3, g.qkv};
    const Rows<bf16> dk{dq.data + C, g.C3, g.qkv}, dv{dq.data + 2 * C, g.C3, g.qkv};
    const Rows<const bf16> d_o{dout + b0 * g.out.batch, C, g.out};
    const bf16* a = att + size_t(b0) * NH * g.tt;
    causal_blocks::masked_outer(grid_gemm, ds, Tn, d_o, v, g.hs, 1.f, grid);              // dP = dO V^T
    causal_blocks::lower_transposed_times(grid_gemm, dv, a, Tn, d_o, g.hs, 1.f, grid);      // dV += P^T dO
    softmax_backward(ds, a, grid.count() * Tn, Tn);
    // The 1/sqrt(hs) of the scores is folded into alpha.
    causal_blocks::lower_times(grid_gemm, dq, ds, Tn, k, g.hs, g.scale, 1.f, grid);         // dQ += dS K
    causal_blocks::lower_transposed_times(grid_gemm, dk, ds, Tn, q, g.hs, g.scale, grid);   // dK += dS^T Q
  }
}

}  // namespace zshard::cpu
