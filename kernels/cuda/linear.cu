// GEMM through cuBLAS (fp32 accumulation; bf16 inputs run on tensor cores), the Conv1D linear layer and
// LoRA on a frozen linear layer.
#include <cublas_v2.h>

#include <algorithm>
#include <utility>

#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/lora_linear.h"

namespace zshard::cuda {

namespace {

template <class T>
constexpr cudaDataType_t cuda_type() {
  return std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_16BF;
}

// x: a pack of kN columns (common.cuh's Pack), whose bias stays in registers; y: rows, strided. No index
// division: a flat loop's `i % OC` made this kernel compute-bound.
template <class T, int kN>
__global__ void add_bias_kernel(T* out, const T* bias, int N, int OC) {
  using P = Pack<T, kN>;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= OC / kN) return;
  const P b = reinterpret_cast<const P*>(bias)[c];
  for (int row = blockIdx.y; row < N; row += gridDim.y) {
    P* o = reinterpret_cast<P*>(out + size_t(row) * OC) + c;
    P v = *o;
#pragma unroll
    for (int k = 0; k < kN; ++k) v.v[k] = from_f32<T>(to_f32(v.v[k]) + to_f32(b.v[k]));
    *o = v;
  }
}
constexpr int kBiasThreads = 128;
constexpr int kBiasRowBlocks = 4096;  // each thread adds its bias to N / 4096 rows

template <class T>
void add_bias(T* out, const T* bias, int N, int OC, cudaStream_t stream) {
  if (N == 0 || OC == 0) return;
  launch_packed<T>(rows_packable<T>(OC, {out, bias}), [&](auto kN) {
    const dim3 grid((OC / kN + kBiasThreads - 1) / kBiasThreads, std::min(N, kBiasRowBlocks));
    add_bias_kernel<T, kN><<<grid, kBiasThreads, 0, stream>>>(out, bias, N, OC);
  });
  ZS_CUDA_CHECK_LAUNCH();
}

// Matrix i of the grid (head i % heads of batch element i / heads) of each operand: the pointer arrays of
// cublasGemmBatchedEx, written on the device so that no host copy or synchronisation is needed.
template <class T>
__global__ void grid_pointers_kernel(const void** a, const void** b, void** c, const T* A, GridStrides sa,
                                     const T* B, GridStrides sb, T* C, GridStrides sc, GemmGrid grid) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= grid.count()) return;
  const int batch = i / grid.heads, head = i % grid.heads;
  a[i] = A + sa.offset(batch, head);
  b[i] = B + sb.offset(batch, head);
  c[i] = C + sc.offset(batch, head);
}

}  // namespace

// cuBLAS is column-major: the row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T, so the
// operands swap and each keeps its own transpose flag. The heads of one batch element are uniformly
// strided (a strided-batched GEMM); several batch elements take one pointer-array GEMM, or, unaligned, a
// strided-batched GEMM each.
template <class T>
void gemm_grid(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const T* A, int lda,
               GridStrides sa, const T* B, int ldb, GridStrides sb, float beta, T* C, int ldc, GridStrides sc,
               GemmGrid grid, cudaStream_t stream) {
  if (M == 0 || N == 0 || grid.count() == 0) return;
  cublasHandle_t handle = cublas_handle();
  ZS_CUBLAS_CHECK(cublasSetStream(handle, stream));
  // cublasSetStream hands the handle back to cuBLAS's own scratch pool: memory the tracking allocator never
  // sees, which a recorded step would allocate inside its graph. Scratch of the pool's size comes from the
  // tracker instead, freed in order after the call (the estimate counts it: shard/memory/estimator.cpp).
  // The handle keeps pointing at it once freed: every call, this the only one, sets its own first.
  const Buffer scratch = workspace(cublas_workspace_bytes(), stream);
  ZS_CUBLAS_CHECK(cublasSetWorkspace(handle, scratch.data(), cublas_workspace_bytes()));
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  constexpr cudaDataType_t type = cuda_type<T>();
  const bool pointer_array = grid.batches > 1 && grid_aligned(A, sa, sizeof(T)) &&
                             grid_aligned(B, sb, sizeof(T)) && grid_aligned(C, sc, sizeof(T));
  if (!pointer_array) {
    for (int e = 0; e < grid.batches; ++e)
      ZS_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
          handle, op_b, op_a, N, M, K, &alpha, B + e * sb.batch, type, ldb, sb.head, A + e * sa.batch, type,
          lda, sa.head, &beta, C + e * sc.batch, type, ldc, sc.head, grid.heads, CUBLAS_COMPUTE_32F,
          CUBLAS_GEMM_DEFAULT));
    return;
  }
  const int n = grid.count();
  Buffer pointers = workspace(3 * size_t(n) * sizeof(void*), stream);
  auto** a = static_cast<const void**>(pointers.data());
  const void** b = a + n;
  void** c = const_cast<void**>(b + n);
  grid_pointers_kernel<<<grid_for(size_t(n)), kBlockSize, 0, stream>>>(a, b, c, A, sa, B, sb, C, sc, grid);
  ZS_CUDA_CHECK_LAUNCH();
  ZS_CUBLAS_CHECK(cublasGemmBatchedEx(handle, op_b, op_a, N, M, K, &alpha, b, type, ldb, a, type, lda, &beta,
                                      c, type, ldc, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

namespace {
// cuBLAS takes its 16-byte-aligned kernels only when every extent, not just the leading dimensions, is a
// multiple of 8 elements: GPT-2's odd vocabulary (50257) put the LM head's GEMMs on 1-element-aligned
// kernels, 4 to 7 times slower (benchmarks/RESULTS.md, the H200 profile). So a large unaligned extent is
// cut into an aligned bulk and a remainder of under 8; the parts of K add up through beta = 1 (in bf16 the
// bulk is rounded once before the remainder adds: one rounding more, half an ulp at most).
constexpr int kAlignedExtent = 8;
int aligned_bulk(int n) { return n >= 8 * kAlignedExtent ? n / kAlignedExtent * kAlignedExtent : n; }
}  // namespace

template <class T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const T* A, int lda, const T* B,
          int ldb, float beta, T* C, int ldc, cudaStream_t stream) {
  const int M0 = aligned_bulk(M), N0 = aligned_bulk(N), K0 = aligned_bulk(K);
  // op(A) at row i, column k; op(B) at row k, column j.
  const auto a_at = [&](int i, int k) { return trans_a ? A + size_t(k) * lda + i : A + size_t(i) * lda + k; };
  const auto b_at = [&](int k, int j) { return trans_b ? B + size_t(j) * ldb + k : B + size_t(k) * ldb + j; };
  using Part = std::pair<int, int>;  // offset, extent
  for (const auto& [i, m] : {Part{0, M0}, Part{M0, M - M0}})
    for (const auto& [j, n] : {Part{0, N0}, Part{N0, N - N0}})
      if (m > 0 && n > 0) {
        // The bulk of K runs even when K = 0 (C = beta C); the remainder adds to it.
        gemm_grid<T>(trans_a, trans_b, m, n, K0, alpha, a_at(i, 0), lda, {}, b_at(0, j), ldb, {}, beta,
                     C + size_t(i) * ldc + j, ldc, {}, {}, stream);
        if (K > K0)
          gemm_grid<T>(trans_a, trans_b, m, n, K - K0, alpha, a_at(i, K0), lda, {}, b_at(K0, j), ldb, {}, 1.f,
                       C + size_t(i) * ldc + j, ldc, {}, {}, stream);
      }
}

template <class T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC,
                    cudaStream_t stream) {
  gemm<T>(false, false, N, OC, C, 1.f, inp, C, weight, OC, 0.f, out, OC, stream);
  if (bias) add_bias(out, bias, N, OC, stream);
}

