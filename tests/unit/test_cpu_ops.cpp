// CPU ops other than attention and GEMM: forward against direct references, backward against finite
// differences, float against double. (Attention: test_cpu_attention.cpp; GEMM and the optimizer path:
// test_cpu_math.cpp.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include <zshard/error.h>
#include <zshard/ops.h>
#include <zshard/tensor.h>

#include "kernels/cpu/ops.h"
#include "tests/unit/op_cases.h"

namespace zshard::cpu {
namespace {

using ::testing::HasSubstr;
using test::Arrays;

// A dimension out of range was std::out_of_range from the vector, not the Error every failure is.
TEST(Tensor, ADimensionOutOfRangeIsAnError) {
  const Tensor t = Tensor::zeros({2, 3}, DType::f32, Device::cpu, Category::workspace);
  EXPECT_EQ(t.dim(-1), 3);
  EXPECT_EQ(t.dim(0), 2);
  EXPECT_THROW(t.dim(2), Error);
  EXPECT_THROW(t.dim(-3), Error);
}

TEST(CpuOpsForward, EmbeddingAddsTokenAndPosition) {
  const EmbeddingCase c;
  std::mt19937 rng(3);
  const Arrays<double> in = test::random_inputs(c, rng);
  const std::vector<double> out = c.forward(in);
  for (int b = 0; b < c.B; ++b)
    for (int t = 0; t < c.Tn; ++t)
      for (int k = 0; k < c.C; ++k)
        EXPECT_EQ(out[(size_t(b) * c.Tn + t) * c.C + k],
                  in[0][size_t(c.tokens[b * c.Tn + t]) * c.C + k] + in[1][size_t(t) * c.C + k]);
}

TEST(CpuOpsForward, LayerNormNormalisesRows) {
  const LayerNormCase c;
  std::mt19937 rng(4);
  Arrays<double> in = test::random_inputs(c, rng);
  std::vector<double> mean, rstd;
  const std::vector<double> out = c.forward(in, &mean, &rstd);
  for (int i = 0; i < c.N; ++i) {
    double mu = 0, var = 0;
    for (int k = 0; k < c.C; ++k) mu += in[0][size_t(i) * c.C + k] / c.C;
    for (int k = 0; k < c.C; ++k) var += std::pow(in[0][size_t(i) * c.C + k] - mu, 2) / c.C;  // biased
    EXPECT_NEAR(mean[i], mu, 1e-14);
    EXPECT_NEAR(rstd[i], 1 / std::sqrt(var + kLayerNormEps), 1e-12);
    for (int k = 0; k < c.C; ++k) {
      const double xhat = (in[0][size_t(i) * c.C + k] - mu) / std::sqrt(var + kLayerNormEps);
      EXPECT_NEAR(out[size_t(i) * c.C + k], xhat * in[1][k] + in[2][k], 1e-12);
    }
  }
}

TEST(CpuOpsForward, LinearUsesInOutLayout) {
  for (bool with_bias : {true, false}) {
    const LinearCase c{with_bias};
    std::mt19937 rng(5);
    const Arrays<double> in = test::random_inputs(c, rng);
    const std::vector<double> out = c.forward(in);
    for (int i = 0; i < c.N; ++i) {
      for (int j = 0; j < c.OC; ++j) {
        double expected = with_bias ? in[2][j] : 0.0;
        for (int k = 0; k < c.C; ++k) expected += in[0][size_t(i) * c.C + k] * in[1][size_t(k) * c.OC + j];
        EXPECT_NEAR(out[size_t(i) * c.OC + j], expected, 1e-12);
      }
    }
  }
}

// Through ops:: on the cpu, against the existing ops: linear(inp, W, b) + scale * linear(linear(inp, A), B),
// the adapter's products (and W's, stored out_in) taken as nn.Linear ones, a gemm against the transposed
// (out, in) weight as in Llama's projections. The saved hidden is linear(inp, A).
TEST(CpuOpsForward, LoraLinearIsTheBaseLayerPlusTheScaledAdapter) {
  const auto nn_linear = [](std::vector<double>& y, const std::vector<double>& x, const std::vector<double>& w,
                            int N, int in, int out, double beta) {
    ops::gemm(Device::cpu, false, true, N, out, in, 1.0f, x.data(), in, w.data(), in, float(beta), y.data(), out);
  };
  for (const WeightLayout layout : {WeightLayout::in_out, WeightLayout::out_in})
    for (const bool with_bias : {true, false}) {
      SCOPED_TRACE(testing::Message() << "out_in " << (layout == WeightLayout::out_in) << ", bias " << with_bias);
      const LoraLinearCase c{layout, with_bias};
      std::mt19937 rng(9);
      const Arrays<double> in = test::random_inputs(c, rng);
      const std::vector<double> w = c.weight<double>(), bias = c.bias<double>();
      const double* b = with_bias ? bias.data() : nullptr;
      std::vector<double> out(size_t(c.N) * c.OC), hidden(size_t(c.N) * c.R);
      ops::lora_linear_forward(Device::cpu, out.data(), hidden.data(), in[0].data(), w.data(), b, in[1].data(),
                               in[2].data(), c.N, c.C, c.OC, c.R, float(c.scale), layout);

      std::vector<double> want(out.size()), want_hidden(hidden.size()), adapter(out.size());
      if (layout == WeightLayout::in_out) {
        ops::linear_forward(Device::cpu, want.data(), in[0].data(), w.data(), b, c.N, c.C, c.OC);
      } else {
        for (size_t i = 0; i < want.size(); ++i) want[i] = b ? b[i % size_t(c.OC)] : 0.0;
        nn_linear(want, in[0], w, c.N, c.C, c.OC, 1.0);
      }
      nn_linear(want_hidden, in[0], in[1], c.N, c.C, c.R, 0.0);
      nn_linear(adapter, want_hidden, in[2], c.N, c.R, c.OC, 0.0);
      for (size_t i = 0; i < want.size(); ++i) want[i] += float(c.scale) * adapter[i];
      EXPECT_LE(test::max_rel_diff(hidden, want_hidden), 1e-15) << "saved hidden";
      EXPECT_LE(test::max_rel_diff(out, want), 1e-14) << "out";
    }
}

// W and the bias are frozen: the backward takes no gradient for them (the bias not at all) and writes
// nothing but dinp and the adapter's gradients, its read-only arrays (W, dout, the saved hidden) left bit for
// bit as they were.
TEST(CpuOpsForward, LoraLinearBackwardLeavesTheFrozenLayerAlone) {
  const LoraLinearCase c;
  std::mt19937 rng(11);
  const Arrays<double> in = test::random_inputs(c, rng);
  std::vector<double> hidden;
  c.forward(in, &hidden);
  const std::vector<double> dout = test::random_vector(size_t(c.N) * c.OC, rng), w = c.weight<double>();
  const Arrays<double> before = {in[0], in[1], in[2], hidden, dout, w};
  Arrays<double> grads = test::zeros_like(in);
  lora_linear_backward(grads[0].data(), grads[1].data(), grads[2].data(), dout.data(), in[0].data(), w.data(),
                       in[1].data(), in[2].data(), hidden.data(), c.N, c.C, c.OC, c.R, c.scale, c.layout);
  EXPECT_EQ((Arrays<double>{in[0], in[1], in[2], hidden, dout, w}), before);
}

// The LoRA op's arguments that no array length can check: the rank, the sizes, and the arrays the
// backward cannot do without. Each error names the op and the culprit. A frozen adapter matrix's null
// gradient is no error.
TEST(CpuOpsForward, LoraLinearRejectsBadArguments) {
  const LoraLinearCase c;
  std::mt19937 rng(10);
  Arrays<double> in = test::random_inputs(c, rng);
  const std::vector<double> w = c.weight<double>(), dout(size_t(c.N) * c.OC, 1.0);
  std::vector<double> out(dout.size()), hidden(size_t(c.N) * c.R), dinp(in[0].size()), da(in[1].size()),
      db(in[2].size());
  const auto forward = [&](int N, int R, double* saved) {
    ops::lora_linear_forward<double>(Device::cpu, out.data(), saved, in[0].data(), w.data(), nullptr,
                                     in[1].data(), in[2].data(), N, c.C, c.OC, R, 1.0f, WeightLayout::in_out);
  };
  const auto backward = [&](int R, double* grad_a, double* grad_b) {
    ops::lora_linear_backward(Device::cpu, dinp.data(), grad_a, grad_b, dout.data(), in[0].data(), w.data(),
                              in[1].data(), in[2].data(), hidden.data(), c.N, c.C, c.OC, R, 1.0f,
                              WeightLayout::in_out);
  };
  EXPECT_THAT(test::error_of([&] { forward(c.N, 0, hidden.data()); }),
              HasSubstr("lora_linear_forward: LoRA rank R=0, must be at least 1"));
  EXPECT_THAT(test::error_of([&] { backward(-2, da.data(), db.data()); }),
              HasSubstr("lora_linear_backward: LoRA rank R=-2, must be at least 1"));
  EXPECT_THAT(test::error_of([&] { forward(-1, c.R, hidden.data()); }),
              HasSubstr("lora_linear_forward: negative size N=-1 C=8 OC=6"));
  EXPECT_THAT(test::error_of([&] { forward(c.N, c.R, nullptr); }),
              HasSubstr("lora_linear_forward: lora_hidden (N x R, saved for the backward) is required"));
  EXPECT_THAT(test::error_of([&] {
                ops::lora_linear_backward(Device::cpu, static_cast<double*>(nullptr), da.data(), db.data(),
                                          dout.data(), in[0].data(), w.data(), in[1].data(), in[2].data(),
                                          hidden.data(), c.N, c.C, c.OC, c.R, 1.0f, WeightLayout::in_out);
              }),
              HasSubstr("lora_linear_backward: dinp is required"));
  EXPECT_EQ(test::error_of([&] { backward(c.R, da.data(), db.data()); }), "(no error)");
  // A frozen adapter matrix: its gradient is skipped, the input's is the same.
  std::fill(dinp.begin(), dinp.end(), 0.0);
  backward(c.R, da.data(), db.data());
  const std::vector<double> dinp_once = dinp;
  std::fill(dinp.begin(), dinp.end(), 0.0);
  const std::vector<double> db_full = db;
  backward(c.R, da.data(), nullptr);
  EXPECT_EQ(dinp, dinp_once);
  EXPECT_EQ(db, db_full);
}

TEST(CpuOpsForward, GeluTanhApproximation) {
  // Reference values of 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  const std::vector<double> x = {-3.0, -1.0, 0.0, 0.5, 1.0, 3.0};
  const std::vector<double> expected = {-0.0036373920817729943, -0.15880800939172324, 0.0,
                                        0.34571400982514394, 0.8411919906082768, 2.996362607918227};
  std::vector<double> out(x.size());
  gelu_forward(out.data(), x.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(out[i], expected[i], 1e-13) << "x=" << x[i];
}

TEST(CpuOpsForward, CrossEntropyMatchesLogSumExp) {
  // Large offsets: a naive exp would overflow, so this also checks the max subtraction.
  const int N = 4, V = 7;
  std::mt19937 rng(6);
  std::vector<double> logits = test::random_vector(size_t(N) * V, rng);
  for (int j = 0; j < V; ++j) logits[j] += 1000.0;
  for (int j = 0; j < V; ++j) logits[size_t(V) + j] -= 1000.0;
  const std::vector<int32_t> targets = {1, 6, 0, 3};

  std::vector<double> losses(N);
  const double total = cross_entropy_forward_backward<double>(nullptr, losses.data(), logits.data(),
                                                              targets.data(), N, V, V, 0.0);
  double expected_total = 0;
  for (int i = 0; i < N; ++i) {
    const double* x = logits.data() + size_t(i) * V;
    const double shift = x[0];  // any shift is exact on paper; this one keeps exp finite
    long double sum = 0;
    for (int j = 0; j < V; ++j) sum += std::exp((long double)(x[j] - shift));
    const double expected = double(std::log(sum) + shift - x[targets[i]]);
    EXPECT_NEAR(losses[i], expected, 1e-12 * std::max(1.0, std::abs(expected))) << "row " << i;
    expected_total += expected;
  }
  EXPECT_NEAR(total, expected_total, 1e-11);

  std::vector<float> logits_f(logits.begin(), logits.end()), losses_f(N);
  cross_entropy_forward_backward<float>(nullptr, losses_f.data(), logits_f.data(), targets.data(), N, V, V, 0.f);
  for (float l : losses_f) EXPECT_TRUE(std::isfinite(l));
}

TEST(CpuOpsForward, CrossEntropyGradientMayAliasLogits) {
  const CrossEntropyCase c;
  const double dloss = 0.25;
  std::mt19937 rng(7);
  std::vector<double> logits = test::random_vector(size_t(c.N) * c.V, rng);
  std::vector<double> dlogits(logits.size(), 123.0), losses(c.N), losses_aliased(c.N);
  const double total = cross_entropy_forward_backward(dlogits.data(), losses.data(), logits.data(),
                                                      c.targets.data(), c.N, c.V, c.V, dloss);
  // SET, not accumulated: the 123 is gone, each row sums to 0.
  for (int i = 0; i < c.N; ++i) {
    double row = 0;
    for (int j = 0; j < c.V; ++j) row += dlogits[size_t(i) * c.V + j];
    EXPECT_NEAR(row, 0.0, 1e-15);
  }
  const double total_aliased = cross_entropy_forward_backward(logits.data(), losses_aliased.data(),
                                                              logits.data(), c.targets.data(), c.N, c.V, c.V,
                                                              dloss);
  EXPECT_EQ(total_aliased, total);
  EXPECT_EQ(losses_aliased, losses);
  EXPECT_EQ(logits, dlogits);
}

TEST(CpuOpsForward, CrossEntropyRejectsBadTarget) {
  const std::vector<double> logits(6, 0.0);
  std::vector<double> losses(2);
  const std::vector<int32_t> targets = {1, 3};
  EXPECT_THROW(cross_entropy_forward_backward<double>(nullptr, losses.data(), logits.data(), targets.data(), 2,
                                                      3, 3, 1.0),
               Error);
}

// Rows ld > V apart, as the GPT-2 logits are: the same results as packed rows, and the padding columns
// are neither read (NaN there would spread) nor written.
TEST(CpuOpsForward, CrossEntropyRowStrideSkipsPadding) {
  const CrossEntropyCase c;
  const int ld = c.V + 3;
  std::mt19937 rng(8);
  const std::vector<double> packed = test::random_vector(size_t(c.N) * c.V, rng);
  std::vector<double> strided(size_t(c.N) * ld, std::nan(""));
  for (int i = 0; i < c.N; ++i)
    std::copy_n(packed.begin() + size_t(i) * c.V, c.V, strided.begin() + size_t(i) * ld);
  std::vector<double> d_packed(packed.size()), losses_packed(c.N), losses_strided(c.N);
  const double want = cross_entropy_forward_backward(d_packed.data(), losses_packed.data(), packed.data(),
                                                     c.targets.data(), c.N, c.V, c.V, 0.5);
  const double got = cross_entropy_forward_backward(strided.data(), losses_strided.data(), strided.data(),
                                                    c.targets.data(), c.N, c.V, ld, 0.5);
  EXPECT_EQ(got, want);
  EXPECT_EQ(losses_strided, losses_packed);
  for (int i = 0; i < c.N; ++i)
    for (int j = 0; j < ld; ++j) {
      const double x = strided[size_t(i) * ld + j];
      if (j < c.V) EXPECT_EQ(x, d_packed[size_t(i) * c.V + j]) << i << "," << j;
      else EXPECT_TRUE(std::isnan(x)) << "padding written at " << i << "," << j;
    }
  EXPECT_THROW(cross_entropy_forward_backward<double>(nullptr, losses_strided.data(), strided.data(),
                                                      c.targets.data(), c.N, c.V, c.V - 1, 1.0),
               Error);
}

}  // namespace
}  // namespace zshard::cpu
