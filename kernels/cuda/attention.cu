// Causal multi-head self-attention as the CPU op computes it: per (batch, head) GEMMs on the strided q/k/v
// slices of qkv, each launch covering every batch element and head (gemm_grid; at shapes whose slices are
// not 16-byte aligned, a launch per batch element), and a causal softmax kernel in between.
// Simple and exact rather than fast: the T x T scores are materialised (all but the upper-right quarter,
// kernels/causal_blocks.h) and the rest of the upper triangle masked.
// Precision is that of PyTorch's math attention: scores and dP are GEMM outputs stored in T, each softmax
// works in fp32 registers and rounds once. Keeping scores and dP in fp32 scratch instead would add about
// a third to attention's memory traffic, which at T = 1024 already rivals the model's GEMM time.
#include <algorithm>
#include <cmath>

#include "kernels/causal_blocks.h"
#include "kernels/cuda/common.cuh"

namespace zshard::cuda {

namespace {

// One warp per score row: softmax over [0, t], zero for the masked future (t, T).
template <class T>
__global__ void causal_softmax_kernel(T* att, int rows, int Tn) {
  const int row = warp_row(), lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;
  const int t = row % Tn;
  T* a = att + size_t(row) * Tn;
  float mx = -INFINITY;
  for (int j = lane; j <= t; j += kWarpSize) mx = fmaxf(mx, to_f32(a[j]));
  mx = warp_max(mx);
  float sum = 0;
  for (int j = lane; j <= t; j += kWarpSize) sum += expf(to_f32(a[j]) - mx);
  const float inv = 1.f / warp_sum(sum);
  for (int j = lane; j < Tn; j += kWarpSize) a[j] = from_f32<T>(j <= t ? expf(to_f32(a[j]) - mx) * inv : 0.f);
}

// Softmax backward in place: dp <- p * (dp - sum(p * dp)); masked entries have p = 0 and come out 0.
template <class T>
__global__ void softmax_backward_kernel(T* dp, const T* att, int rows, int Tn) {
  const int row = warp_row(), lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;
  const int t = row % Tn;
  T* d = dp + size_t(row) * Tn;
  const T* p = att + size_t(row) * Tn;
  float dot = 0;
  for (int j = lane; j <= t; j += kWarpSize) dot += to_f32(p[j]) * to_f32(d[j]);
  dot = warp_sum(dot);
  for (int j = lane; j < Tn; j += kWarpSize)
    d[j] = from_f32<T>(j <= t ? to_f32(p[j]) * (to_f32(d[j]) - dot) : 0.f);
}

// The backward's score-gradient scratch is at most this large (or one batch element): big enough that
// each GEMM launch covers many batch elements, small beside the saved probabilities of a GPT-2 layer.
constexpr size_t kScoreScratchBudget = size_t(256) << 20;

// What the forward and the backward derive from (B, T, C, NH): the head size, and where each batch
// element's heads sit in qkv (rows of 3C) and in the output and its gradient (rows of C).
struct Geometry {
  int hs, C3;
  long long tt;  // elements of one head's score matrix
  float scale;   // 1/sqrt(hs)
  GridStrides qkv, out;
};

Geometry geometry(int Tn, int C, int NH) {
  ZS_CHECK(NH > 0 && C % NH == 0, "attention: C=", C, " is not a multiple of NH=", NH);
  const int hs = C / NH;
  return {hs, 3 * C, (long long)Tn * Tn, 1.f / std::sqrt(float(hs)), {hs, (long long)Tn * 3 * C},
          {hs, (long long)Tn * C}};
}

// cuBLAS behind the block plan's GEMM signature, on `stream`.
template <class T>
auto gemm_on(cudaStream_t stream) {
  return [stream](bool ta, bool tb, int M, int N, int K, float alpha, const T* A, int lda, GridStrides sa,
                  const T* B, int ldb, GridStrides sb, float beta, T* C, int ldc, GridStrides sc,
                  GemmGrid grid) {
    gemm_grid<T>(ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, grid, stream);
  };
}

}  // namespace

int attention_backward_chunk(int B, int Tn, int NH, size_t element_size) {
  return causal_blocks::batch_chunk(B, size_t(NH) * Tn * Tn * element_size, kScoreScratchBudget);
}

template <class T>
void attention_forward(T* out, T* att, const T* qkv, int B, int Tn, int C, int NH, cudaStream_t stream) {
  using causal_blocks::Rows;
  const Geometry g = geometry(Tn, C, NH);
  if (B == 0 || Tn == 0) return;
  const auto gemm = gemm_on<T>(stream);
  const GemmGrid grid{NH, B};
  const Rows<const T> q{qkv, g.C3, g.qkv}, k{qkv + C, g.C3, g.qkv}, v{qkv + 2 * C, g.C3, g.qkv};
  causal_blocks::masked_outer(gemm, att, Tn, q, k, g.hs, g.scale, grid);
  const int rows = B * NH * Tn;
  causal_softmax_kernel<<<row_blocks(rows), kBlockSize, 0, stream>>>(att, rows, Tn);
  ZS_CUDA_CHECK_LAUNCH();
  causal_blocks::lower_times(gemm, Rows<T>{out, C, g.out}, att, Tn, v, g.hs, 1.f, 0.f, grid);
}

// A pass per chunk of batch elements, because the score gradients need (chunk, NH, T, T) of scratch.
template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, int B, int Tn, int C, int NH,
                        cudaStream_t stream) {
  using causal_blocks::Rows;
  const Geometry g = geometry(Tn, C, NH);
  if (B == 0 || Tn == 0) return;
  const auto gemm = gemm_on<T>(stream);
  const int chunk = attention_backward_chunk(B, Tn, NH, sizeof(T));
  Buffer scratch = workspace(size_t(chunk) * NH * g.tt * sizeof(T), stream);
  T* ds = static_cast<T*>(scratch.data());
  for (int b0 = 0; b0 < B; b0 += chunk) {
    const GemmGrid grid{NH, std::min(chunk, B - b0)};
    const Rows<const T> q{qkv + b0 * g.qkv.batch, g.C3, g.qkv};
    const Rows<const T> k{q.data + C, g.C3, g.qkv}, v{q.data + 2 * C, g.C3, g.qkv};
    const Rows<T> dq{dqkv + b0 * g.qkv.batch, g.C3, g.qkv};
    const Rows<T> dk{dq.data + C, g.C3, g.qkv}, dv{dq.data + 2 * C, g.C3, g.qkv};
    const Rows<const T> d_o{dout + b0 * g.out.batch, C, g.out};
    const T* a = att + b0 * NH * g.tt;
    causal_blocks::masked_outer(gemm, ds, Tn, d_o, v, g.hs, 1.f, grid);               // dP = dO V^T
    causal_blocks::lower_transposed_times(gemm, dv, a, Tn, d_o, g.hs, 1.f, grid);       // dV += P^T dO
    const int rows = grid.count() * Tn;
    softmax_backward_kernel<<<row_blocks(rows), kBlockSize, 0, stream>>>(ds, a, rows, Tn);
    ZS_CUDA_CHECK_LAUNCH();
    // The 1/sqrt(hs) of the scores is folded into alpha.
    causal_blocks::lower_times(gemm, dq, ds, Tn, k, g.hs, g.scale, 1.f, grid);          // dQ += dS K
    causal_blocks::lower_transposed_times(gemm, dk, ds, Tn, q, g.hs, g.scale, grid);    // dK += dS^T Q
  }
}

#define ZS_INSTANTIATE(T)                                                                               \
  template void attention_forward<T>(T*, T*, const T*, int, int, int, int, cudaStream_t);               \
  template void attention_backward<T>(T*, const T*, const T*, const T*, int, int, int, int, cudaStream_t);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

}  // namespace zshard::cuda
