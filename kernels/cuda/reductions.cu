// Reductions to a host double: the sum of squares for the global gradient norm and the loss sum, both with
// CUB's DeviceReduce, accumulating in double; temporary storage comes from the tracking allocator.
#include <cub/device/device_reduce.cuh>

#include "kernels/allocator.h"
#include "kernels/cuda/common.cuh"

namespace zshard::cuda {

namespace {

struct Square {
  __device__ double operator()(float x) const { return double(x) * double(x); }
  __device__ double operator()(bf16 x) const { return double(to_f32(x)) * double(to_f32(x)); }
};
struct Widen {
  __device__ double operator()(float x) const { return double(x); }
  __device__ double operator()(bf16 x) const { return double(to_f32(x)); }
};
struct Plus {
  __device__ double operator()(double a, double b) const { return a + b; }
};

template <class T, class Transform>
double transform_sum(const T* x, size_t n, Transform transform, cudaStream_t stream) {
  if (n == 0) return 0.0;
  size_t temp_bytes = 0;
  ZS_CUDA_CHECK(cub::DeviceReduce::TransformReduce(nullptr, temp_bytes, x, static_cast<double*>(nullptr), n,
                                                   Plus{}, transform, 0.0, stream));
  // The result sits at the front of the same allocation; the temporary storage follows, aligned.
  constexpr size_t kResultBytes = 256;
  Buffer buffer(kResultBytes + temp_bytes, Device::cuda, Category::workspace);
  auto* result = static_cast<double*>(buffer.data());
  ZS_CUDA_CHECK(cub::DeviceReduce::TransformReduce(static_cast<char*>(buffer.data()) + kResultBytes,
                                                   temp_bytes, x, result, n, Plus{}, transform, 0.0, stream));
  // Finish by polling first: a copy to pageable memory blocks in the driver, which must not happen while
  // the stream may still wait on a collective (see synchronize_stream).
  synchronize_stream(stream);
  double host = 0;
  ZS_CUDA_CHECK(cudaMemcpy(&host, result, sizeof(double), cudaMemcpyDeviceToHost));
  return host;
}

}  // namespace

template <class T>
double sum_squares(const T* x, size_t n, cudaStream_t stream) {
  return transform_sum(x, n, Square{}, stream);
}

template <class T>
double sum_as_double(const T* x, size_t n, cudaStream_t stream) {
  return transform_sum(x, n, Widen{}, stream);
}

template double sum_squares<float>(const float*, size_t, cudaStream_t);
template double sum_squares<bf16>(const bf16*, size_t, cudaStream_t);
template double sum_as_double<float>(const float*, size_t, cudaStream_t);
template double sum_as_double<bf16>(const bf16*, size_t, cudaStream_t);

}  // namespace zshard::cuda
