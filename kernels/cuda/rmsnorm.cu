// RMSNorm over the last dimension (Llama): LayerNorm without the centring and the bias, one warp per row.
// The saved rstd stays fp32 whatever T is.
#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/common.cuh"

namespace zshard::cuda {

namespace {

// One row, x to o, by the calling warp; lane 0 stores its rstd.
template <class T>
__device__ __forceinline__ void rmsnorm_row(T* o, float* rstd, const T* x, const T* weight, int C, float eps) {
  const int lane = threadIdx.x % kWarpSize;
  float sq = 0;
  for (int c = lane; c < C; c += kWarpSize) {
    const float v = to_f32(x[c]);
    sq += v * v;
  }
  const float rs = rsqrtf(warp_sum(sq) / C + eps);
  for (int c = lane; c < C; c += kWarpSize) o[c] = from_f32<T>(to_f32(x[c]) * rs * to_f32(weight[c]));
  if (lane == 0) *rstd = rs;
}

template <class T>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* inp, const T* weight, int N, int C,
                                       float eps) {
  const int row = warp_row();
  if (row >= N) return;
  rmsnorm_row(out + size_t(row) * C, rstd + row, inp + size_t(row) * C, weight, C, eps);
}

// As layernorm_residual_forward_kernel (layernorm.cu): the row's residual written, then normalised as stored.
template <class T>
__global__ void rmsnorm_residual_forward_kernel(T* residual, T* out, float* rstd, const T* a, const T* b,
                                                const T* weight, int N, int C, float eps) {
  const int row = warp_row(), lane = threadIdx.x % kWarpSize;
  if (row >= N) return;
  const size_t start = size_t(row) * C;
  for (int c = lane; c < C; c += kWarpSize)
    residual[start + c] = from_f32<T>(to_f32(a[start + c]) + to_f32(b[start + c]));
  rmsnorm_row(out + start, rstd + row, residual + start, weight, C, eps);
}

// dx = rstd * (g - xhat * mean(g * xhat)) with g = dout * weight and xhat = x * rstd; one warp per row.
template <class T>
__global__ void rmsnorm_dinp_kernel(T* dinp, const T* dout, const T* inp, const T* weight, const float* rstd,
                                    int N, int C) {
  const int row = warp_row(), lane = threadIdx.x % kWarpSize;
  if (row >= N) return;
  const T* x = inp + size_t(row) * C;
  const T* d = dout + size_t(row) * C;
  const float rs = rstd[row];
  float gx_sum = 0;
  for (int c = lane; c < C; c += kWarpSize) gx_sum += to_f32(d[c]) * to_f32(weight[c]) * to_f32(x[c]) * rs;
  const float gx_mean = warp_sum(gx_sum) / C;
  T* dx = dinp + size_t(row) * C;
  for (int c = lane; c < C; c += kWarpSize) {
    const float xhat = to_f32(x[c]) * rs;
    dx[c] = from_f32<T>(to_f32(dx[c]) + rs * (to_f32(d[c]) * to_f32(weight[c]) - xhat * gx_mean));
  }
}

// dweight is the column sum of dout * xhat.
template <class T>
struct WeightTerm {
  const T *dout, *inp;
  const float* rstd;
  int C;
  __device__ void operator()(int row, int c, float* acc) const {
    acc[0] += to_f32(dout[size_t(row) * C + c]) * to_f32(inp[size_t(row) * C + c]) * rstd[row];
  }
};

}  // namespace

template <class T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, int N, int C, float eps,
                     cudaStream_t stream) {
  if (N == 0) return;
  rmsnorm_forward_kernel<<<row_blocks(N), kBlockSize, 0, stream>>>(out, rstd, inp, weight, N, C, eps);
  ZS_CUDA_CHECK_LAUNCH();
}

template <class T>
void rmsnorm_residual_forward(T* residual, T* out, float* rstd, const T* a, const T* b, const T* weight, int N, int C,
                              float eps, cudaStream_t stream) {
  if (N == 0) return;
  rmsnorm_residual_forward_kernel<<<row_blocks(N), kBlockSize, 0, stream>>>(residual, out, rstd, a, b, weight, N, C,
                                                                            eps);
  ZS_CUDA_CHECK_LAUNCH();
}

template <class T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const float* rstd,
                      int N, int C, cudaStream_t stream) {
  if (N == 0) return;
  rmsnorm_dinp_kernel<<<row_blocks(N), kBlockSize, 0, stream>>>(dinp, dout, inp, weight, rstd, N, C);
  ZS_CUDA_CHECK_LAUNCH();
  if (!dweight) return;  // a frozen gain
  // Per-chunk partial sums added in a fixed order (column_sums.cuh): deterministic, unlike atomics.
  accumulate_column_sums<1>(ColumnOutputs<1, T>{{dweight}}, N, C, WeightTerm<T>{dout, inp, rstd, C}, stream);
}

#define ZS_INSTANTIATE(T)                                                                                  \
  template void rmsnorm_forward<T>(T*, float*, const T*, const T*, int, int, float, cudaStream_t);         \
  template void rmsnorm_residual_forward<T>(T*, T*, float*, const T*, const T*, const T*, int, int, float,    \
                                            cudaStream_t);                                                 \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const float*, int, int,          \
                                    cudaStream_t);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

}  // namespace zshard::cuda
