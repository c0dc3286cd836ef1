// Causal multi-head attention: forward against a direct loop implementation, causality, backward against
// finite differences, float against double, the fused form against the blocks form. Sequences longer than
// 64 cross the kernel's row blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/ops.h"
#include "tests/unit/op_cases.h"

namespace zshard::cpu {
namespace {

using test::Arrays;

// Scores, causal softmax and weighted sum written out element by element.
void reference_attention(const AttentionCase& c, const std::vector<double>& qkv, std::vector<double>& out,
                         std::vector<double>& att) {
  const int hs = c.C / c.NH;
  out.assign(size_t(c.B) * c.Tn * c.C, 0.0);
  att.assign(size_t(c.B) * c.NH * c.Tn * c.Tn, 0.0);
  const auto at = [&](int b, int t, int part, int h, int d) {
    return qkv[(size_t(b) * c.Tn + t) * 3 * c.C + size_t(part) * c.C + size_t(h) * hs + d];
  };
  for (int b = 0; b < c.B; ++b) {
    for (int h = 0; h < c.NH; ++h) {
      for (int t = 0; t < c.Tn; ++t) {
        double* p = att.data() + ((size_t(b) * c.NH + h) * c.Tn + t) * c.Tn;
        double mx = -INFINITY;
        for (int s = 0; s <= t; ++s) {
          for (int d = 0; d < hs; ++d) p[s] += at(b, t, 0, h, d) * at(b, s, 1, h, d);
          p[s] /= std::sqrt(double(hs));
          mx = std::max(mx, p[s]);
        }
        double sum = 0;
        for (int s = 0; s <= t; ++s) sum += (p[s] = std::exp(p[s] - mx));
        for (int s = 0; s <= t; ++s) p[s] /= sum;
        for (int d = 0; d < hs; ++d) {
          double acc = 0;
          for (int s = 0; s <= t; ++s) acc += p[s] * at(b, s, 2, h, d);
          out[(size_t(b) * c.Tn + t) * c.C + size_t(h) * hs + d] = acc;
        }
      }
    }
  }
}

TEST(CpuAttention, ForwardMatchesReference) {
  for (const AttentionCase& c : {AttentionCase{}, AttentionCase{1, 130, 16, 2}}) {
    std::mt19937 rng(11);
    const Arrays<double> in = test::random_inputs(c, rng);
    std::vector<double> att, ref_out, ref_att;
    const std::vector<double> out = c.forward(in, &att);
    reference_attention(c, in[0], ref_out, ref_att);
    EXPECT_LE(test::max_rel_diff(out, ref_out), 1e-13) << "T=" << c.Tn;
    // Includes the exact zeros above the diagonal (the buffer was filled with -1).
    EXPECT_LE(test::max_rel_diff(att, ref_att), 1e-13) << "T=" << c.Tn;
    for (size_t r = 0; r < size_t(c.B) * c.NH * c.Tn; ++r)
      for (int s = int(r % c.Tn) + 1; s < c.Tn; ++s) ASSERT_EQ(att[r * c.Tn + s], 0.0);
  }
}

// Changing token t0's q, k and v changes no earlier output, and no gradient from an earlier output reaches
// qkv at t0 or later: blocks and fused alike.
template <class Case>
void expect_causal(const Case& c) {
  const int C3 = 3 * c.C;
  std::mt19937 rng(12);
  const Arrays<double> in = test::random_inputs(c, rng);
  const std::vector<double> out = c.forward(in);
  for (int t0 : {1, 3, 64, 69}) {
    // Forward: changing token t0's q, k and v leaves every earlier output unchanged, bit for bit.
    Arrays<double> changed = in;
    for (int b = 0; b < c.B; ++b)
      for (int j = 0; j < C3; ++j) changed[0][(size_t(b) * c.Tn + t0) * C3 + j] += 10.0 + j;
    const std::vector<double> out_changed = c.forward(changed);
    for (int b = 0; b < c.B; ++b)
      for (int t = 0; t < c.Tn; ++t)
        for (int k = 0; k < c.C; ++k) {
          const size_t i = (size_t(b) * c.Tn + t) * c.C + k;
          if (t < t0) {
            ASSERT_EQ(out_changed[i], out[i]) << "t0=" << t0 << " t=" << t;
          } else if (t == t0 && k == 0) {
            EXPECT_NE(out_changed[i], out[i]);
          }
        }

    // Backward: gradients from outputs before t0 never reach qkv at t0 or later.
    std::vector<double> dout = test::random_vector(out.size(), rng);
    for (int b = 0; b < c.B; ++b)
      std::fill(dout.begin() + (size_t(b) * c.Tn + t0) * c.C, dout.begin() + size_t(b + 1) * c.Tn * c.C, 0.0);
    Arrays<double> grads = test::zeros_like(in);
    c.backward(in, dout, grads);
    for (int b = 0; b < c.B; ++b)
      for (int t = t0; t < c.Tn; ++t)
        for (int j = 0; j < C3; ++j) ASSERT_EQ(grads[0][(size_t(b) * c.Tn + t) * C3 + j], 0.0);
  }
}


TEST(CpuAttention, IsCausal) { expect_causal(AttentionCase{2, 70, 8, 2}); }
TEST(CpuAttention, FusedIsCausal) { expect_causal(FusedAttentionCase{2, 70, 8, 2}); }

// The fused form against the blocks form on the same inputs: its statistics are the log-sum-exp of the
// reference's scaled scores, its output and gradients the blocks' but for rounding (double to 1e-12, float
// to 1e-5: the probabilities recomputed from the statistics, and dO . O for sum(P dP)).
template <class T>
void expect_fused_matches_blocks(const AttentionCase& blocks, double tol) {
  const FusedAttentionCase fused{blocks.B, blocks.Tn, blocks.C, blocks.NH};
  std::mt19937 rng(13);
  const Arrays<double> in64 = test::random_inputs(blocks, rng);
  const Arrays<T> in = test::convert<T>(in64);
  std::vector<Compute<T>> lse;
  const std::vector<T> out_fused = fused.forward(in, &lse), out_blocks = blocks.forward(in);
  EXPECT_LE(test::max_rel_diff(test::convert<double>(out_fused), test::convert<double>(out_blocks)), tol);
  const int hs = blocks.C / blocks.NH, C3 = 3 * blocks.C;
  for (int b = 0; b < blocks.B; ++b)
    for (int h = 0; h < blocks.NH; ++h)
      for (int t = 0; t < blocks.Tn; ++t) {
        double mx = -INFINITY;
        std::vector<double> scores;
        for (int s = 0; s <= t; ++s) {
          double dot = 0;
          for (int d = 0; d < hs; ++d)
            dot += in64[0][(size_t(b) * blocks.Tn + t) * C3 + size_t(h) * hs + d] *
                   in64[0][(size_t(b) * blocks.Tn + s) * C3 + blocks.C + size_t(h) * hs + d];
          scores.push_back(dot / std::sqrt(double(hs)));
          mx = std::max(mx, scores.back());
        }
        double sum = 0;
        for (double x : scores) sum += std::exp(x - mx);
        const double want = mx + std::log(sum), got = lse[(size_t(b) * blocks.NH + h) * blocks.Tn + t];
        ASSERT_NEAR(got, want, tol * std::max(1.0, std::abs(want))) << "b " << b << " h " << h << " t " << t;
      }
  const std::vector<T> dout = test::convert<T>(test::random_vector(out_blocks.size(), rng));
  Arrays<T> g_fused = test::zeros_like(in), g_blocks = test::zeros_like(in);
  fused.backward(in, dout, g_fused);
  blocks.backward(in, dout, g_blocks);
  EXPECT_LE(test::max_rel_diff(test::convert<double>(g_fused[0]), test::convert<double>(g_blocks[0])), tol);
}

TEST(CpuAttention, FusedMatchesBlocks) {
  for (const AttentionCase& c : {AttentionCase{}, AttentionCase{2, 70, 8, 2}, AttentionCase{1, 130, 16, 2}}) {
    SCOPED_TRACE(testing::Message() << "T=" << c.Tn);
    expect_fused_matches_blocks<double>(c, 1e-12);
    expect_fused_matches_blocks<float>(c, 1e-5);
  }
}

}  // namespace
}  // namespace zshard::cpu
