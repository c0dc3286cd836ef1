// The causal block plan of attention's GEMMs (kernels/causal_blocks.h), run with the CPU GEMM: each of its
// three products against the plain causal sum, over a grid of batch elements and heads whose
// per-position operands have unrelated head and batch strides (as attention's slices of qkv do).
// The upper-right quarter of every score-shaped input is NaN, so reading it would show; that quarter of
// an output must stay unwritten.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/causal_blocks.h"
#include "kernels/cpu/ops.h"

namespace zshard::causal_blocks {
namespace {

constexpr int kHeads = 3, kBatches = 2, kHs = 4;
constexpr int kLd = 2 * kHeads * kHs + 5;  // per-position rows wider than the heads
constexpr GemmGrid kGrid{kHeads, kBatches};
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Batch elements of per-position operands are a row plus 3 elements apart: not a multiple of the head
// stride, so a plan that folded the grid into one stride would read the wrong slices.
GridStrides position_strides(int Tn) { return {kHs, (long long)(Tn + 1) * kLd + 3}; }
size_t position_size(int Tn) { return size_t(position_strides(Tn).batch) * kBatches; }

void cpu_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const double* A, int lda, GridStrides sa,
              const double* B, int ldb, GridStrides sb, float beta, double* C, int ldc, GridStrides sc,
              GemmGrid grid) {
  for (int b = 0; b < grid.batches; ++b)
    for (int h = 0; h < grid.heads; ++h)
      cpu::gemm<double>(ta, tb, M, N, K, alpha, A + sa.offset(b, h), lda, B + sb.offset(b, h), ldb, beta,
                        C + sc.offset(b, h), ldc);
}

bool in_skipped_quarter(int t, int j, int Tn) { return t < Tn / 2 && j >= Tn / 2; }

std::vector<double> random_vector(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<double> dist(-1, 1);
  std::vector<double> x(n);
  for (double& e : x) e = dist(rng);
  return x;
}

size_t score_index(int b, int h, int t, int j, int Tn) {
  return ((size_t(b) * kHeads + h) * Tn + t) * Tn + j;
}

// Causal (batches, heads, T, T) weights: zero above the diagonal, NaN in the quarter the plan must not read.
std::vector<double> causal_weights(int Tn, std::mt19937& rng) {
  std::vector<double> p = random_vector(size_t(kBatches) * kHeads * Tn * Tn, rng);
  for (int b = 0; b < kBatches; ++b)
    for (int h = 0; h < kHeads; ++h)
      for (int t = 0; t < Tn; ++t)
        for (int j = t + 1; j < Tn; ++j)
          p[score_index(b, h, t, j, Tn)] = in_skipped_quarter(t, j, Tn) ? kNaN : 0;
  return p;
}

double at(const std::vector<double>& x, int Tn, int b, int row, int head, int d) {
  return x[size_t(position_strides(Tn).offset(b, head)) + size_t(row) * kLd + d];
}

Rows<const double> rows_of(const std::vector<double>& x, int Tn) {
  return {x.data(), kLd, position_strides(Tn)};
}

// Every slice of `out` against `before` plus added(b, head, row, d); what lies outside the slices stays.
template <class Added>
void expect_rows(const std::vector<double>& out, const std::vector<double>& before, int Tn, Added added) {
  std::vector<bool> in_slice(out.size(), false);
  for (int b = 0; b < kBatches; ++b)
    for (int h = 0; h < kHeads; ++h)
      for (int r = 0; r < Tn; ++r)
        for (int d = 0; d < kHs; ++d) {
          in_slice[size_t(position_strides(Tn).offset(b, h)) + size_t(r) * kLd + d] = true;
          EXPECT_NEAR(at(out, Tn, b, r, h, d), at(before, Tn, b, r, h, d) + added(b, h, r, d), 1e-12)
              << "batch " << b << " head " << h << " row " << r;
        }
  for (size_t i = 0; i < out.size(); ++i)
    if (!in_slice[i]) EXPECT_EQ(out[i], before[i]) << "element " << i << " is outside every slice";
}

class CausalBlocks : public testing::TestWithParam<int> {};

TEST_P(CausalBlocks, MaskedOuterComputesTheLowerTriangleAndSkipsTheQuarter) {
  const int Tn = GetParam();
  std::mt19937 rng(Tn);
  const std::vector<double> a = random_vector(position_size(Tn), rng);
  const std::vector<double> b = random_vector(position_size(Tn), rng);
  std::vector<double> s(size_t(kBatches) * kHeads * Tn * Tn, kNaN);
  masked_outer(cpu_gemm, s.data(), Tn, rows_of(a, Tn), rows_of(b, Tn), kHs, 0.5f, kGrid);
  for (int n = 0; n < kBatches; ++n)
    for (int h = 0; h < kHeads; ++h)
      for (int t = 0; t < Tn; ++t)
        for (int j = 0; j < Tn; ++j) {
          const double got = s[score_index(n, h, t, j, Tn)];
          if (in_skipped_quarter(t, j, Tn)) {
            EXPECT_TRUE(std::isnan(got)) << "skipped quarter written, batch " << n << " head " << h << " ("
                                         << t << "," << j << ")";
          } else if (j <= t) {
            double want = 0;
            for (int d = 0; d < kHs; ++d) want += at(a, Tn, n, t, h, d) * at(b, Tn, n, j, h, d);
            EXPECT_NEAR(got, 0.5 * want, 1e-12)
                << "batch " << n << " head " << h << " (" << t << "," << j << ")";
          }
        }
}

// Causal weights, an operand, and an output that starts from random values (the products add into it).
struct ProductCase {
  ProductCase(int length, unsigned seed)
      : Tn(length), rng(seed), p(causal_weights(Tn, rng)), x(random_vector(position_size(Tn), rng)),
        before(random_vector(position_size(Tn), rng)), out(before) {}
  Rows<double> out_rows() { return {out.data(), kLd, position_strides(Tn)}; }
  double weight(int b, int h, int t, int j) const { return p[score_index(b, h, t, j, Tn)]; }

