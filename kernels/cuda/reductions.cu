// Reductions to a host double: the sum of squares for the global gradient norm and the loss sum, both with
// CUB's DeviceReduce, accumulating in double; temporary storage comes from the tracking allocator.
#include <cub/device/device_reduce.cuh>

#include <algorithm>
#include <vector>

#include "kernels/cuda/common.cuh"

namespace zshard::cuda {

namespace {

struct Square {
  __device__ double operator()(float x) const { return double(x) * double(x); }
  __device__ double operator()(bf16 x) const { return double(to_f32(x)) * double(to_f32(x)); }
};
struct Widen {
  __device__ double operator()(float x) const { return double(x); }
};
struct Plus {
  __device__ double operator()(double a, double b) const { return a + b; }
};

// Queues one device reduction of transform(x) per part, each into its own double slot (an empty part's is
// 0), and returns finish(slots) while the slots' workspace is alive.
template <class T, class Transform, class Finish>
auto with_part_sums(std::span<const std::span<const T>> parts, Transform transform, cudaStream_t stream,
                    Finish&& finish) {
  const auto reduce = [&](void* temp, size_t& temp_bytes, std::span<const T> part, double* out) {
    ZS_CUDA_CHECK(cub::DeviceReduce::TransformReduce(temp, temp_bytes, part.data(), out, part.size(), Plus{},
                                                     transform, 0.0, stream));
  };
  size_t temp_bytes = 0;
  for (std::span<const T> part : parts) {
    size_t part_bytes = 0;
    if (!part.empty()) reduce(nullptr, part_bytes, part, nullptr);
    temp_bytes = std::max(temp_bytes, part_bytes);
  }
  // The slots sit at the front of one allocation; the temporary storage follows, 256-byte aligned.
  const size_t slot_bytes = (parts.size() * sizeof(double) + 255) / 256 * 256;
  Buffer buffer = workspace(slot_bytes + temp_bytes, stream);
  auto* slots = static_cast<double*>(buffer.data());
  void* temp = static_cast<char*>(buffer.data()) + slot_bytes;
  ZS_CUDA_CHECK(cudaMemsetAsync(slots, 0, parts.size() * sizeof(double), stream));  // empty parts stay 0
  for (size_t i = 0; i < parts.size(); ++i) {
    size_t bytes = temp_bytes;
    if (!parts[i].empty()) reduce(temp, bytes, parts[i], slots + i);
  }
  return finish(static_cast<const double*>(slots));
}

// The sum over every part of transform(x): the parts' reductions, then a single wait and a single copy of
// the slots, added on the host in part order.
template <class T, class Transform>
double transform_sum(std::span<const std::span<const T>> parts, Transform transform, cudaStream_t stream) {
  if (parts.empty()) return 0.0;
  return with_part_sums(parts, transform, stream, [&](const double* slots) {
    // Finish by polling first: a copy to pageable memory blocks in the driver, which must not happen while
    // the stream may still wait on a collective (see synchronize_stream).
    synchronize_stream(stream);
    std::vector<double> host(parts.size());
    ZS_CUDA_CHECK(cudaMemcpy(host.data(), slots, host.size() * sizeof(double), cudaMemcpyDeviceToHost));
    double sum = 0;
    for (double x : host) sum += x;
    return sum;
  });
}

}  // namespace

template <class T>
double sum_squares(std::span<const std::span<const T>> parts, cudaStream_t stream) {
  return transform_sum(parts, Square{}, stream);
}

double sum_as_double(const float* x, size_t n, cudaStream_t stream) {
  const std::span<const float> whole(x, n);
  return transform_sum(std::span(&whole, 1), Widen{}, stream);
}

namespace {
__global__ void add_kernel(double* into, const double* value) { *into += *value; }
}  // namespace

// The sum sum_as_double would return, added on the device: the same reduction, then one addition.
void add_sum_as_double(const float* x, size_t n, double* into, cudaStream_t stream) {
  const std::span<const float> whole(x, n);
  with_part_sums(std::span(&whole, 1), Widen{}, stream, [&](const double* slots) {
    add_kernel<<<1, 1, 0, stream>>>(into, slots);
    ZS_CUDA_CHECK_LAUNCH();
    return 0;
  });
}

template double sum_squares<float>(std::span<const std::span<const float>>, cudaStream_t);
template double sum_squares<bf16>(std::span<const std::span<const bf16>>, cudaStream_t);

}  // namespace zshard::cuda
