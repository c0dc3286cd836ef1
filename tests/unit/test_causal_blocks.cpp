// The causal block plan of attention's GEMMs (kernels/causal_blocks.h), run with the CPU GEMM: each of its
// three products against the plain causal sum, over several heads with strided per-position operands.
// The upper-right quarter of every score-shaped input is NaN, so reading it would show; that quarter of
// an output must stay unwritten.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/causal_blocks.h"
#include "kernels/cpu/ops.h"

namespace zshard::causal_blocks {
namespace {

constexpr int kHeads = 3, kHs = 4, kLd = 2 * kHeads * kHs + 5;  // per-position rows wider than the heads
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

void cpu_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const double* A, int lda, long long sa,
              const double* B, int ldb, long long sb, float beta, double* C, int ldc, long long sc,
              int batch) {
  for (int i = 0; i < batch; ++i)
    cpu::gemm<double>(ta, tb, M, N, K, alpha, A + i * sa, lda, B + i * sb, ldb, beta, C + i * sc, ldc);
}

bool in_skipped_quarter(int t, int j, int Tn) { return t < Tn / 2 && j >= Tn / 2; }

std::vector<double> random_vector(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<double> dist(-1, 1);
  std::vector<double> x(n);
  for (double& e : x) e = dist(rng);
  return x;
}

// Causal (heads, T, T) weights: zero above the diagonal, NaN in the quarter the plan must not read.
std::vector<double> causal_weights(int Tn, std::mt19937& rng) {
  std::vector<double> p = random_vector(size_t(kHeads) * Tn * Tn, rng);
  for (int h = 0; h < kHeads; ++h)
    for (int t = 0; t < Tn; ++t)
      for (int j = t + 1; j < Tn; ++j)
        p[(size_t(h) * Tn + t) * Tn + j] = in_skipped_quarter(t, j, Tn) ? kNaN : 0;
  return p;
}

double at(const std::vector<double>& x, int row, int head, int d) {
  return x[size_t(row) * kLd + head * kHs + d];
}

// Every head's per-position rows of `out` against `before` plus added(head, row, d).
template <class Added>
void expect_rows(const std::vector<double>& out, const std::vector<double>& before, int Tn, Added added) {
  for (int h = 0; h < kHeads; ++h)
    for (int r = 0; r < Tn; ++r)
      for (int d = 0; d < kHs; ++d)
        EXPECT_NEAR(at(out, r, h, d), at(before, r, h, d) + added(h, r, d), 1e-12)
            << "head " << h << " row " << r;
}

class CausalBlocks : public testing::TestWithParam<int> {};

TEST_P(CausalBlocks, MaskedOuterComputesTheLowerTriangleAndSkipsTheQuarter) {
  const int Tn = GetParam();
  std::mt19937 rng(Tn);
  const std::vector<double> a = random_vector(size_t(Tn) * kLd, rng);
  const std::vector<double> b = random_vector(size_t(Tn) * kLd, rng);
  std::vector<double> s(size_t(kHeads) * Tn * Tn, kNaN);
  masked_outer(cpu_gemm, s.data(), Tn, Rows<const double>{a.data(), kLd, kHs},
               Rows<const double>{b.data(), kLd, kHs}, kHs, 0.5f, kHeads);
  for (int h = 0; h < kHeads; ++h)
    for (int t = 0; t < Tn; ++t)
      for (int j = 0; j < Tn; ++j) {
        const double got = s[(size_t(h) * Tn + t) * Tn + j];
        if (in_skipped_quarter(t, j, Tn)) {
          EXPECT_TRUE(std::isnan(got)) << "skipped quarter written, head " << h << " (" << t << "," << j
                                       << ")";
        } else if (j <= t) {
          double want = 0;
          for (int d = 0; d < kHs; ++d) want += at(a, t, h, d) * at(b, j, h, d);
          EXPECT_NEAR(got, 0.5 * want, 1e-12) << "head " << h << " (" << t << "," << j << ")";
        }
      }
}

// Causal weights, an operand, and an output that starts from random values (the products add into it).
struct ProductCase {
  ProductCase(int length, unsigned seed)
      : Tn(length), rng(seed), p(causal_weights(Tn, rng)), x(random_vector(size_t(Tn) * kLd, rng)),
        before(random_vector(size_t(Tn) * kLd, rng)), out(before) {}
  Rows<double> out_rows() { return {out.data(), kLd, kHs}; }
  Rows<const double> x_rows() const { return {x.data(), kLd, kHs}; }
  double weight(int h, int t, int j) const { return p[(size_t(h) * Tn + t) * Tn + j]; }

  int Tn;
  std::mt19937 rng;
  std::vector<double> p, x, before, out;
};

TEST_P(CausalBlocks, LowerTimesSumsThePastOnly) {
  ProductCase c(GetParam(), 100 + GetParam());
  lower_times(cpu_gemm, c.out_rows(), c.p.data(), c.Tn, c.x_rows(), kHs, 2.0f, 1.0f, kHeads);
  expect_rows(c.out, c.before, c.Tn, [&](int h, int t, int d) {
    double sum = 0;
    for (int j = 0; j <= t; ++j) sum += c.weight(h, t, j) * at(c.x, j, h, d);
    return 2.0 * sum;
  });
  // Columns outside the heads are not the plan's to touch.
  for (int t = 0; t < c.Tn; ++t)
    for (int col = kHeads * kHs; col < kLd; ++col)
      EXPECT_EQ(c.out[size_t(t) * kLd + col], c.before[size_t(t) * kLd + col]);
}

TEST_P(CausalBlocks, LowerTransposedTimesSumsTheFutureOnly) {
  ProductCase c(GetParam(), 200 + GetParam());
  lower_transposed_times(cpu_gemm, c.out_rows(), c.p.data(), c.Tn, c.x_rows(), kHs, 0.25f, kHeads);
  expect_rows(c.out, c.before, c.Tn, [&](int h, int j, int d) {
    double sum = 0;
    for (int t = j; t < c.Tn; ++t) sum += c.weight(h, t, j) * at(c.x, t, h, d);
    return 0.25 * sum;
  });
}

// Odd and even lengths, and T = 1, where the first block is empty.
INSTANTIATE_TEST_SUITE_P(Lengths, CausalBlocks, testing::Values(1, 2, 7, 8, 33));

}  // namespace
}  // namespace zshard::causal_blocks
