// Token + position embedding, forward and backward.
#include "kernels/cuda/common.cuh"

namespace zshard::cuda {

namespace {

template <class T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B,
                                         int Tn, int C) {
  const size_t n = size_t(B) * Tn * C;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t bt = i / C;
    const int c = int(i % C), t = int(bt % Tn);
    out[i] = from_f32<T>(to_f32(wte[size_t(tokens[bt]) * C + c]) + to_f32(wpe[size_t(t) * C + c]));
  }
}

// A token may appear many times in the batch, so rows of dwte are summed with atomics.
template <class T>
__global__ void wte_backward_kernel(T* dwte, const T* dout, const int32_t* tokens, int B, int Tn, int C) {
  const size_t n = size_t(B) * Tn * C;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t bt = i / C;
    atomicAdd(dwte + size_t(tokens[bt]) * C + i % C, dout[i]);
  }
}

// Positions do not collide: one thread per (t, c) sums over the batch, in a fixed order.
template <class T>
__global__ void wpe_backward_kernel(T* dwpe, const T* dout, int B, int Tn, int C) {
  const size_t n = size_t(Tn) * C;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float acc = to_f32(dwpe[i]);
    for (int b = 0; b < B; ++b) acc += to_f32(dout[size_t(b) * n + i]);
    dwpe[i] = from_f32<T>(acc);
  }
}

}  // namespace

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int Tn, int C,
                       cudaStream_t stream) {
  const size_t n = size_t(B) * Tn * C;
  if (n == 0) return;
  embedding_forward_kernel<<<grid_for(n), kBlockSize, 0, stream>>>(out, tokens, wte, wpe, B, Tn, C);
  ZS_CUDA_CHECK_LAUNCH();
}

template <class T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int Tn, int C,
                        cudaStream_t stream) {
  const size_t n = size_t(B) * Tn * C;
  if (n == 0) return;
  wte_backward_kernel<<<grid_for(n), kBlockSize, 0, stream>>>(dwte, dout, tokens, B, Tn, C);
  ZS_CUDA_CHECK_LAUNCH();
  wpe_backward_kernel<<<grid_for(size_t(Tn) * C), kBlockSize, 0, stream>>>(dwpe, dout, B, Tn, C);
  ZS_CUDA_CHECK_LAUNCH();
}

#define ZS_INSTANTIATE(T)                                                                               \
  template void embedding_forward<T>(T*, const int32_t*, const T*, const T*, int, int, int, cudaStream_t); \
  template void embedding_backward<T>(T*, T*, const T*, const int32_t*, int, int, int, cudaStream_t);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

}  // namespace zshard::cuda
