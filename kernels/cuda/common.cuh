// Helpers shared by the kernel files (not part of the public API): fp32 load/store for float and bf16,
// warp and block reductions, launch sizes, and the row-major GEMM every matrix op goes through.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include <zshard/error.h>

#include "kernels/allocator.h"
#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/gemm_grid.h"

namespace zshard::cuda {

constexpr int kWarpSize = 32;
constexpr int kBlockSize = 256;  // default for element-wise kernels

inline unsigned grid_for(size_t n, int block = kBlockSize) {
  const size_t blocks = (n + block - 1) / block;
  // Grid-stride loops cover the rest; 65535 * 4 blocks is plenty to fill any current GPU.
  return unsigned(blocks < 65535u * 4 ? (blocks > 0 ? blocks : 1) : 65535u * 4);
}

// Row-wise kernels run a warp per row, kRowsPerBlock rows to a kBlockSize block: the grid for `rows`, and
// the row (and lane) of the calling thread.
constexpr int kRowsPerBlock = kBlockSize / kWarpSize;
inline unsigned row_blocks(int rows) { return unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock); }
__device__ __forceinline__ int warp_row() { return blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize; }

// Arithmetic is fp32 whatever T is: bf16 values are widened on load and rounded once on store.
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

// kN consecutive elements loaded or stored as one access. Row kernels take kN = kPack16<T> (16 bytes, the
// widest load) where every row starts 16-byte aligned (rows_packable), else kN = 1: one template, and a
// warp moves 512 bytes a load rather than 64.
template <class T, int kN>
struct alignas(sizeof(T) * kN) Pack {
  T v[kN];
};
template <class T>
constexpr int kPack16 = int(16 / sizeof(T));
// True when rows of `row_elements` keep every base pointer's 16-byte alignment.
template <class T>
inline bool rows_packable(size_t row_elements, std::initializer_list<const void*> bases) {
  if (row_elements % kPack16<T>) return false;
  for (const void* p : bases)
    if (reinterpret_cast<uintptr_t>(p) % 16) return false;
  return true;
}
// Calls launch(kN), kN a std::integral_constant usable as the kernel's template argument: kPack16<T> when
// `packed` (rows_packable), else 1. One launch expression serves both instantiations.
template <class T, class Launch>
inline void launch_packed(bool packed, Launch&& launch) {
  if (packed)
    launch(std::integral_constant<int, kPack16<T>>{});
  else
    launch(std::integral_constant<int, 1>{});
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int o = kWarpSize / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
  for (int o = kWarpSize / 2; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// Block-wide reduction for blockDim.x a multiple of 32 (<= 1024); every thread gets the result.
// `scratch` holds 32 floats; the leading sync lets callers reuse it back to back.
template <bool kMax>
__device__ float block_reduce(float x, float* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  x = kMax ? warp_max(x) : warp_sum(x);
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  float r = lane < warps ? scratch[lane] : (kMax ? -INFINITY : 0.f);
  return kMax ? warp_max(r) : warp_sum(r);
}

// Row-major C = alpha op(A) op(B) + beta C for each matrix of `grid`, matrix (b, h) of each operand at its
// strides' offset (linear.cu).
template <class T>
void gemm_grid(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const T* A, int lda,
               GridStrides sa, const T* B, int ldb, GridStrides sb, float beta, T* C, int ldc, GridStrides sc,
               GemmGrid grid, cudaStream_t stream);

// Sum of x[i] in double (reductions.cu); synchronises `stream`. add_sum_as_double adds the same sum to the
// device double *into, on the stream, without waiting.
double sum_as_double(const float* x, size_t n, cudaStream_t stream);
void add_sum_as_double(const float* x, size_t n, double* into, cudaStream_t stream);

}  // namespace zshard::cuda
