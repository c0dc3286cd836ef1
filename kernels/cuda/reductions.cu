// Reductions in double: the loss sum with CUB's DeviceReduce, to a host double or added to a device one;
// the sum of squares for the global gradient norm, a unit's parameters in one launch, added to a device
// double; and the step's one-thread scalar ops (kernels/step_scalars.h). Temporary storage comes from the
// tracking allocator.
#include <cub/device/device_reduce.cuh>

#include <algorithm>
#include <vector>

#include "kernels/cuda/common.cuh"

namespace zshard::cuda {

namespace {

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

namespace {

// Up to kMaxParts parts, passed by value in the kernel's parameters: block b sums the squares of chunk
// b - first_chunk[p] of part p into partials[b]; the last block to finish adds the parts up.
constexpr int kMaxParts = 64;
constexpr size_t kSquaresChunk = size_t(kBlockSize) * 16;
template <class T>
struct SquareParts {
  const T* data[kMaxParts];
  size_t count[kMaxParts];
  unsigned first_chunk[kMaxParts + 1];
  int n;
};

// Warp 0's threads get the block's sum (the callers read thread 0's), added in a fixed order: the same
// bits on every run. `scratch` holds kWarpSize doubles; the leading sync lets callers reuse it back to back.
__device__ double block_sum(double x, double* scratch) {
  for (int o = kWarpSize / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  __syncthreads();
  if (threadIdx.x % kWarpSize == 0) scratch[threadIdx.x / kWarpSize] = x;
  __syncthreads();
  x = threadIdx.x < blockDim.x / kWarpSize ? scratch[threadIdx.x] : 0.0;
  for (int o = kWarpSize / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// One launch for the whole sum: every block writes its chunk's sum, and the last one to finish (the
// ticket counts them; threadFenceReduction in CUDA's samples) sums each part's chunks in chunk order and
// adds the parts to *sum in part order, so nothing waits for a second launch or for the host.
template <class T>
__global__ void sum_squares_kernel(SquareParts<T> parts, double* partials, unsigned* ticket, double* sum) {
  __shared__ double scratch[kWarpSize];
  __shared__ bool last;
  int p = 0;
  while (blockIdx.x >= parts.first_chunk[p + 1]) ++p;
  const size_t begin = size_t(blockIdx.x - parts.first_chunk[p]) * kSquaresChunk;
  const size_t end = parts.count[p] - begin < kSquaresChunk ? parts.count[p] : begin + kSquaresChunk;
  double acc = 0;
  for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double x = to_f32(parts.data[p][i]);
    acc += x * x;
  }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = acc;
    __threadfence();  // the partial is seen by every block before the ticket is
    last = atomicAdd(ticket, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  for (int q = 0; q < parts.n; ++q) {
    double part = 0;
    for (unsigned c = parts.first_chunk[q] + threadIdx.x; c < parts.first_chunk[q + 1]; c += blockDim.x)
      part += __ldcg(partials + c);  // from L2: other blocks wrote them
    part = block_sum(part, scratch);
    if (threadIdx.x == 0) *sum += part;
  }
}

__global__ void sum_in_order_kernel(double* sum, const double* values, size_t n, double first) {
  *sum = cpu::sum_in_order(values, n, first);
}

__global__ void clip_grad_norm_kernel(StepScalars* step) { cpu::clip_grad_norm(*step); }

}  // namespace

template <class T>
void sum_squares(double* sum, std::span<const std::span<const T>> parts, cudaStream_t stream) {
  for (size_t first = 0; first < parts.size(); first += kMaxParts) {
    SquareParts<T> batch{};
    batch.n = int(std::min(parts.size() - first, size_t(kMaxParts)));
    for (int k = 0; k < batch.n; ++k) {
      const std::span<const T> part = parts[first + size_t(k)];
      batch.data[k] = part.data();
      batch.count[k] = part.size();
      batch.first_chunk[k + 1] = batch.first_chunk[k] + unsigned((part.size() + kSquaresChunk - 1) / kSquaresChunk);
    }
    for (int k = batch.n; k < kMaxParts; ++k) batch.first_chunk[k + 1] = batch.first_chunk[batch.n];
    const unsigned blocks = batch.first_chunk[batch.n];
    if (blocks == 0) continue;  // empty parts add nothing
    // The partials, then the ticket, zeroed on the stream before the kernel takes one.
    Buffer buffer = workspace(blocks * sizeof(double) + sizeof(unsigned), stream);
    auto* partials = static_cast<double*>(buffer.data());
    auto* ticket = reinterpret_cast<unsigned*>(partials + blocks);
    ZS_CUDA_CHECK(cudaMemsetAsync(ticket, 0, sizeof(unsigned), stream));
    sum_squares_kernel<<<blocks, kBlockSize, 0, stream>>>(batch, partials, ticket, sum);
    ZS_CUDA_CHECK_LAUNCH();
  }
}

void sum_in_order(double* sum, const double* values, size_t n, double first, cudaStream_t stream) {
  sum_in_order_kernel<<<1, 1, 0, stream>>>(sum, values, n, first);
  ZS_CUDA_CHECK_LAUNCH();
}

void clip_grad_norm(StepScalars* step, cudaStream_t stream) {
  clip_grad_norm_kernel<<<1, 1, 0, stream>>>(step);
  ZS_CUDA_CHECK_LAUNCH();
}

template void sum_squares<float>(double*, std::span<const std::span<const float>>, cudaStream_t);
template void sum_squares<bf16>(double*, std::span<const std::span<const bf16>>, cudaStream_t);

}  // namespace zshard::cuda
