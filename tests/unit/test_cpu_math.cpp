// GEMM against a triple loop, AdamW against a hand-written two-step reference, sum_squares and axpy,
// and the vectorisable exp/tanh/sum helpers of kernels/cpu/vec_math.h against libm.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include <zshard/error.h>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"
#include "tests/unit/cpu_op_check.h"

namespace zshard::cpu {
namespace {

template <class T>
class CpuGemm : public ::testing::Test {};
using Precisions = ::testing::Types<float, double>;
TYPED_TEST_SUITE(CpuGemm, Precisions);

TYPED_TEST(CpuGemm, MatchesTripleLoopForEveryTranspose) {
  using T = TypeParam;
  const int M = 5, N = 7, K = 4;
  const T alpha = T(0.7), beta = T(-0.3);
  const double tolerance = std::is_same_v<T, float> ? 1e-6 : 1e-14;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      // Stored shapes and padded row strides; the padding must not be read or written.
      const int a_rows = ta ? K : M, a_cols = ta ? M : K, lda = a_cols + 3;
      const int b_rows = tb ? N : K, b_cols = tb ? K : N, ldb = b_cols + 2;
      const int ldc = N + 5;
      std::mt19937 rng(20 + 2 * ta + tb);
      const auto A = test::convert<T>(test::random_vector(size_t(a_rows) * lda, rng));
      const auto B = test::convert<T>(test::random_vector(size_t(b_rows) * ldb, rng));
      const auto C0 = test::convert<T>(test::random_vector(size_t(M) * ldc, rng));
      std::vector<T> C = C0;
      gemm<T>(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);

      std::vector<double> expected = test::convert<double>(C0), got = test::convert<double>(C);
      for (int i = 0; i < M; ++i) {
        for (int j = 0; j < N; ++j) {
          double acc = 0;
          for (int k = 0; k < K; ++k) {
            const double a = ta ? A[size_t(k) * lda + i] : A[size_t(i) * lda + k];
            const double b = tb ? B[size_t(j) * ldb + k] : B[size_t(k) * ldb + j];
            acc += a * b;
          }
          expected[size_t(i) * ldc + j] = double(alpha) * acc + double(beta) * double(C0[size_t(i) * ldc + j]);
        }
      }
      // Padding columns of C are compared too: expected keeps C0 there.
      EXPECT_LE(test::max_rel_diff(got, expected), tolerance) << "trans_a=" << ta << " trans_b=" << tb;
    }
  }
}

TYPED_TEST(CpuGemm, RejectsBadStrides) {
  using T = TypeParam;
  std::vector<T> buf(64);
  EXPECT_THROW(gemm<T>(false, false, 4, 4, 4, T(1), buf.data(), 3, buf.data(), 4, T(0), buf.data(), 4), Error);
  EXPECT_THROW(gemm<T>(false, true, 4, 4, 2, T(1), buf.data(), 2, buf.data(), 1, T(0), buf.data(), 4), Error);
  EXPECT_THROW(gemm<T>(false, false, 4, 4, 4, T(1), buf.data(), 4, buf.data(), 4, T(0), buf.data(), 3), Error);
}

// Two AdamW steps written out as in the PyTorch documentation (explicit m_hat and v_hat), in double.
TEST(CpuAdamW, MatchesTwoStepReference) {
  AdamWParams hp;
  hp.lr = 0.01f;
  hp.beta1 = 0.9f;
  hp.beta2 = 0.95f;
  hp.eps = 1e-8f;
  hp.weight_decay = 0.1f;
  hp.grad_scale = 0.5f;
  // The op reads the float hyperparameters; the reference uses the same values widened to double.
  const double lr = hp.lr, b1 = hp.beta1, b2 = hp.beta2, eps = hp.eps, wd = hp.weight_decay, gs = hp.grad_scale;

  std::vector<double> p = {0.5, -1.25, 2.0, 0.0};
  const std::vector<std::vector<double>> grads = {{0.2, -0.4, 1e-3, 0.0}, {-0.1, 0.3, 5.0, 0.0}};
  std::vector<double> ref_p = p, ref_m(p.size(), 0.0), ref_v(p.size(), 0.0);
  std::vector<double> m(p.size(), 0.0), v(p.size(), 0.0);
  for (int t = 1; t <= 2; ++t) {
    hp.step = t;
    adamw_step(p.data(), grads[t - 1].data(), m.data(), v.data(), p.size(), hp);
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = gs * grads[t - 1][i];
      ref_p[i] -= lr * wd * ref_p[i];
      ref_m[i] = b1 * ref_m[i] + (1 - b1) * g;
      ref_v[i] = b2 * ref_v[i] + (1 - b2) * g * g;
      const double m_hat = ref_m[i] / (1 - std::pow(b1, t));
      const double v_hat = ref_v[i] / (1 - std::pow(b2, t));
      ref_p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
    for (size_t i = 0; i < p.size(); ++i) {
      EXPECT_NEAR(p[i], ref_p[i], 1e-15) << "step " << t << " element " << i;
      EXPECT_NEAR(m[i], ref_m[i], 1e-16) << "step " << t << " element " << i;
      EXPECT_NEAR(v[i], ref_v[i], 1e-17) << "step " << t << " element " << i;
    }
  }
  // Step 1 moves each element by about lr against its gradient sign (m_hat / sqrt(v_hat) = sign(g)),
  // after the decay; a zero gradient only decays.
  EXPECT_NEAR(ref_p[3], 0.0, 0.0);

  std::vector<float> pf = {0.5f}, gf = {0.2f}, mf = {0.f}, vf = {0.f};
  hp.step = 1;
  adamw_step(pf.data(), gf.data(), mf.data(), vf.data(), 1, hp);
  EXPECT_NEAR(pf[0], 0.5 * (1 - lr * wd) - lr, 1e-7);
}

