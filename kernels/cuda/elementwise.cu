// Element-wise ops: GELU (tanh approximation, as kernels/cpu), the residual add, axpy, and the f32/bf16
// conversions of mixed precision.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gelu.cuh"

namespace zshard::cuda {

namespace {

// The GELU kernels, the largest element-wise ones (4C per token), go kN elements a load (common.cuh's
// Pack) over `packs` = n / kN.
template <class T, int kN>
__global__ void gelu_forward_kernel(T* out, const T* inp, size_t packs) {
  using P = Pack<T, kN>;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < packs; i += size_t(gridDim.x) * blockDim.x) {
    P x = reinterpret_cast<const P*>(inp)[i];
#pragma unroll
    for (int k = 0; k < kN; ++k) x.v[k] = from_f32<T>(gelu(to_f32(x.v[k])));
    reinterpret_cast<P*>(out)[i] = x;
  }
}

template <class T, int kN>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, size_t packs) {
  using P = Pack<T, kN>;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < packs; i += size_t(gridDim.x) * blockDim.x) {
    const P x = reinterpret_cast<const P*>(inp)[i], d = reinterpret_cast<const P*>(dout)[i];
    P acc = reinterpret_cast<P*>(dinp)[i];
#pragma unroll
    for (int k = 0; k < kN; ++k)
      acc.v[k] = from_f32<T>(to_f32(acc.v[k]) + gelu_grad(to_f32(x.v[k])) * to_f32(d.v[k]));
    reinterpret_cast<P*>(dinp)[i] = acc;
  }
}

template <class T>
__global__ void residual_forward_kernel(T* out, const T* a, const T* b, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = from_f32<T>(to_f32(a[i]) + to_f32(b[i]));
}

template <class T>
__global__ void residual_backward_kernel(T* da, T* db, const T* dout, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float d = to_f32(dout[i]);
    da[i] = from_f32<T>(to_f32(da[i]) + d);
    db[i] = from_f32<T>(to_f32(db[i]) + d);
  }
}

template <class T>
__global__ void axpy_kernel(T* y, const T* x, float alpha, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    y[i] = from_f32<T>(to_f32(y[i]) + alpha * to_f32(x[i]));
}

template <class Dst, class Src>
__global__ void convert_kernel(Dst* dst, const Src* src, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = from_f32<Dst>(to_f32(src[i]));
}

}  // namespace

template <class Dst, class Src>
void convert(Dst* dst, const Src* src, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  convert_kernel<<<grid_for(n), kBlockSize, 0, stream>>>(dst, src, n);
  ZS_CUDA_CHECK_LAUNCH();
}
template void convert<float, bf16>(float*, const bf16*, size_t, cudaStream_t);
template void convert<bf16, float>(bf16*, const float*, size_t, cudaStream_t);

template <class T>
void gelu_forward(T* out, const T* inp, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch_packed<T>(rows_packable<T>(n, {out, inp}), [&](auto kN) {
    gelu_forward_kernel<T, kN><<<grid_for(n / kN), kBlockSize, 0, stream>>>(out, inp, n / kN);
  });
  ZS_CUDA_CHECK_LAUNCH();
}

template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch_packed<T>(rows_packable<T>(n, {dinp, inp, dout}), [&](auto kN) {
    gelu_backward_kernel<T, kN><<<grid_for(n / kN), kBlockSize, 0, stream>>>(dinp, inp, dout, n / kN);
  });
  ZS_CUDA_CHECK_LAUNCH();
}

template <class T>
void residual_forward(T* out, const T* a, const T* b, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  residual_forward_kernel<<<grid_for(n), kBlockSize, 0, stream>>>(out, a, b, n);
  ZS_CUDA_CHECK_LAUNCH();
}

template <class T>
void residual_backward(T* da, T* db, const T* dout, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  residual_backward_kernel<<<grid_for(n), kBlockSize, 0, stream>>>(da, db, dout, n);
  ZS_CUDA_CHECK_LAUNCH();
}

template <class T>
void axpy(T* y, const T* x, float alpha, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  axpy_kernel<<<grid_for(n), kBlockSize, 0, stream>>>(y, x, alpha, n);
  ZS_CUDA_CHECK_LAUNCH();
}

#define ZS_INSTANTIATE(T)                                                                               \
  template void gelu_forward<T>(T*, const T*, size_t, cudaStream_t);                                    \
  template void gelu_backward<T>(T*, const T*, const T*, size_t, cudaStream_t);                         \
  template void residual_forward<T>(T*, const T*, const T*, size_t, cudaStream_t);                      \
  template void residual_backward<T>(T*, T*, const T*, size_t, cudaStream_t);                           \
  template void axpy<T>(T*, const T*, float, size_t, cudaStream_t);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

}  // namespace zshard::cuda
