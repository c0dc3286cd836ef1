// Fused softmax cross-entropy, forward and backward, one block per row of logits.
#include "kernels/cuda/common.cuh"

namespace zshard::cuda {

namespace {

constexpr int kRowThreads = 512;

// Calls f(j, x[j]) for every j in [0, V) of a row, this thread's share, 16 bytes a load (common.cuh's
// Pack) where the row starts aligned (the logits' padded rows do), the unaligned tail or row an element a load.
template <class T, class F>
__device__ void for_each_in_row(const T* x, int V, F&& f) {
  constexpr int kN = kPack16<T>;
  int packed_end = 0;
  if (reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    packed_end = V / kN * kN;
    for (int j = threadIdx.x * kN; j < packed_end; j += blockDim.x * kN) {
      const Pack<T, kN> p = *reinterpret_cast<const Pack<T, kN>*>(x + j);
#pragma unroll
      for (int k = 0; k < kN; ++k) f(j + k, to_f32(p.v[k]));
    }
  }
  for (int j = packed_end + threadIdx.x; j < V; j += blockDim.x) f(j, to_f32(x[j]));
}

// d[j] = f(j, x[j]) for every j in [0, V) of a row (d may be x), this thread's share, packed where both
// rows start aligned. Each element is written by the thread that read it.
template <class T, class F>
__device__ void map_row(T* d, const T* x, int V, F&& f) {
  constexpr int kN = kPack16<T>;
  int packed_end = 0;
  if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(d)) % 16 == 0) {
    packed_end = V / kN * kN;
    for (int j = threadIdx.x * kN; j < packed_end; j += blockDim.x * kN) {
      Pack<T, kN> p = *reinterpret_cast<const Pack<T, kN>*>(x + j);
#pragma unroll
      for (int k = 0; k < kN; ++k) p.v[k] = from_f32<T>(f(j + k, to_f32(p.v[k])));
      *reinterpret_cast<Pack<T, kN>*>(d + j) = p;
    }
  }
  for (int j = packed_end + threadIdx.x; j < V; j += blockDim.x) d[j] = from_f32<T>(f(j, to_f32(x[j])));
}

// A target outside [0, V) yields a NaN loss (a device cannot throw); the data loaders validate tokens.
// Each row's loss also goes to row_loss in fp32, which the returned sum reads: summing the bf16 copies
// would round every token's loss before the sum. The row's max and sum of exponentials come from one pass
// (the running max rescales the running sum), so the logits, the largest tensor of a step, are read twice
// rather than three times.
template <class T>
__global__ void __launch_bounds__(kRowThreads) cross_entropy_kernel(T* dlogits, T* losses, float* row_loss,
                                                                    const T* logits, const int32_t* targets,
                                                                    int V, int ld, float dloss) {
  __shared__ float scratch[kWarpSize];
  const size_t row = blockIdx.x;
  const T* x = logits + row * ld;
  const int target = targets[row];
  const bool valid = target >= 0 && target < V;
  // Read before any thread overwrites the row (dlogits may alias logits); the reductions below sync.
  const float x_target = threadIdx.x == 0 && valid ? to_f32(x[target]) : 0.f;
  float mx = -INFINITY, sum = 0;
  for_each_in_row(x, V, [&](int, float v) {
    if (v > mx) {
      sum = sum * expf(mx - v) + 1.f;
      mx = v;
    } else if (v != -INFINITY) {  // -inf adds nothing, and while mx is -inf too, exp(-inf + inf) is NaN
      sum += expf(v - mx);
    }
  });
  const float row_max = block_reduce<true>(mx, scratch);
  sum = block_reduce<false>(sum * expf(mx - row_max), scratch);  // a thread with no element adds 0
  if (dlogits) {
    const float factor = dloss / sum;
    map_row(dlogits + row * ld, x, V,
            [&](int j, float v) { return expf(v - row_max) * factor - (j == target ? dloss : 0.f); });
  }
  if (threadIdx.x == 0) {
    const float loss = valid ? logf(sum) + row_max - x_target : NAN;
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
