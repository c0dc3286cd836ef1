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

// One warp per score row: softmax over [0, t], zero for the masked future (t, T). kN elements a load
// (common.cuh's Pack); `live` packs hold some j <= t.
template <class T, int kN>
__global__ void causal_softmax_kernel(T* att, int rows, int Tn) {
  using P = Pack<T, kN>;
  const int row = warp_row(), lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;
  const int t = row % Tn, live = t / kN + 1;
  P* a = reinterpret_cast<P*>(att + size_t(row) * Tn);
  float mx = -INFINITY;
  for (int i = lane; i < live; i += kWarpSize) {
    const P p = a[i];
#pragma unroll
    for (int k = 0; k < kN; ++k)
      if (i * kN + k <= t) mx = fmaxf(mx, to_f32(p.v[k]));
  }
  mx = warp_max(mx);
  float sum = 0;
  for (int i = lane; i < live; i += kWarpSize) {
    const P p = a[i];
#pragma unroll
    for (int k = 0; k < kN; ++k)
      if (i * kN + k <= t) sum += expf(to_f32(p.v[k]) - mx);
  }
  const float inv = 1.f / warp_sum(sum);
  for (int i = lane; i < Tn / kN; i += kWarpSize) {
    P p = i < live ? a[i] : P{};
#pragma unroll
    for (int k = 0; k < kN; ++k) p.v[k] = from_f32<T>(i * kN + k <= t ? expf(to_f32(p.v[k]) - mx) * inv : 0.f);
    a[i] = p;
  }
}

// Softmax backward in place: dp <- p * (dp - sum(p * dp)); masked entries have p = 0 and come out 0.
template <class T, int kN>
__global__ void softmax_backward_kernel(T* dp, const T* att, int rows, int Tn) {
  using P = Pack<T, kN>;
  const int row = warp_row(), lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;
  const int t = row % Tn, live = t / kN + 1;
  P* d = reinterpret_cast<P*>(dp + size_t(row) * Tn);
  const P* a = reinterpret_cast<const P*>(att + size_t(row) * Tn);
  float dot = 0;
  for (int i = lane; i < live; i += kWarpSize) {
    const P p = a[i], g = d[i];
#pragma unroll
    for (int k = 0; k < kN; ++k)
      if (i * kN + k <= t) dot += to_f32(p.v[k]) * to_f32(g.v[k]);
  }
  dot = warp_sum(dot);
  for (int i = lane; i < Tn / kN; i += kWarpSize) {
    P g{};
    if (i < live) {
      const P p = a[i];
      g = d[i];
#pragma unroll
      for (int k = 0; k < kN; ++k)
        g.v[k] = from_f32<T>(i * kN + k <= t ? to_f32(p.v[k]) * (to_f32(g.v[k]) - dot) : 0.f);
    }
    d[i] = g;
  }
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
    launch_packed<T>(rows_packable<T>(len, {a}), [&](auto kN) {
      causal_softmax_kernel<T, kN><<<row_blocks(rows), kBlockSize, 0, stream>>>(a, rows, len);
    });
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
  Buffer scratch = workspace(causal_blocks::score_gradient_bytes(B, Tn, NH, sizeof(T)), stream);
  const auto softmax_backward = [stream](T* ds, const T* a, int rows, int len) {
    launch_packed<T>(rows_packable<T>(len, {ds, a}), [&](auto kN) {
      softmax_backward_kernel<T, kN><<<row_blocks(rows), kBlockSize, 0, stream>>>(ds, a, rows, len);
    });
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
