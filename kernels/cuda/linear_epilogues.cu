// The linear layer with its epilogues (<zshard/ops.h>'s linear_epilogue_forward and backward) through
// cuBLASLt: the bias (CUBLASLT_EPILOGUE_BIAS), the bias and the GELU keeping the pre-activation
// (GELU_AUX_BIAS), the GELU's derivative with the bias gradient of the layer before it (DGELU_BGRAD), and
// the layer's own bias gradient from its weight-gradient GEMM (BGRADA: dout is that GEMM's A in cuBLASLt's
// column-major view). Each saves a pass over an (N, OC) or (N, 4C) matrix that a separate kernel would
// read and write. Where cuBLASLt has no kernel for a shape (its heuristic finds none, or the
// pre-activation's rows are not a multiple of 8 elements, which GELU's epilogue needs, or a bias or
// pre-activation is not 16-byte aligned), the plain GEMM and the separate kernels compute the same up to
// bf16 rounding: they round the GEMM's output before the bias, the GELU's derivative and the bias
// gradient, where the epilogue rounds once.
#include <cublasLt.h>

#include <map>
#include <tuple>

#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gelu.cuh"

namespace zshard::cuda {

namespace {

template <class T>
constexpr cudaDataType_t lt_type() {
  return std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_16BF;
}

// The most scratch cuBLASLt may ask for: cuBLAS's own default on Hopper. With less its heuristic passes
// over the kernels that need scratch (those that split the sum, or sum a bias gradient across thread
// blocks). At 4 MiB the epilogue GEMMs ran slower than the plain GEMMs they replace (the H100 profile in
// benchmarks/RESULTS.md); whether scratch was the cause, the next GPU run's A/B of the epilogues says. A
// kernel that splits the sum adds in another order. A chosen kernel's scratch comes from the tracking
// allocator only as large as it asks.
constexpr size_t kLtMaxWorkspace = size_t(32) << 20;

struct LtHandle {
  cublasLtHandle_t handle = nullptr;
  ~LtHandle() {
    if (handle) cublasLtDestroy(handle);
  }
};
cublasLtHandle_t lt_handle() {
  thread_local LtHandle holder;
  if (!holder.handle) ZS_CUBLAS_CHECK(cublasLtCreate(&holder.handle));
  return holder.handle;
}

// cuBLASLt's descriptors, destroyed with their scope.
struct MatmulDesc {
  cublasLtMatmulDesc_t desc = nullptr;
  ~MatmulDesc() {
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
  template <class V>
  void set(cublasLtMatmulDescAttributes_t attribute, const V& value) {
    ZS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
  }
};
struct MatrixLayout {
  cublasLtMatrixLayout_t layout = nullptr;
  MatrixLayout(cudaDataType_t type, int rows, int cols, int ld) {
    ZS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, uint64_t(rows), uint64_t(cols), int64_t(ld)));
  }
  ~MatrixLayout() {
    if (layout) cublasLtMatrixLayoutDestroy(layout);
  }
};
// The heuristic assumes 256-byte aligned matrices unless told: weights are views at any offset of a flat
// unit, so it is told each operand's alignment (cuBLASLt's A, B and C/D).
struct Preference {
  cublasLtMatmulPreference_t preference = nullptr;
  Preference(uint32_t align_a, uint32_t align_b, uint32_t align_c) {
    ZS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kLtMaxWorkspace);
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a);
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b);
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c);
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c);
  }
  template <class V>
  void set(cublasLtMatmulPreferenceAttributes_t attr, const V& value) {
    ZS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, attr, &value, sizeof(value)));
  }
  ~Preference() {
    if (preference) cublasLtMatmulPreferenceDestroy(preference);
  }
};

// Row-major C (M, N) = op(A) op(B) + beta C with `epilogue`. cuBLASLt sees the column-major C^T = op(B)^T
// op(A)^T, as kernels/cuda/linear.cu's gemm does: its rows are C's N columns, so the bias, a bias gradient
// (N elements of T) and the pre-activation (`aux`, laid out as C) follow C's columns, and its A is this B.
template <class T>
struct LtGemm {
  bool trans_a, trans_b;
  int M, N, K;
  const T* A;
  int lda;
  const T* B;
  int ldb;
  float beta;
  T* C;
  int ldc;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;  // read (BIAS), or written (a bias gradient)
  const void* aux = nullptr;   // written (GELU_AUX), or read (DGELU)
};

