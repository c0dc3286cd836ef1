// The CPU ops Llama added (RMSNorm, rotary embedding, grouped-query packing, SwiGLU, an embedding without
// positions): backward against finite differences in double, float against double, and the forwards
// against direct formulas. Odd sizes throughout.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <cstdint>
#include <vector>

#include "kernels/cpu/ops.h"
#include "tests/unit/op_cases.h"

namespace zshard::cpu {
namespace {

using test::Arrays;

// Rotation of each (i, i + HS/2) pair as the complex product (a + ib) * e^(i t theta^(-2i/HS)).
TEST(CpuLlamaOpsForward, RopeIsAComplexRotation) {
  const int Tn = 9, HS = 8;
  std::vector<double> x(size_t(Tn) * HS);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.7 * double(i)) + 0.1;
  std::vector<double> got = x;
  rope_forward(got.data(), 1, Tn, 1, HS, {10000});
  for (int t = 0; t < Tn; ++t)
    for (int i = 0; i < HS / 2; ++i) {
      const std::complex<double> z(x[t * HS + i], x[t * HS + i + HS / 2]);
      const std::complex<double> r = z * std::polar(1.0, t * std::pow(10000.0, -2.0 * i / HS));
      EXPECT_NEAR(got[t * HS + i], r.real(), 1e-12);
      EXPECT_NEAR(got[t * HS + i + HS / 2], r.imag(), 1e-12);
    }
}

// Llama 3.2-1B's rescaled frequencies (theta 500000, factor 32, low 1, high 4, original context 8192) at
// head size 64: the angle of position 1, against Hugging Face's llama3 rule evaluated on its own in float64.
// Pair 14 is kept (its wavelength 1956 is under 8192 / 4), 16 interpolated (4443), 18 and 31 stretched.
TEST(CpuLlamaOpsForward, RopeScaledAsLlama3) {
  const int HS = 64, half = HS / 2;
  const std::vector<std::pair<int, double>> expected = {
      {0, 1.0}, {14, 0.003211445994752591}, {16, 0.00042955679655936815}, {18, 1.9461638184831125e-05},
      {31, 9.41830672543491e-08}};
  std::vector<double> x(2 * HS, 0.0);
  for (int i = 0; i < half; ++i) x[HS + i] = 1;  // position 1: each pair (1, 0), turned to (cos, sin)
  rope_forward(x.data(), 1, 2, 1, HS, {500000, {32, 1, 4, 8192}});
  for (const auto& [i, f] : expected)
    EXPECT_NEAR(std::atan2(x[HS + i + half], x[HS + i]), f, 1e-12 * f) << "pair " << i;
}

TEST(CpuLlamaOpsForward, RmsNormAndSwigluFormulas) {
  const std::vector<double> x = {1, -2, 3}, w = {0.5, 1, 2};
  std::vector<double> out(3), rstd(1);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), 1, 3, 0.0f);
  const double rms = std::sqrt((1 + 4 + 9) / 3.0);
  for (int c = 0; c < 3; ++c) EXPECT_NEAR(out[c], x[c] / rms * w[c], 1e-14);
  const std::vector<double> gate = {-1, 0, 2}, up = {3, 4, 5};
  swiglu_forward(out.data(), gate.data(), up.data(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(out[i], gate[i] / (1 + std::exp(-gate[i])) * up[i], 1e-14);
}

TEST(CpuLlamaOpsForward, GqaPackRepeatsKvHeads) {
  const int NH = 4, NKV = 2, HS = 1;  // one row
  const std::vector<double> q = {1, 2, 3, 4}, k = {10, 20}, v = {100, 200};
  std::vector<double> qkv(3 * NH);
  gqa_pack(qkv.data(), q.data(), k.data(), v.data(), 1, 1, NH, NKV, HS);
  EXPECT_EQ(qkv, (std::vector<double>{1, 2, 3, 4, 10, 10, 20, 20, 100, 100, 200, 200}));
}

}  // namespace
}  // namespace zshard::cpu
