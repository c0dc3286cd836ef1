// LayerNorm over the last dimension (biased variance, eps = kLayerNormEps), one warp per row. The saved
// mean and rstd stay fp32 whatever T is.
#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/common.cuh"

namespace zshard::cuda {

namespace {

// One row, x to o, by the calling warp; lane 0 stores the row's statistics.
template <class T>
__device__ __forceinline__ void layernorm_row(T* o, float* mean, float* rstd, const T* x, const T* weight,
                                              const T* bias, int C) {
  const int lane = threadIdx.x % kWarpSize;
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
  for (int c = lane; c < C; c += kWarpSize)
    o[c] = from_f32<T>((to_f32(x[c]) - mu) * rs * to_f32(weight[c]) + to_f32(bias[c]));
  if (lane == 0) {
    *mean = mu;
    *rstd = rs;
  }
}

template <class T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                                         const T* bias, int N, int C) {
  const int row = warp_row();
  if (row >= N) return;
  layernorm_row(out + size_t(row) * C, mean + row, rstd + row, inp + size_t(row) * C, weight, bias, C);
}

// The row's residual is written, then normalised as stored (rounded to T): residual_forward's and
// layernorm_forward's bits, with the row read back from the cache rather than from memory. Each lane reads
// back only the elements it wrote (c = lane + 32 k in both loops): no synchronisation is needed.
template <class T>
__global__ void layernorm_residual_forward_kernel(T* residual, T* out, float* mean, float* rstd, const T* a,
                                                  const T* b, const T* weight, const T* bias, int N, int C) {
  const int row = warp_row(), lane = threadIdx.x % kWarpSize;
  if (row >= N) return;
  const size_t start = size_t(row) * C;
  for (int c = lane; c < C; c += kWarpSize)
    residual[start + c] = from_f32<T>(to_f32(a[start + c]) + to_f32(b[start + c]));
  layernorm_row(out + start, mean + row, rstd + row, residual + start, weight, bias, C);
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dout * weight; one warp per row, kN elements
// a load (common.cuh's Pack).
template <class T, int kN>
__global__ void layernorm_dinp_kernel(T* dinp, const T* dout, const T* inp, const T* weight, const float* mean,
                                      const float* rstd, int N, int C) {
  using P = Pack<T, kN>;
  const int row = warp_row(), lane = threadIdx.x % kWarpSize, packs = C / kN;
  if (row >= N) return;
  const P* x = reinterpret_cast<const P*>(inp + size_t(row) * C);
  const P* d = reinterpret_cast<const P*>(dout + size_t(row) * C);
  const P* w = reinterpret_cast<const P*>(weight);
  P* dx = reinterpret_cast<P*>(dinp + size_t(row) * C);
  const float mu = mean[row], rs = rstd[row];
  float g_sum = 0, gx_sum = 0;
  for (int i = lane; i < packs; i += kWarpSize) {
    const P dp = d[i], wp = w[i], xp = x[i];
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      const float g = to_f32(dp.v[k]) * to_f32(wp.v[k]);
      g_sum += g;
      gx_sum += g * (to_f32(xp.v[k]) - mu) * rs;
    }
  }
  const float g_mean = warp_sum(g_sum) / C, gx_mean = warp_sum(gx_sum) / C;
  for (int i = lane; i < packs; i += kWarpSize) {
    const P dp = d[i], wp = w[i], xp = x[i];
    P out = dx[i];
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      const float g = to_f32(dp.v[k]) * to_f32(wp.v[k]);
      out.v[k] = from_f32<T>(to_f32(out.v[k]) + rs * (g - g_mean - (to_f32(xp.v[k]) - mu) * rs * gx_mean));
    }
    dx[i] = out;
  }
}

// dweight and dbias are column sums of dout * xhat and of dout.
template <class T>
struct ParamsTerm {
  const T *dout, *inp;
  const float *mean, *rstd;
  int C;
  __device__ void operator()(int row, int c, float* acc) const {
    const float d = to_f32(dout[size_t(row) * C + c]);
    acc[0] += d * (to_f32(inp[size_t(row) * C + c]) - mean[row]) * rstd[row];
    acc[1] += d;
  }
};

}  // namespace

template <class T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int N,
                       int C, cudaStream_t stream) {
  if (N == 0) return;
  layernorm_forward_kernel<<<row_blocks(N), kBlockSize, 0, stream>>>(out, mean, rstd, inp, weight, bias, N,
                                                                     C);
  ZS_CUDA_CHECK_LAUNCH();
}

template <class T>
void layernorm_residual_forward(T* residual, T* out, float* mean, float* rstd, const T* a, const T* b,
                                const T* weight, const T* bias, int N, int C, cudaStream_t stream) {
  if (N == 0) return;
  layernorm_residual_forward_kernel<<<row_blocks(N), kBlockSize, 0, stream>>>(residual, out, mean, rstd, a, b,
                                                                              weight, bias, N, C);
  ZS_CUDA_CHECK_LAUNCH();
}

template <class T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const float* mean, const float* rstd, int N, int C, cudaStream_t stream) {
  if (N == 0) return;
  launch_packed<T>(rows_packable<T>(C, {dinp, dout, inp, weight}), [&](auto kN) {
    layernorm_dinp_kernel<T, kN><<<row_blocks(N), kBlockSize, 0, stream>>>(dinp, dout, inp, weight, mean, rstd, N, C);
  });
  ZS_CUDA_CHECK_LAUNCH();
  if (!dweight && !dbias) return;  // both frozen
  accumulate_column_sums<2>(ColumnOutputs<2, T>{{dweight, dbias}}, N, C,
                            ParamsTerm<T>{dout, inp, mean, rstd, C}, stream);
}

#define ZS_INSTANTIATE(T)                                                                               \
  template void layernorm_forward<T>(T*, float*, float*, const T*, const T*, const T*, int, int,         \
                                     cudaStream_t);                                                     \
  template void layernorm_residual_forward<T>(T*, T*, float*, float*, const T*, const T*, const T*, const T*, int, \
                                              int, cudaStream_t);                                               \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const float*, const float*, \
                                      int, int, cudaStream_t);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

}  // namespace zshard::cuda
