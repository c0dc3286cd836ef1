// Causal multi-head self-attention as the CPU op computes it: per (batch, head) GEMMs on the strided q/k/v
// slices of qkv, each launch covering every batch element and head (gemm_grid; at shapes whose slices are
// not 16-byte aligned, a launch per batch element), and a causal softmax kernel in between.
// Simple and exact rather than fast: the T x T scores are materialised (all but the upper-right quarter,
// kernels/causal_blocks.h) and the rest of the upper triangle masked.
// Precision is that of PyTorch's math attention: scores and dP are GEMM outputs stored in T, each softmax
// works in fp32 registers and rounds once. Keeping scores and dP in fp32 scratch instead would add about
// a third to attention's memory traffic, which at T = 1024 already rivals the model's GEMM time.
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
  return causal_blocks::attention_backward_chunk(B, Tn, NH, element_size);
}

template <class T>
void attention_forward(T* out, T* att, const T* qkv, int B, int Tn, int C, int NH, cudaStream_t stream) {
  const auto softmax = [stream](T* a, int rows, int len) {
    causal_softmax_kernel<<<row_blocks(rows), kBlockSize, 0, stream>>>(a, rows, len);
    ZS_CUDA_CHECK_LAUNCH();
  };
  causal_blocks::attention_forward(gemm_on<T>(stream), softmax, out, att, qkv, B, Tn, C, NH);
}

// A pass per chunk of batch elements, because the score gradients need (chunk, NH, T, T) of scratch.
template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, int B, int Tn, int C, int NH,
                        cudaStream_t stream) {
  causal_blocks::attention_shape(Tn, C, NH);  // checks the heads before any allocation
  if (B == 0 || Tn == 0) return;
  const int chunk = attention_backward_chunk(B, Tn, NH, sizeof(T));
  Buffer scratch = workspace(size_t(chunk) * NH * Tn * Tn * sizeof(T), stream);
  const auto softmax_backward = [stream](T* ds, const T* a, int rows, int len) {
    softmax_backward_kernel<<<row_blocks(rows), kBlockSize, 0, stream>>>(ds, a, rows, len);
    ZS_CUDA_CHECK_LAUNCH();
  };
  causal_blocks::attention_backward(gemm_on<T>(stream), softmax_backward, static_cast<T*>(scratch.data()), dqkv,
                                    dout, qkv, att, B, Tn, C, NH);
}

#define ZS_INSTANTIATE(T)                                                                               \
  template void attention_forward<T>(T*, T*, const T*, int, int, int, int, cudaStream_t);               \
  template void attention_backward<T>(T*, const T*, const T*, const T*, int, int, int, int, cudaStream_t);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

}  // namespace zshard::cuda
