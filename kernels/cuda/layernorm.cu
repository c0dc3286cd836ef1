// LayerNorm over the last dimension (biased variance, eps = kLayerNormEps), one warp per row.
#include "kernels/cuda/common.cuh"

namespace zshard::cuda {

namespace {

constexpr int kRowsPerBlock = kBlockSize / kWarpSize;

template <class T>
__global__ void layernorm_forward_kernel(T* out, T* mean, T* rstd, const T* inp, const T* weight,
                                         const T* bias, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  if (row >= N) return;
  const T* x = inp + size_t(row) * C;
  float sum = 0;
  for (int c = lane; c < C; c += kWarpSize) sum += to_f32(x[c]);
  const float mu = warp_sum(sum) / C;
  // Two passes, as the CPU op: the variance of centred values does not cancel catastrophically.
  float sq = 0;
  for (int c = lane; c < C; c += kWarpSize) {
    const float d = to_f32(x[c]) - mu;
    sq += d * d;
  }
  const float rs = rsqrtf(warp_sum(sq) / C + float(cpu::kLayerNormEps));
  T* o = out + size_t(row) * C;
  for (int c = lane; c < C; c += kWarpSize)
    o[c] = from_f32<T>((to_f32(x[c]) - mu) * rs * to_f32(weight[c]) + to_f32(bias[c]));
  if (lane == 0) {
    mean[row] = from_f32<T>(mu);
    rstd[row] = from_f32<T>(rs);
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dout * weight; one warp per row.
template <class T>
__global__ void layernorm_dinp_kernel(T* dinp, const T* dout, const T* inp, const T* weight, const T* mean,
                                      const T* rstd, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  if (row >= N) return;
  const T* x = inp + size_t(row) * C;
  const T* d = dout + size_t(row) * C;
  const float mu = to_f32(mean[row]), rs = to_f32(rstd[row]);
  float g_sum = 0, gx_sum = 0;
  for (int c = lane; c < C; c += kWarpSize) {
    const float g = to_f32(d[c]) * to_f32(weight[c]);
    g_sum += g;
    gx_sum += g * (to_f32(x[c]) - mu) * rs;
  }
  const float g_mean = warp_sum(g_sum) / C, gx_mean = warp_sum(gx_sum) / C;
  T* dx = dinp + size_t(row) * C;
  for (int c = lane; c < C; c += kWarpSize) {
    const float g = to_f32(d[c]) * to_f32(weight[c]);
    dx[c] = from_f32<T>(to_f32(dx[c]) + rs * (g - g_mean - (to_f32(x[c]) - mu) * rs * gx_mean));
  }
}

// dweight and dbias are sums over rows: a block owns 32 columns, its 8 warps split the rows, and the
// partial sums meet in shared memory (a fixed order, so the result is deterministic).
constexpr int kColRowSplit = kBlockSize / kWarpSize;

template <class T>
__global__ void layernorm_dparams_kernel(T* dweight, T* dbias, const T* dout, const T* inp, const T* mean,
                                         const T* rstd, int N, int C) {
  __shared__ float sw[kColRowSplit][kWarpSize], sb[kColRowSplit][kWarpSize];
  const int lane = threadIdx.x % kWarpSize, part = threadIdx.x / kWarpSize;
  const int c = blockIdx.x * kWarpSize + lane;
  float w = 0, b = 0;
  if (c < C) {
    for (int row = part; row < N; row += kColRowSplit) {
      const size_t i = size_t(row) * C + c;
      const float d = to_f32(dout[i]);
      b += d;
      w += d * (to_f32(inp[i]) - to_f32(mean[row])) * to_f32(rstd[row]);
    }
  }
  sw[part][lane] = w;
  sb[part][lane] = b;
  __syncthreads();
  if (part != 0 || c >= C) return;
  for (int p = 1; p < kColRowSplit; ++p) {
    w += sw[p][lane];
    b += sb[p][lane];
  }
  dweight[c] = from_f32<T>(to_f32(dweight[c]) + w);
  dbias[c] = from_f32<T>(to_f32(dbias[c]) + b);
}

unsigned row_blocks(int N) { return unsigned((N + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int N, int C,
                       cudaStream_t stream) {
  if (N == 0) return;
  layernorm_forward_kernel<<<row_blocks(N), kBlockSize, 0, stream>>>(out, mean, rstd, inp, weight, bias, N,
                                                                     C);
  ZS_CUDA_CHECK_LAUNCH();
}

template <class T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const T* mean, const T* rstd, int N, int C, cudaStream_t stream) {
  if (N == 0) return;
  layernorm_dinp_kernel<<<row_blocks(N), kBlockSize, 0, stream>>>(dinp, dout, inp, weight, mean, rstd, N, C);
  ZS_CUDA_CHECK_LAUNCH();
  const unsigned col_blocks = unsigned((C + kWarpSize - 1) / kWarpSize);
  layernorm_dparams_kernel<<<col_blocks, kBlockSize, 0, stream>>>(dweight, dbias, dout, inp, mean, rstd, N,
                                                                   C);
  ZS_CUDA_CHECK_LAUNCH();
}

#define ZS_INSTANTIATE(T)                                                                               \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, cudaStream_t); \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, int, \
                                      int, cudaStream_t);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

}  // namespace zshard::cuda