  int Tn;
  std::mt19937 rng;
  std::vector<double> p, x, before, out;
};

TEST_P(CausalBlocks, LowerTimesSumsThePastOnly) {
  ProductCase c(GetParam(), 100 + GetParam());
  lower_times(cpu_gemm, c.out_rows(), c.p.data(), c.Tn, rows_of(c.x, c.Tn), kHs, 2.0f, 1.0f, kGrid);
  expect_rows(c.out, c.before, c.Tn, [&](int b, int h, int t, int d) {
    double sum = 0;
    for (int j = 0; j <= t; ++j) sum += c.weight(b, h, t, j) * at(c.x, c.Tn, b, j, h, d);
    return 2.0 * sum;
  });
}

TEST_P(CausalBlocks, LowerTransposedTimesSumsTheFutureOnly) {
  ProductCase c(GetParam(), 200 + GetParam());
  lower_transposed_times(cpu_gemm, c.out_rows(), c.p.data(), c.Tn, rows_of(c.x, c.Tn), kHs, 0.25f, kGrid);
  expect_rows(c.out, c.before, c.Tn, [&](int b, int h, int j, int d) {
    double sum = 0;
    for (int t = j; t < c.Tn; ++t) sum += c.weight(b, h, t, j) * at(c.x, c.Tn, b, t, h, d);
    return 0.25 * sum;
  });
}

// Odd and even lengths, and T = 1, where the first block is empty.
INSTANTIATE_TEST_SUITE_P(Lengths, CausalBlocks, testing::Values(1, 2, 7, 8, 33));

// At GPT-2's shapes (T = 1024, head size 64, bf16) every GEMM of the plan has 16-byte aligned matrices, so
// kernels/cuda's gemm_grid covers all batch elements in one launch; at T = 37 the row blocks are not.
bool plan_is_aligned(int Tn, int hs, int heads, int batches) {
  using Elem = uint16_t;  // bf16-sized
  const int C = heads * hs;
  const GridStrides qkv{hs, (long long)Tn * 3 * C}, out{hs, (long long)Tn * C};
  const GemmGrid grid{heads, batches};
  std::vector<Elem> qkv_buf(size_t(qkv.batch) * batches), out_buf(size_t(out.batch) * batches);
  std::vector<Elem> scores(size_t(batches) * heads * Tn * Tn);
  bool aligned = true;
  const auto gemm = [&](bool, bool, int, int, int, float, const Elem* A, int, GridStrides sa, const Elem* B,
                        int, GridStrides sb, float, Elem* C, int, GridStrides sc, GemmGrid) {
    aligned = aligned && grid_aligned(A, sa, sizeof(Elem)) && grid_aligned(B, sb, sizeof(Elem)) &&
              grid_aligned(C, sc, sizeof(Elem));
  };
  const Rows<const Elem> q{qkv_buf.data(), 3 * C, qkv}, k{q.data + C, 3 * C, qkv};
  const Rows<Elem> o{out_buf.data(), C, out};
  masked_outer(gemm, scores.data(), Tn, q, k, hs, 1.f, grid);
  lower_times(gemm, o, scores.data(), Tn, k, hs, 1.f, 0.f, grid);
  lower_transposed_times(gemm, o, scores.data(), Tn, q, hs, 1.f, grid);
  return aligned;
}

TEST(CausalBlocksAlignment, Gpt2ShapesAreAlignedOddLengthsAreNot) {
  EXPECT_TRUE(plan_is_aligned(1024, 64, 2, 2));
  EXPECT_TRUE(plan_is_aligned(48, 16, 3, 3));  // the shape of the CUDA op test of the one-launch path
  EXPECT_FALSE(plan_is_aligned(37, 8, 3, 2));  // and of the per-element path
}

TEST(CausalBlocksChunk, BoundsTheScratchAndKeepsAtLeastOneElement) {
  EXPECT_EQ(batch_chunk(10, 100, 1000), 10);
  EXPECT_EQ(batch_chunk(10, 100, 350), 3);   // 300 bytes of scratch, not 400
  EXPECT_EQ(batch_chunk(10, 100, 50), 1);    // one element even when it alone is over the budget
  EXPECT_EQ(batch_chunk(4, 100, 1 << 20), 4);
}

}  // namespace
}  // namespace zshard::causal_blocks