template <class T>
void linear_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int N,
                     int C, int OC, cudaStream_t stream) {
  ZS_CHECK(dinp, "linear_backward: dinp is required");
  gemm<T>(false, true, N, C, OC, 1.f, dout, OC, weight, OC, 1.f, dinp, C, stream);
  if (dweight) gemm<T>(true, false, C, OC, N, 1.f, inp, C, dout, OC, 1.f, dweight, OC, stream);
  if (dbias) accumulate_column_sums<1>(ColumnOutputs<1, T>{{dbias}}, N, OC, BiasTerm<T>{dout, OC}, stream);
}

namespace {
// gemm on `stream`, called as kernels/lora_linear.h calls a backend's GEMM.
template <class T>
auto gemm_on(cudaStream_t stream) {
  return [stream](auto... args) { gemm<T>(args..., stream); };
}
}  // namespace

// The steps are kernels/lora_linear.h's, which the cpu op runs too.
template <class T>
void lora_linear_forward(T* out, T* lora_hidden, const T* inp, const T* weight, const T* bias, const T* lora_a,
                         const T* lora_b, int N, int C, int OC, int R, float scale, WeightLayout layout,
                         cudaStream_t stream) {
  const auto bias_add = [stream](T* o, const T* b, int rows, int cols) { add_bias(o, b, rows, cols, stream); };
  lora_linear::forward(gemm_on<T>(stream), bias_add, out, lora_hidden, inp, weight, bias, lora_a, lora_b, N, C,
                       OC, R, scale, layout);
}

template <class T>
void lora_linear_backward(T* dinp, T* dlora_a, T* dlora_b, const T* dout, const T* inp, const T* weight,
                          const T* lora_a, const T* lora_b, const T* lora_hidden, int N, int C, int OC, int R,
                          float scale, WeightLayout layout, cudaStream_t stream) {
  const auto scratch = [stream](size_t bytes) { return workspace(bytes, stream); };
  lora_linear::backward(gemm_on<T>(stream), scratch, dinp, dlora_a, dlora_b, dout, inp, weight, lora_a, lora_b,
                        lora_hidden, N, C, OC, R, scale, layout);
}

#define ZS_INSTANTIATE(T)                                                                               \
  template void gemm_grid<T>(bool, bool, int, int, int, float, const T*, int, GridStrides, const T*, int,     \
                             GridStrides, float, T*, int, GridStrides, GemmGrid, cudaStream_t);            \
  template void gemm<T>(bool, bool, int, int, int, float, const T*, int, const T*, int, float, T*, int,         \
                        cudaStream_t);                                                                  \
  template void linear_forward<T>(T*, const T*, const T*, const T*, int, int, int, cudaStream_t);       \
  template void linear_backward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, int, cudaStream_t); \
  template void lora_linear_forward<T>(T*, T*, const T*, const T*, const T*, const T*, const T*, int, int, int, \
                                       int, float, WeightLayout, cudaStream_t);                             \
  template void lora_linear_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*,       \
                                        const T*, int, int, int, int, float, WeightLayout, cudaStream_t);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

}  // namespace zshard::cuda
