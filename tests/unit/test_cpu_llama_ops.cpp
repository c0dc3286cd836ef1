// The CPU ops Llama added (RMSNorm, rotary embedding, grouped-query packing, SwiGLU, an embedding without
// positions): backward against finite differences in double, float against double, and the forwards
// against direct formulas. Odd sizes throughout.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <cstdint>
#include <vector>

#include "kernels/cpu/ops.h"
#include "tests/unit/cpu_op_check.h"

namespace zshard::cpu {
namespace {

using test::Arrays;

struct RmsNormCase {
  int N = 7, C = 13;
  std::vector<size_t> input_sizes() const { return {size_t(N) * C, size_t(C)}; }
  template <class T>
  std::vector<T> forward(const Arrays<T>& in, std::vector<T>* rstd = nullptr) const {
    std::vector<T> out(size_t(N) * C), rs(N);
    rmsnorm_forward(out.data(), rs.data(), in[0].data(), in[1].data(), N, C, 1e-5f);
    if (rstd) *rstd = rs;
    return out;
  }
  template <class T>
  void backward(const Arrays<T>& in, const std::vector<T>& dout, Arrays<T>& g) const {
    std::vector<T> rstd;
    forward(in, &rstd);
    rmsnorm_backward(g[0].data(), g[1].data(), dout.data(), in[0].data(), in[1].data(), rstd.data(), N, C);
  }
};

// In place: the case copies its input, rotates the copy, and for the backward turns dout back and adds it.
struct RopeCase {
  int B = 2, Tn = 5, NH = 3, HS = 6;
  float theta = 10000;
  std::vector<size_t> input_sizes() const { return {size_t(B) * Tn * NH * HS}; }
  template <class T>
  std::vector<T> forward(const Arrays<T>& in) const {
    std::vector<T> x = in[0];
    rope_forward(x.data(), B, Tn, NH, HS, theta);
    return x;
  }
  template <class T>
  void backward(const Arrays<T>&, const std::vector<T>& dout, Arrays<T>& g) const {
    std::vector<T> d = dout;
    rope_backward(d.data(), B, Tn, NH, HS, theta);
    for (size_t i = 0; i < d.size(); ++i) g[0][i] += d[i];
  }
};

struct GqaPackCase {
  int B = 2, Tn = 3, NH = 6, NKV = 2, HS = 5;
  std::vector<size_t> input_sizes() const {
    const size_t rows = size_t(B) * Tn;
    return {rows * NH * HS, rows * NKV * HS, rows * NKV * HS};
  }
  template <class T>
  std::vector<T> forward(const Arrays<T>& in) const {
    std::vector<T> qkv(size_t(B) * Tn * 3 * NH * HS);
    gqa_pack(qkv.data(), in[0].data(), in[1].data(), in[2].data(), B, Tn, NH, NKV, HS);
    return qkv;
  }
  template <class T>
  void backward(const Arrays<T>&, const std::vector<T>& dout, Arrays<T>& g) const {
    gqa_pack_backward(g[0].data(), g[1].data(), g[2].data(), dout.data(), B, Tn, NH, NKV, HS);
  }
};

struct SwigluCase {
  size_t n = 37;
  std::vector<size_t> input_sizes() const { return {n, n}; }
  template <class T>
  std::vector<T> forward(const Arrays<T>& in) const {
    std::vector<T> out(n);
    swiglu_forward(out.data(), in[0].data(), in[1].data(), n);
    return out;
  }
  template <class T>
  void backward(const Arrays<T>& in, const std::vector<T>& dout, Arrays<T>& g) const {
    swiglu_backward(g[0].data(), g[1].data(), dout.data(), in[0].data(), in[1].data(), n);
  }
};

struct TokenEmbeddingCase {  // no position table
  int B = 2, Tn = 5, C = 7, V = 11;
  std::vector<int32_t> tokens = {3, 7, 3, 0, 10, 7, 7, 1, 3, 5};
  std::vector<size_t> input_sizes() const { return {size_t(V) * C}; }
  template <class T>
  std::vector<T> forward(const Arrays<T>& in) const {
    std::vector<T> out(size_t(B) * Tn * C);
    embedding_forward<T>(out.data(), tokens.data(), in[0].data(), nullptr, B, Tn, C);
    return out;
  }
  template <class T>
  void backward(const Arrays<T>&, const std::vector<T>& dout, Arrays<T>& g) const {
    embedding_backward<T>(g[0].data(), nullptr, dout.data(), tokens.data(), B, Tn, C);
  }
};

TEST(CpuLlamaOpsBackward, RmsNorm) { test::expect_backward_matches_finite_differences(RmsNormCase{}); }
TEST(CpuLlamaOpsBackward, Rope) { test::expect_backward_matches_finite_differences(RopeCase{}); }
TEST(CpuLlamaOpsBackward, GqaPack) { test::expect_backward_matches_finite_differences(GqaPackCase{}); }
TEST(CpuLlamaOpsBackward, Swiglu) { test::expect_backward_matches_finite_differences(SwigluCase{}); }
TEST(CpuLlamaOpsBackward, TokenEmbedding) { test::expect_backward_matches_finite_differences(TokenEmbeddingCase{}); }

TEST(CpuLlamaOpsFloat, RmsNorm) { test::expect_float_matches_double(RmsNormCase{}); }
TEST(CpuLlamaOpsFloat, RmsNormWide) { test::expect_float_matches_double(RmsNormCase{3, 2048}); }
TEST(CpuLlamaOpsFloat, Rope) { test::expect_float_matches_double(RopeCase{}); }
TEST(CpuLlamaOpsFloat, RopeLongContext) { test::expect_float_matches_double(RopeCase{1, 97, 2, 64, 500000}); }
TEST(CpuLlamaOpsFloat, GqaPack) { test::expect_float_matches_double(GqaPackCase{}); }
TEST(CpuLlamaOpsFloat, Swiglu) { test::expect_float_matches_double(SwigluCase{}); }

// Rotation of each (i, i + HS/2) pair as the complex product (a + ib) * e^(i t theta^(-2i/HS)).
TEST(CpuLlamaOpsForward, RopeIsAComplexRotation) {
  const int Tn = 9, HS = 8;
  std::vector<double> x(size_t(Tn) * HS);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.7 * double(i)) + 0.1;
  std::vector<double> got = x;
  rope_forward(got.data(), 1, Tn, 1, HS, 10000.0f);
  for (int t = 0; t < Tn; ++t)
    for (int i = 0; i < HS / 2; ++i) {
      const std::complex<double> z(x[t * HS + i], x[t * HS + i + HS / 2]);
      const std::complex<double> r = z * std::polar(1.0, t * std::pow(10000.0, -2.0 * i / HS));
      EXPECT_NEAR(got[t * HS + i], r.real(), 1e-12);
      EXPECT_NEAR(got[t * HS + i + HS / 2], r.imag(), 1e-12);
    }
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
