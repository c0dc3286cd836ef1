// GEMM through OpenBLAS (row-major CBLAS); the bf16 GEMM over fp32 copies of tiles of its operands.
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

// The tiles of the bf16 GEMM, whose fp32 copies of an A, a B and a C tile fit kOpScratchBytes: C's rows and
// columns halved, the larger first, down to kSmallest, and only then the sum's depth. A problem that fits
// is one tile, a single sgemm; tiles of C give each element the sum of the products it had whole (in the
// order sgemm's kernel takes for its place: the same bits on some CPUs), where depth tiles add partial
// sums in fp32 (an LM head's input gradient, whose depth is the vocabulary, or a weight gradient
// over more than about 30k tokens).
namespace {
struct GemmTiles {
  int m, n, k;
};
// The fp32 copies of an A, a B and a C tile.
size_t tile_bytes(const GemmTiles& t) {
  return sizeof(float) * (size_t(t.m) * t.k + size_t(t.k) * t.n + size_t(t.m) * t.n);
}
GemmTiles gemm_tiles(int M, int N, int K) {
  constexpr int kSmallest = 256;  // below this sgemm loses its speed, and the copies are small anyway
  GemmTiles t{M, N, std::max(K, 1)};
  while (tile_bytes(t) > kOpScratchBytes) {
    int& wider = t.m >= t.n ? t.m : t.n;
    int& halved = wider > kSmallest ? wider : t.k;
    if (halved <= kSmallest) break;
    halved = (halved + 1) / 2;
  }
  return t;
}
}  // namespace

int64_t bf16_gemm_scratch_bytes(int M, int N, int K) {
  return M == 0 || N == 0 ? 0 : int64_t(tile_bytes(gemm_tiles(M, N, K)));
}

// cuBLAS's bf16 GEMM with fp32 compute: the bf16 operands exactly, fp32 products and sums (a C tile sums
// its depth tiles in fp32), C read and written in bf16, one rounding per element.
template <>
void gemm<bf16>(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A, int lda,
                const bf16* B, int ldb, float beta, bf16* C, int ldc) {
  using bf16_math::Fp32;
  bf16_math::check_gemm_args(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  const GemmTiles t = gemm_tiles(M, N, K);
  for (int i = 0; i < M; i += t.m)
    for (int j = 0; j < N; j += t.n) {
      const int m = std::min(t.m, M - i), n = std::min(t.n, N - j);
      bf16* c_tile = C + size_t(i) * ldc + j;
      const Fp32 c(c_tile, m, n, ldc);
      for (int p = 0; p < K || p == 0; p += t.k) {
        const int k = std::min(t.k, K - p);
        // op(A)'s rows i.. and columns p.., op(B)'s rows p.. and columns j.., each copied dense.
        const Fp32 a = trans_a ? Fp32(A + size_t(p) * lda + i, k, m, lda) : Fp32(A + size_t(i) * lda + p, m, k, lda);
        const Fp32 b = trans_b ? Fp32(B + size_t(j) * ldb + p, n, k, ldb) : Fp32(B + size_t(p) * ldb + j, k, n, ldb);
        gemm<float>(trans_a, trans_b, m, n, k, alpha, a.get(), std::max(1, trans_a ? m : k), b.get(),
                    std::max(1, trans_b ? k : n), p == 0 ? beta : 1.f, c.get(), n);
      }
      c.round_rows_into(c_tile, m, n, ldc);
    }
}

template void gemm<float>(bool, bool, int, int, int, float, const float*, int, const float*, int, float,
                          float*, int);
template void gemm<double>(bool, bool, int, int, int, double, const double*, int, const double*, int,
                           double, double*, int);

}  // namespace zshard::cpu
