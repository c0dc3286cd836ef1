// Causal multi-head self-attention as the CPU op computes it: per (batch, head) GEMMs on the strided q/k/v
// slices of qkv, batched over the heads with cublasGemmStridedBatchedEx (the head stride is uniform, the
// batch stride is not, so batch elements are a host loop), and a causal softmax kernel in between.
// Simple and exact rather than fast: the T x T scores are materialised (all but the upper-right quarter,
// kernels/causal_blocks.h) and the rest of the upper triangle masked.
// Precision is that of PyTorch's math attention: scores and dP are GEMM outputs stored in T, each softmax
// works in fp32 registers and rounds once. Keeping scores and dP in fp32 scratch instead would add about
// a third to attention's memory traffic, which at T = 1024 already rivals the model's GEMM time.
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

// What the forward and the backward derive from (T, C, NH).
struct Geometry {
  int hs, C3;
  long long tt;  // elements of one head's score matrix
  float scale;   // 1/sqrt(hs)
};

Geometry geometry(int Tn, int C, int NH) {
  ZS_CHECK(NH > 0 && C % NH == 0, "attention: C=", C, " is not a multiple of NH=", NH);
  const int hs = C / NH;
  return {hs, 3 * C, (long long)Tn * Tn, 1.f / std::sqrt(float(hs))};
}

// cuBLAS behind the block plan's GEMM signature, on `stream`.
template <class T>
auto gemm_on(cudaStream_t stream) {
  return [stream](bool ta, bool tb, int M, int N, int K, float alpha, const T* A, int lda, long long sa,
                  const T* B, int ldb, long long sb, float beta, T* C, int ldc, long long sc, int batch) {
    gemm_batched<T>(ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch, stream);
  };
}

}  // namespace

template <class T>
void attention_forward(T* out, T* att, const T* qkv, int B, int Tn, int C, int NH, cudaStream_t stream) {
  using causal_blocks::Rows;
  const auto [hs, C3, tt, scale] = geometry(Tn, C, NH);
  if (B == 0 || Tn == 0) return;
  const auto gemm = gemm_on<T>(stream);
  for (int b = 0; b < B; ++b) {
    const T* q = qkv + size_t(b) * Tn * C3;
    causal_blocks::masked_outer(gemm, att + size_t(b) * NH * tt, Tn, Rows<const T>{q, C3, hs},
                                Rows<const T>{q + C, C3, hs}, hs, scale, NH);
  }
  const int rows = B * NH * Tn;
  causal_softmax_kernel<<<row_blocks(rows), kBlockSize, 0, stream>>>(
      att, rows, Tn);
  ZS_CUDA_CHECK_LAUNCH();
  for (int b = 0; b < B; ++b) {
    const T* v = qkv + size_t(b) * Tn * C3 + 2 * C;
    causal_blocks::lower_times(gemm, Rows<T>{out + size_t(b) * Tn * C, C, hs}, att + size_t(b) * NH * tt, Tn,
                               Rows<const T>{v, C3, hs}, hs, 1.f, 0.f, NH);
  }
}

template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, int B, int Tn, int C, int NH,
                        cudaStream_t stream) {
  using causal_blocks::Rows;
  const auto [hs, C3, tt, scale] = geometry(Tn, C, NH);
  if (B == 0 || Tn == 0) return;
  const auto gemm = gemm_on<T>(stream);
  // Score gradients of one batch element (all heads).
  Buffer scratch = workspace(size_t(NH) * tt * sizeof(T), stream);
  T* ds = static_cast<T*>(scratch.data());
  const int rows = NH * Tn;
  for (int b = 0; b < B; ++b) {
    const Rows<const T> q{qkv + size_t(b) * Tn * C3, C3, hs};
    const Rows<const T> k{q.data + C, C3, hs}, v{q.data + 2 * C, C3, hs};
    const Rows<T> dq{dqkv + size_t(b) * Tn * C3, C3, hs};
    const Rows<T> dk{dq.data + C, C3, hs}, dv{dq.data + 2 * C, C3, hs};
    const Rows<const T> d_o{dout + size_t(b) * Tn * C, C, hs};
    const T* a = att + size_t(b) * NH * tt;
    causal_blocks::masked_outer(gemm, ds, Tn, d_o, v, hs, 1.f, NH);                 // dP = dO V^T
    causal_blocks::lower_transposed_times(gemm, dv, a, Tn, d_o, hs, 1.f, NH);         // dV += P^T dO
    softmax_backward_kernel<<<row_blocks(rows), kBlockSize, 0, stream>>>(
        ds, a, rows, Tn);
    ZS_CUDA_CHECK_LAUNCH();
    // The 1/sqrt(hs) of the scores is folded into alpha.
    causal_blocks::lower_times(gemm, dq, ds, Tn, k, hs, scale, 1.f, NH);              // dQ += dS K
    causal_blocks::lower_transposed_times(gemm, dk, ds, Tn, q, hs, scale, NH);        // dK += dS^T Q
  }
}

#define ZS_INSTANTIATE(T)                                                                               \
  template void attention_forward<T>(T*, T*, const T*, int, int, int, int, cudaStream_t);               \
  template void attention_backward<T>(T*, const T*, const T*, const T*, int, int, int, int, cudaStream_t);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

}  // namespace zshard::cuda
