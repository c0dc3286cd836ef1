// Block quantization on the device, in two passes so that no payload byte has two writers: a 4-bit byte
// may hold the last element of one block and the first of the next when the block size is odd.
#include "kernels/cuda/common.cuh"
#include "kernels/quantize_blocks.h"

namespace zshard::cuda {

namespace {

// A warp per block: the lanes' absmaxes, combined with NaN winning (quant::nan_max is exact, so the order
// of the combination cannot change the result), then the one division lane 0 stores.
template <class T>
__global__ void block_scales_kernel(float* scales, const T* x, size_t n, QuantFormat f, size_t blocks) {
  const int lane = threadIdx.x % kWarpSize;
  const size_t warps = size_t(gridDim.x) * blockDim.x / kWarpSize;
  for (size_t b = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) / kWarpSize; b < blocks; b += warps) {
    const size_t begin = b * f.block, end = min(n, begin + f.block);
    float absmax = 0.f;
    for (size_t i = begin + lane; i < end; i += kWarpSize) absmax = quant::nan_max(absmax, fabsf(to_f32(x[i])));
    for (int o = kWarpSize / 2; o > 0; o /= 2)
      absmax = quant::nan_max(absmax, __shfl_xor_sync(0xffffffffu, absmax, o));
    if (lane == 0) scales[b] = quant::block_scale(absmax, f.bits);
  }
}

template <class T>
__global__ void quantize_kernel(int8_t* q, const float* scales, const T* x, size_t n, QuantFormat f) {
  const auto value = [&](size_t i) { return quant::quantize_value(to_f32(x[i]), scales[i / f.block], f.bits); };
  const size_t bytes = quant::payload_bytes(n, f.bits);
  for (size_t j = blockIdx.x * size_t(blockDim.x) + threadIdx.x; j < bytes; j += size_t(gridDim.x) * blockDim.x)
    q[j] = quant::payload_byte(j, n, f.bits, value);
}

template <class T>
__global__ void dequantize_kernel(T* out, const int8_t* q, const float* scales, size_t n, QuantFormat f,
                                  bool accumulate) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = quant::dequantize_value(q, scales, i, f);
    out[i] = from_f32<T>(accumulate ? quant::add_rn(to_f32(out[i]), v) : v);
  }
}

}  // namespace

template <class T>
void quantize_blocks(int8_t* q, float* scales, const T* x, size_t n, QuantFormat f, cudaStream_t stream) {
  if (n == 0) return;
  const size_t blocks = (n + f.block - 1) / f.block;
  block_scales_kernel<<<grid_for(blocks * kWarpSize), kBlockSize, 0, stream>>>(scales, x, n, f, blocks);
  ZS_CUDA_CHECK_LAUNCH();
  quantize_kernel<<<grid_for(quant::payload_bytes(n, f.bits)), kBlockSize, 0, stream>>>(q, scales, x, n, f);
  ZS_CUDA_CHECK_LAUNCH();
}

template <class T>
void dequantize_blocks(T* out, const int8_t* q, const float* scales, size_t n, QuantFormat f, bool accumulate,
                       cudaStream_t stream) {
  if (n == 0) return;
  dequantize_kernel<<<grid_for(n), kBlockSize, 0, stream>>>(out, q, scales, n, f, accumulate);
  ZS_CUDA_CHECK_LAUNCH();
}

#define ZS_INSTANTIATE(T)                                                                                     \
  template void quantize_blocks<T>(int8_t*, float*, const T*, size_t, QuantFormat, cudaStream_t);            \
  template void dequantize_blocks<T>(T*, const int8_t*, const float*, size_t, QuantFormat, bool, cudaStream_t);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

}  // namespace zshard::cuda
