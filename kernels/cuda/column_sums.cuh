// Column sums of an (N, C) row-major matrix, accumulated into K output vectors: the bias gradient
// (K = 1) and the LayerNorm weight and bias gradients (K = 2). C is 768 to 3072 in GPT-2 while N = B*T is
// tens of thousands, so one block per 32 columns would put 24 blocks on a 132-SM GPU; the rows are cut into
// chunks too, each block writes its fp32 partial sums, and a second kernel adds the chunks in a fixed order
// (deterministic, unlike atomics).
#pragma once
#include "kernels/cuda/common.cuh"

namespace zshard::cuda {

// The K output vectors, passed by value to the kernel; a null one (a frozen parameter's gradient) is skipped.
template <int K, class T>
struct ColumnOutputs {
  T* ptr[K];
};

namespace column_sums_detail {

constexpr int kRowSplit = kBlockSize / kWarpSize;  // warps of a block split its chunk's rows
constexpr int kChunkRows = 256;                    // rows per block: 32 per warp, enough to hide latency

// partials[(k * chunks + chunk) * C + c] = sum over the chunk's rows of term(row, c)[k].
template <int K, class Term>
__global__ void partials_kernel(float* partials, int N, int C, Term term) {
  __shared__ float shared[K][kRowSplit][kWarpSize];
  const int lane = threadIdx.x % kWarpSize, part = threadIdx.x / kWarpSize;
  const int c = blockIdx.x * kWarpSize + lane;
  const int row_end = min(N, int(blockIdx.y + 1) * kChunkRows);
  float acc[K] = {};
  if (c < C)
    for (int row = blockIdx.y * kChunkRows + part; row < row_end; row += kRowSplit) term(row, c, acc);
  for (int k = 0; k < K; ++k) shared[k][part][lane] = acc[k];
  __syncthreads();
  if (part != 0 || c >= C) return;
  for (int k = 0; k < K; ++k) {
    float sum = acc[k];
    for (int p = 1; p < kRowSplit; ++p) sum += shared[k][p][lane];
    partials[(size_t(k) * gridDim.y + blockIdx.y) * C + c] = sum;
  }
}

// out[k][c] += sum over chunks of partials, chunk 0 first.
template <int K, class T>
__global__ void finish_kernel(ColumnOutputs<K, T> out, const float* partials, int chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int k = 0; k < K; ++k) {
    if (!out.ptr[k]) continue;
    float sum = 0;
    for (int chunk = 0; chunk < chunks; ++chunk) sum += partials[(size_t(k) * chunks + chunk) * C + c];
    out.ptr[k][c] = from_f32<T>(to_f32(out.ptr[k][c]) + sum);
  }
}

}  // namespace column_sums_detail

// The bias gradient's term: the column sums of dout itself.
template <class T>
struct BiasTerm {
  const T* dout;
  int OC;
  __device__ void operator()(int row, int c, float* acc) const { acc[0] += to_f32(dout[size_t(row) * OC + c]); }
};

// out[k][c] += sum over rows r < N of term(r, c, acc)[k], where `term` is a functor whose __device__
// operator() adds row r's K values for column c into acc. The partial sums live in a workspace buffer.
template <int K, class T, class Term>
void accumulate_column_sums(ColumnOutputs<K, T> out, int N, int C, Term term, cudaStream_t stream) {
  using namespace column_sums_detail;
  if (N == 0 || C == 0) return;
  const int chunks = (N + kChunkRows - 1) / kChunkRows;
  ZS_CHECK(chunks <= 65535, "column sums: ", N, " rows exceed the grid's ", 65535 * kChunkRows);
  Buffer partials = workspace(size_t(K) * chunks * C * sizeof(float), stream);
  auto* p = static_cast<float*>(partials.data());
  const dim3 grid(unsigned((C + kWarpSize - 1) / kWarpSize), unsigned(chunks));
  partials_kernel<K><<<grid, kBlockSize, 0, stream>>>(p, N, C, term);
  ZS_CUDA_CHECK_LAUNCH();
  finish_kernel<K, T><<<unsigned((C + kBlockSize - 1) / kBlockSize), kBlockSize, 0, stream>>>(out, p, chunks, C);
  ZS_CUDA_CHECK_LAUNCH();
}

}  // namespace zshard::cuda
