// Fused softmax cross-entropy, forward and backward, one block per row of logits.
#include "kernels/cuda/common.cuh"

namespace zshard::cuda {

namespace {

constexpr int kRowThreads = 512;

// A target outside [0, V) yields a NaN loss (a device cannot throw); the data loaders validate tokens.
// Each row's loss also goes to row_loss in fp32, which the returned sum reads: summing the bf16 copies
// would round every token's loss before the sum.
template <class T>
__global__ void __launch_bounds__(kRowThreads) cross_entropy_kernel(T* dlogits, T* losses, float* row_loss, const T* logits,
                                     const int32_t* targets, int V, int ld, float dloss) {
  __shared__ float scratch[kWarpSize];
  const size_t row = blockIdx.x;
  const T* x = logits + row * ld;
  const int target = targets[row];
  const bool valid = target >= 0 && target < V;
  // Read before any thread overwrites the row (dlogits may alias logits); the reductions below sync.
  const float x_target = threadIdx.x == 0 && valid ? to_f32(x[target]) : 0.f;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, to_f32(x[j]));
  mx = block_reduce<true>(mx, scratch);
  float sum = 0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) sum += expf(to_f32(x[j]) - mx);
  sum = block_reduce<false>(sum, scratch);
  if (dlogits) {
    T* d = dlogits + row * ld;
    const float factor = dloss / sum;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
      d[j] = from_f32<T>(expf(to_f32(x[j]) - mx) * factor - (j == target ? dloss : 0.f));
  }
  if (threadIdx.x == 0) {
    const float loss = valid ? logf(sum) + mx - x_target : NAN;
    losses[row] = from_f32<T>(loss);
    row_loss[row] = loss;
  }
}

}  // namespace

template <class T>
double cross_entropy_forward_backward(T* dlogits, T* losses, const T* logits, const int32_t* targets, int N,
                                      int V, int ld, float dloss, double* loss_sum, cudaStream_t stream) {
  ZS_CHECK(ld >= V, "cross_entropy: row stride ", ld, " below the row length ", V);
  if (N == 0) return 0.0;
  Buffer row_loss = workspace(size_t(N) * sizeof(float), stream);
  auto* row_loss_f32 = static_cast<float*>(row_loss.data());
  cross_entropy_kernel<<<unsigned(N), kRowThreads, 0, stream>>>(dlogits, losses, row_loss_f32, logits, targets,
                                                               V, ld, dloss);
  ZS_CUDA_CHECK_LAUNCH();
  if (!loss_sum) return sum_as_double(row_loss_f32, size_t(N), stream);
  add_sum_as_double(row_loss_f32, size_t(N), loss_sum, stream);
  return 0.0;
}

#define ZS_INSTANTIATE(T)                                                                               \
  template double cross_entropy_forward_backward<T>(T*, T*, const T*, const int32_t*, int, int, int,    \
                                                    float, double*, cudaStream_t);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

}  // namespace zshard::cuda