// The largest power of two up to 16 that divides a pointer: cuBLASLt picks its kernels by it.
unsigned alignment(const void* p) {
  const auto bits = reinterpret_cast<uintptr_t>(p);
  return bits == 0 ? 16 : unsigned(std::min<uintptr_t>(16, bits & (~bits + 1)));
}

// What the heuristic answered for a problem, kept for the thread's later calls: asking for every GEMM of
// every step would cost the host tens of microseconds each.
struct Choice {
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
};
using ChoiceKey = std::tuple<int, int, int, int, int, int, int, int, int, uint32_t, unsigned>;

thread_local size_t epilogue_gemm_count = 0;

// Runs g on `stream`; false, having run nothing, where cuBLASLt has no kernel for it.
template <class T>
bool lt_matmul(const LtGemm<T>& g, cudaStream_t stream) {
  if (g.aux && g.ldc % 8) return false;  // the pre-activation's rows: a multiple of 8 elements
  // The epilogue's vectors are read and written in 16-byte pieces; a bias or pre-activation view at
  // another offset of its flat unit takes the separate kernels.
  if (alignment(g.bias) < 16 || alignment(g.aux) < 16) return false;
  constexpr cudaDataType_t type = lt_type<T>();
  MatmulDesc desc;
  ZS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is this B
  const cublasOperation_t op_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  desc.set(CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, g.epilogue);
  if (g.bias) {
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, type);
  }
  if (g.aux) {
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t(g.ldc));
  }
  const MatrixLayout a(type, op_a == CUBLAS_OP_N ? g.N : g.K, op_a == CUBLAS_OP_N ? g.K : g.N, g.ldb);
  const MatrixLayout b(type, op_b == CUBLAS_OP_N ? g.K : g.M, op_b == CUBLAS_OP_N ? g.M : g.K, g.lda);
  const MatrixLayout c(type, g.N, g.M, g.ldc);

  thread_local std::map<ChoiceKey, Choice> choices;
  const unsigned aligned = alignment(g.A) | alignment(g.B) << 5 | alignment(g.C) << 10 |
                           alignment(g.bias) << 15 | alignment(g.aux) << 20;
  const ChoiceKey key{g.M, g.N, g.K, op_a, op_b, g.lda, g.ldb, g.ldc, int(type), uint32_t(g.epilogue), aligned};
  auto it = choices.find(key);
  if (it == choices.end()) {
    Preference preference(alignment(g.B), alignment(g.A), alignment(g.C));  // cuBLASLt's A is this B
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    const cublasStatus_t rc = cublasLtMatmulAlgoGetHeuristic(lt_handle(), desc.desc, a.layout, b.layout, c.layout,
                                                             c.layout, preference.preference, 1, &result, &count);
    Choice choice;
    if (rc == CUBLAS_STATUS_SUCCESS && count > 0 && result.state == CUBLAS_STATUS_SUCCESS)
      choice = {true, result.algo, result.workspaceSize};
    else if (rc != CUBLAS_STATUS_NOT_SUPPORTED && rc != CUBLAS_STATUS_SUCCESS)
      ZS_CUBLAS_CHECK(rc);
    it = choices.emplace(key, choice).first;
  }
  if (!it->second.found) return false;
  const size_t bytes = it->second.workspace;
  const auto run = [&](void* scratch) {
    const float alpha = 1.f;
    return cublasLtMatmul(lt_handle(), desc.desc, &alpha, g.B, a.layout, g.A, b.layout, &g.beta, g.C, c.layout, g.C,
                          c.layout, &it->second.algo, scratch, bytes, stream);
  };
  cublasStatus_t rc;
  if (bytes) {
    const Buffer scratch = workspace(bytes, stream);
    rc = run(scratch.data());
  } else {
    rc = run(nullptr);
  }
  if (rc == CUBLAS_STATUS_NOT_SUPPORTED) {
    it->second.found = false;  // the heuristic's pick refused at launch: the separate kernels from now on
    return false;
  }
  ZS_CUBLAS_CHECK(rc);
  ++epilogue_gemm_count;
  return true;
}

// dbias += T(column sums of d (rows, cols)): rounded to T before it is added, as the epilogues' bias
// gradient, which they write in the output's type, and which axpy then adds. The same bits in f32 as a
// direct sum into dbias.
template <class T>
void add_rounded_column_sums(T* dbias, const T* d, int rows, int cols, cudaStream_t stream) {
  Buffer sums = workspace(size_t(cols) * sizeof(T), stream);
  T* s = static_cast<T*>(sums.data());
  ZS_CUDA_CHECK(cudaMemsetAsync(s, 0, size_t(cols) * sizeof(T), stream));
  accumulate_column_sums<1>(ColumnOutputs<1, T>{{s}}, rows, cols, BiasTerm<T>{d, cols}, stream);
  axpy(dbias, s, 1.f, size_t(cols), stream);
}

