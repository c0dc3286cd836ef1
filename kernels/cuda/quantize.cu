// Block quantization on the device, in two passes so that no payload byte has two writers: a 4-bit byte
// may hold the last element of one block and the first of the next (a block of odd length, or a piece
// that starts at an odd element). Blocks come from the chunk's table, looked up as the CPU reference does.
#include "kernels/cuda/common.cuh"
#include "kernels/quantize_blocks.h"

namespace zshard::cuda {

namespace {

// A warp per block: the lanes' absmaxes, combined with NaN winning (quant::nan_max is exact, so the order
// of the combination cannot change the result), then the one division lane 0 stores.
template <class T>
__global__ void block_scales_kernel(float* scales, const T* x, QuantFormat f, BlockTable blocks) {
  const int lane = threadIdx.x % kWarpSize;
  const size_t warps = size_t(gridDim.x) * blockDim.x / kWarpSize;
  for (size_t b = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) / kWarpSize; b < blocks.blocks; b += warps) {
    const quant::ElementRange range = quant::block_elements(blocks, b);
    float absmax = 0.f;
    for (size_t i = range.begin + lane; i < range.end; i += kWarpSize)
      absmax = quant::nan_max(absmax, fabsf(to_f32(x[i])));
    for (int o = kWarpSize / 2; o > 0; o /= 2)
      absmax = quant::nan_max(absmax, __shfl_xor_sync(0xffffffffu, absmax, o));
    if (lane == 0) scales[b] = quant::block_scale(absmax, f.bits);
  }
}

// A thread per payload byte, each element's block found in the table.
template <class T>
__global__ void quantize_kernel(int8_t* q, const float* scales, const T* x, size_t n, QuantFormat f,
                                BlockTable blocks) {
  const auto value = [&](size_t i) {
    return quant::quantize_value(to_f32(x[i]), scales[quant::block_of(blocks, i)], f.bits);
  };
  const size_t bytes = quant::payload_bytes(n, f.bits);
  for (size_t j = blockIdx.x * size_t(blockDim.x) + threadIdx.x; j < bytes; j += size_t(gridDim.x) * blockDim.x)
    q[j] = quant::payload_byte(j, n, f.bits, value);
}

template <class T>
__global__ void dequantize_kernel(T* out, const int8_t* q, const float* scales, size_t n, QuantFormat f,
                                  BlockTable blocks, bool accumulate) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = quant::dequantize_value(q, scales[quant::block_of(blocks, i)], i, f.bits);
    out[i] = from_f32<T>(accumulate ? quant::add_rn(to_f32(out[i]), v) : v);
  }
}

}  // namespace

template <class T>
void quantize_blocks(int8_t* q, float* scales, const T* x, size_t n, QuantFormat f, BlockTable blocks,
                     cudaStream_t stream) {
  if (n == 0) return;
  block_scales_kernel<<<grid_for(blocks.blocks * kWarpSize), kBlockSize, 0, stream>>>(scales, x, f, blocks);
  ZS_CUDA_CHECK_LAUNCH();
  quantize_kernel<<<grid_for(quant::payload_bytes(n, f.bits)), kBlockSize, 0, stream>>>(q, scales, x, n, f, blocks);
  ZS_CUDA_CHECK_LAUNCH();
}

template <class T>
void dequantize_blocks(T* out, const int8_t* q, const float* scales, size_t n, QuantFormat f, BlockTable blocks,
                       bool accumulate, cudaStream_t stream) {
  if (n == 0) return;
  dequantize_kernel<<<grid_for(n), kBlockSize, 0, stream>>>(out, q, scales, n, f, blocks, accumulate);
  ZS_CUDA_CHECK_LAUNCH();
}

#define ZS_INSTANTIATE(T)                                                                                      \
  template void quantize_blocks<T>(int8_t*, float*, const T*, size_t, QuantFormat, BlockTable, cudaStream_t); \
  template void dequantize_blocks<T>(T*, const int8_t*, const float*, size_t, QuantFormat, BlockTable, bool,   \
                                     cudaStream_t);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

}  // namespace zshard::cuda