// The offloaded optimizer's host step on a device's bf16 gradients: the fp32 step on the same values, and
// the bf16 copy written over the gradients it was computed from (the offload's staging buffer).
TEST(CpuAdamW, Bf16GradientsWithTheCopyInTheirPlace) {
  const size_t n = 1000;  // not a multiple of the kernel's block
  std::mt19937 rng(31);
  const std::vector<float> p0 = test::convert<float>(test::random_vector(n, rng));
  const std::vector<float> m0 = test::convert<float>(test::random_vector(n, rng));
  std::vector<float> v0 = test::convert<float>(test::random_vector(n, rng));
  for (float& x : v0) x = x * x;
  const std::vector<double> g = test::random_vector(n, rng);
  std::vector<bf16> grads(n);
  std::vector<float> grads_f32(n);
  for (size_t i = 0; i < n; ++i) {
    grads[i] = bf16(float(g[i]));
    grads_f32[i] = float(grads[i]);
  }
  const AdamWParams hp{.lr = 1e-2f, .weight_decay = 0.1f, .step = 3, .grad_scale = 0.5f};
  std::vector<float> want_p = p0, want_m = m0, want_v = v0;
  adamw_step(want_p.data(), grads_f32.data(), want_m.data(), want_v.data(), n, hp);
  std::vector<float> p = p0, m = m0, v = v0;
  adamw_step(p.data(), grads.data(), m.data(), v.data(), n, hp, grads.data());
  EXPECT_EQ(p, want_p);
  EXPECT_EQ(m, want_m);
  EXPECT_EQ(v, want_v);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(grads[i].bits, bf16(want_p[i]).bits) << "element " << i;
  double dp = 0, dm = 0;
  EXPECT_THROW(adamw_step(&dp, &dp, &dm, &dm, 1, hp, grads.data()), Error);  // a bf16 copy needs an fp32 master
}

TEST(CpuAdamW, RejectsStepZero) {
  AdamWParams hp;
  hp.step = 0;
  double p = 1, g = 1, m = 0, v = 0;
  EXPECT_THROW(adamw_step(&p, &g, &m, &v, 1, hp), Error);
}

TEST(CpuReductions, SumSquaresAndAxpy) {
  std::mt19937 rng(30);
  const std::vector<double> x = test::random_vector(1003, rng);  // not a multiple of the unrolling
  double expected = 0;
  for (double e : x) expected += e * e;
  EXPECT_NEAR(sum_squares(x.data(), x.size()), expected, 1e-12 * expected);
  const std::vector<float> xf = test::convert<float>(x);
  double expected_f = 0;
  for (float e : xf) expected_f += double(e) * double(e);
  EXPECT_NEAR(sum_squares(xf.data(), xf.size()), expected_f, 1e-12 * expected_f);
  EXPECT_EQ(sum_squares(x.data(), 0), 0.0);

  std::vector<double> y = test::random_vector(x.size(), rng);
  const std::vector<double> y0 = y;
  axpy(y.data(), x.data(), -0.5, x.size());
  for (size_t i = 0; i < y.size(); ++i) EXPECT_DOUBLE_EQ(y[i], y0[i] - 0.5 * x[i]);
}

TEST(CpuVecMath, ExpNonPositiveWithinTwoUlp) {
  std::mt19937 rng(31);
  std::uniform_real_distribution<float> dist(-87.3f, 0.f);  // where exp is a normal float
  for (int i = 0; i < 200000; ++i) {
    const float x = i < 1000 ? -float(i) * 1e-3f : dist(rng);
    const double exact = std::exp(double(x));
    const float ulp = std::nextafter(float(exact), 1.f) - float(exact);
    ASSERT_LE(std::abs(double(detail::exp_nonpositive(x)) - exact), 2.0 * ulp) << "x=" << x;
  }
  EXPECT_EQ(detail::exp_nonpositive(0.f), 1.f);
  EXPECT_EQ(detail::exp_nonpositive(-100.f), 0.f);
  EXPECT_EQ(detail::exp_nonpositive(-INFINITY), 0.f);
  EXPECT_TRUE(std::isnan(detail::exp_nonpositive(NAN)));
  EXPECT_TRUE(std::isnan(detail::exp_nonpositive(-NAN)));
}

TEST(CpuVecMath, TanhApproxAbsoluteError) {
  double worst = 0;
  for (int i = -200000; i <= 200000; ++i) {
    const float u = float(i) * 1e-4f;  // [-20, 20]
    worst = std::max(worst, std::abs(double(detail::tanh_approx(u)) - std::tanh(double(u))));
  }
  EXPECT_LE(worst, 3e-7);
  EXPECT_EQ(detail::tanh_approx(INFINITY), 1.f);
  EXPECT_EQ(detail::tanh_approx(-INFINITY), -1.f);
  EXPECT_TRUE(std::isnan(detail::tanh_approx(NAN)));
  EXPECT_TRUE(std::isnan(detail::tanh_approx(-NAN)));
}

TEST(CpuVecMath, LaneSumCoversEveryElement) {
  for (size_t n : {0, 1, 7, 8, 9, 17, 100}) {
    std::vector<double> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = double(i + 1);
    EXPECT_EQ(detail::sum_of(x.data(), n), double(n * (n + 1) / 2)) << "n=" << n;
  }
}

}  // namespace
}  // namespace zshard::cpu