// dinp = gelu'(pre) * dinp: the GELU's backward on the GEMM's output, where no epilogue took it.
template <class T>
__global__ void gelu_backward_in_place_kernel(T* dinp, const T* pre, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dinp[i] = from_f32<T>(gelu_grad(to_f32(pre[i])) * to_f32(dinp[i]));
}

// lt_matmul with g's bias gradient (n elements) written to scratch, then added to `grad` (null: none).
template <class T>
bool lt_matmul_adding_bias_gradient(LtGemm<T> g, T* grad, int n, cudaStream_t stream) {
  if (!grad) return lt_matmul(g, stream);
  const Buffer scratch = workspace(size_t(n) * sizeof(T), stream);
  g.bias = scratch.data();
  if (!lt_matmul(g, stream)) return false;
  axpy(grad, static_cast<const T*>(scratch.data()), 1.f, size_t(n), stream);
  return true;
}

}  // namespace

size_t epilogue_gemms() { return epilogue_gemm_count; }

template <class T>
void linear_epilogue_forward(T* out, T* pre, const T* inp, const T* weight, const T* bias, int N, int C, int OC,
                             cudaStream_t stream) {
  if (N == 0 || OC == 0) return;
  const cublasLtEpilogue_t epilogue = pre ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                                          : (bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
  const LtGemm<T> g{false, false, N, OC, C, inp, C, weight, OC, 0.f, out, OC, epilogue, bias, pre};
  if (lt_matmul(g, stream)) return;
  linear_forward(pre ? pre : out, inp, weight, bias, N, C, OC, stream);
  if (pre) gelu_forward(out, pre, size_t(N) * OC, stream);
}

template <class T>
void linear_epilogue_backward(T* dinp, T* dweight, T* dbias, T* pre_dbias, const T* dout, const T* inp, const T* pre,
                              const T* weight, int N, int C, int OC, cudaStream_t stream) {
  ZS_CHECK(dinp, "linear_epilogue_backward: dinp is required");
  if (N == 0) return;
  // dinp (N, C) = dout @ W^T, through the GELU with `pre`.
  if (!pre) {
    gemm<T>(false, true, N, C, OC, 1.f, dout, OC, weight, OC, 0.f, dinp, C, stream);
  } else {
    const LtGemm<T> g{false, true, N, C, OC, dout, OC, weight, OC, 0.f, dinp, C,
                      pre_dbias ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU, nullptr, pre};
    if (!lt_matmul_adding_bias_gradient(g, pre_dbias, C, stream)) {
      gemm<T>(false, true, N, C, OC, 1.f, dout, OC, weight, OC, 0.f, dinp, C, stream);
      const size_t n = size_t(N) * C;
      gelu_backward_in_place_kernel<<<grid_for(n), kBlockSize, 0, stream>>>(dinp, pre, n);
      ZS_CUDA_CHECK_LAUNCH();
      if (pre_dbias) add_rounded_column_sums(pre_dbias, dinp, N, C, stream);
    }
  }
  // dW (C, OC) += inp^T @ dout, and the bias gradient from its A (dout) where cuBLASLt can.
  if (!dweight) {
    if (dbias) add_rounded_column_sums(dbias, dout, N, OC, stream);
    return;
  }
  const LtGemm<T> g{true, false, C, OC, N, inp, C, dout, OC, 1.f, dweight, OC, CUBLASLT_EPILOGUE_BGRADA};
  if (dbias && lt_matmul_adding_bias_gradient(g, dbias, OC, stream)) return;
  gemm<T>(true, false, C, OC, N, 1.f, inp, C, dout, OC, 1.f, dweight, OC, stream);
  if (dbias) add_rounded_column_sums(dbias, dout, N, OC, stream);
}

#define ZS_INSTANTIATE(T)                                                                                       \
  template void linear_epilogue_forward<T>(T*, T*, const T*, const T*, const T*, int, int, int, cudaStream_t);  \
  template void linear_epilogue_backward<T>(T*, T*, T*, T*, const T*, const T*, const T*, const T*, int, int, int, \
                                            cudaStream_t);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

}  // namespace zshard::cuda
