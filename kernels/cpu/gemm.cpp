// GEMM through OpenBLAS (row-major CBLAS).
#include <cblas.h>

#include <algorithm>

#include <zshard/error.h>

#include "kernels/cpu/bf16_math.h"
#include "kernels/cpu/ops.h"

namespace zshard::cpu {

void bf16_math::check_gemm_args(bool trans_a, bool trans_b, int M, int N, int K, int lda, int ldb, int ldc) {
  ZS_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size M=", M, " N=", N, " K=", K);
  // CBLAS only reports bad strides on stderr; make them an error here.
  ZS_CHECK(lda >= std::max(1, trans_a ? M : K), "gemm: lda=", lda, " too small");
  ZS_CHECK(ldb >= std::max(1, trans_b ? K : N), "gemm: ldb=", ldb, " too small");
  ZS_CHECK(ldc >= std::max(1, N), "gemm: ldc=", ldc, " too small");
}

namespace {

CBLAS_TRANSPOSE blas_op(bool trans) { return trans ? CblasTrans : CblasNoTrans; }

void blas_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
               int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, blas_op(ta), blas_op(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void blas_gemm(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda,
               const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, blas_op(ta), blas_op(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace

template <class T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, Compute<T> alpha, const T* A, int lda, const T* B,
          int ldb, Compute<T> beta, T* C, int ldc) {
  bf16_math::check_gemm_args(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  blas_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template void gemm<float>(bool, bool, int, int, int, float, const float*, int, const float*, int, float,
                          float*, int);
template void gemm<double>(bool, bool, int, int, int, double, const double*, int, const double*, int,
                           double, double*, int);

}  // namespace zshard::cpu
