// GEMM through cuBLAS (fp32 accumulation; bf16 inputs run on tensor cores) and the Conv1D linear layer.
#include <cublas_v2.h>

#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/common.cuh"

namespace zshard::cuda {

namespace {

template <class T>
constexpr cudaDataType_t cuda_type() {
  return std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_16BF;
}

template <class T>
__global__ void add_bias_kernel(T* out, const T* bias, int N, int OC) {
  const size_t n = size_t(N) * OC;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = from_f32<T>(to_f32(out[i]) + to_f32(bias[i % OC]));
}

// The bias gradient's term of column sums: dout itself.
template <class T>
struct BiasTerm {
  const T* dout;
  int OC;
  __device__ void operator()(int row, int c, float* acc) const { acc[0] += to_f32(dout[size_t(row) * OC + c]); }
};

}  // namespace

// cuBLAS is column-major: the row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T, so the
// operands swap and each keeps its own transpose flag.
template <class T>
void gemm_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const T* A, int lda,
                  long long stride_a, const T* B, int ldb, long long stride_b, float beta, T* C, int ldc,
                  long long stride_c, int batch, cudaStream_t stream) {
  if (M == 0 || N == 0 || batch == 0) return;
  cublasHandle_t handle = cublas_handle();
  ZS_CUBLAS_CHECK(cublasSetStream(handle, stream));
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  constexpr cudaDataType_t type = cuda_type<T>();
  ZS_CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle, op_b, op_a, N, M, K, &alpha, B, type, ldb, stride_b, A,
                                             type, lda, stride_a, &beta, C, type, ldc, stride_c, batch,
                                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

template <class T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const T* A, int lda, const T* B,
          int ldb, float beta, T* C, int ldc, cudaStream_t stream) {
  gemm_batched<T>(trans_a, trans_b, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, stream);
}

template <class T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC,
                    cudaStream_t stream) {
  gemm_batched<T>(false, false, N, OC, C, 1.f, inp, C, 0, weight, OC, 0, 0.f, out, OC, 0, 1, stream);
  if (bias && N > 0) {
    add_bias_kernel<<<grid_for(size_t(N) * OC), kBlockSize, 0, stream>>>(out, bias, N, OC);
    ZS_CUDA_CHECK_LAUNCH();
  }
}

template <class T>
void linear_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int N,
                     int C, int OC, cudaStream_t stream) {
  ZS_CHECK(dinp && dweight, "linear_backward: dinp and dweight are required");
  gemm_batched<T>(false, true, N, C, OC, 1.f, dout, OC, 0, weight, OC, 0, 1.f, dinp, C, 0, 1, stream);
  gemm_batched<T>(true, false, C, OC, N, 1.f, inp, C, 0, dout, OC, 0, 1.f, dweight, OC, 0, 1, stream);
  if (dbias) accumulate_column_sums<1>(ColumnOutputs<1, T>{{dbias}}, N, OC, BiasTerm<T>{dout, OC}, stream);
}

#define ZS_INSTANTIATE(T)                                                                               \
  template void gemm_batched<T>(bool, bool, int, int, int, float, const T*, int, long long, const T*, int, \
                                long long, float, T*, int, long long, int, cudaStream_t);                \
  template void gemm<T>(bool, bool, int, int, int, float, const T*, int, const T*, int, float, T*, int,         \
                        cudaStream_t);                                                                  \
  template void linear_forward<T>(T*, const T*, const T*, const T*, int, int, int, cudaStream_t);       \
  template void linear_backward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, int, cudaStream_t);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

}  // namespace zshard::cuda
