// The cpu's bf16 ops copy their arrays to fp32 a block at a time (kernels/cpu/bf16_math.h). Each op here
// runs on arrays larger than one block's bound, and gives what the fp32 op gives on whole-array copies,
// rounded once, bit for bit (the GEMM, whose tiles split the sum, within one bf16 step), while the fp32
// copies it holds at once stay within the bound.
#include <gtest/gtest.h>

#include <cstdint>
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/cpu/bf16_math.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"
#include "tests/unit/cpu_op_check.h"

namespace zshard::cpu {
namespace {

constexpr int64_t kBound = int64_t(kOpScratchBytes);

std::vector<bf16> random_bf16(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<bf16> x(n);
  for (bf16& e : x) e = bf16(dist(rng));
  return x;
}

void expect_same_bits(const std::vector<bf16>& got, const std::vector<bf16>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t differing = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i].bits != want[i].bits && differing++ == 0) first = i;
  EXPECT_EQ(differing, 0u) << what << ": first at " << first << " (" << float(got[first]) << " against "
                           << float(want[first]) << ")";
}

// The most workspace bytes live at once while f runs, above those live before it.
int64_t workspace_peak_of(const std::function<void()>& f) {
  Allocator& cpu = Allocator::of(Device::cpu);
  const int64_t before = cpu.stats().live[int(Category::workspace)];
  cpu.reset_peaks();
  f();
  return cpu.stats().peak[int(Category::workspace)] - before;
}

// The bf16 GEMM against sgemm on whole copies, rounded once, for every transpose. Tiles of C sum the same
// products, each in the order sgemm's kernel takes for the element's place in the call: equal bits on some
// CPUs, an fp32 rounding apart on others (OpenBLAS's Zen kernels), which a bf16 rounding may carry to one
// bf16 step: within a bf16 rounding and 2^-20 of the products' typical size. A sum split into depth tiles
// adds its parts in fp32, in another order than sgemm's: within a bf16 rounding and an fp32 summation's
// error, 2^-14 of the typical size. A wrong tile or beta taken twice is off by whole products or a C. beta
// applies once: 0 over a C of NaN, 1, or a fraction. C's padding is neither read nor written.
TEST(CpuBf16Blocks, GemmTilesOfCGiveTheSameSumsAndDepthTilesAlmost) {
  struct Case {
    int M, N, K;
    float beta;
    bool nan_c, tiles_of_c_only;
  };
  for (const Case s : {Case{3000, 5000, 300, 1.f, false, true}, Case{200, 210, 90000, 1.f, false, false},
                       Case{200, 210, 90000, 0.f, true, false}, Case{200, 210, 90000, 0.5f, false, false}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        SCOPED_TRACE(testing::Message() << s.M << "x" << s.N << "x" << s.K << " beta " << s.beta << " ta " << ta
                                        << " tb " << tb);
        const int lda = (ta ? s.M : s.K) + 1, ldb = (tb ? s.K : s.N) + 2, ldc = s.N + 3;
        const std::vector<bf16> A = random_bf16(size_t(ta ? s.K : s.M) * lda, 1),
                                B = random_bf16(size_t(tb ? s.N : s.K) * ldb, 2);
        std::vector<bf16> C = random_bf16(size_t(s.M) * ldc, 3);
        if (s.nan_c) std::fill(C.begin(), C.end(), bf16(std::numeric_limits<float>::quiet_NaN()));
        std::vector<float> want = s.nan_c ? std::vector<float>(C.size(), 0.f) : test::widen(C);
        gemm<float>(ta, tb, s.M, s.N, s.K, 0.5f, test::widen(A).data(), lda, test::widen(B).data(), ldb, s.beta, want.data(),
                    ldc);
        const std::vector<bf16> before = C;
        const int64_t peak = workspace_peak_of(
            [&] { gemm<bf16>(ta, tb, s.M, s.N, s.K, 0.5f, A.data(), lda, B.data(), ldb, s.beta, C.data(), ldc); });
        EXPECT_GT(4 * (int64_t(s.M) * s.K + int64_t(s.K) * s.N + int64_t(s.M) * s.N), kBound);  // more than one tile
        EXPECT_LE(peak, kBound);
        EXPECT_EQ(peak, bf16_gemm_scratch_bytes(s.M, s.N, s.K));  // what a model's workspace_bytes counts
        double squares = 0;
        for (float w : want) squares += double(w) * w;
        const double typical = std::sqrt(squares / double(want.size()));
        for (int i = 0; i < s.M; ++i)
          for (int j = 0; j < ldc; ++j) {
            const size_t at = size_t(i) * ldc + j;
            if (j >= s.N) {
              ASSERT_EQ(C[at].bits, before[at].bits) << "padding written at row " << i;
            } else {
              ASSERT_NEAR(float(C[at]), want[at], std::ldexp(std::abs(want[at]), -8) + std::ldexp(typical, s.tiles_of_c_only ? -20 : -14))
                  << "row " << i << " column " << j;
            }
          }
      }
}

// Rows of logits a block at a time, the gradient in place of their copy: the losses, the gradient and the
// sum in row order are the fp32 op's on the whole copy, and the copies are what the estimator counts.
TEST(CpuBf16Blocks, CrossEntropyRowsInBlocks) {
  const int N = 400, V = 50000, ld = V + 5;
  const std::vector<bf16> logits = random_bf16(size_t(N) * ld, 4, 8.f);
  std::vector<int32_t> targets(N);
  for (int i = 0; i < N; ++i) targets[size_t(i)] = (i * 7919) % V;
  std::vector<float> x = test::widen(logits), losses32(N);
  const double want = cross_entropy_forward_backward<float>(x.data(), losses32.data(), x.data(), targets.data(), N,
                                                            V, ld, 0.25f);
  std::vector<bf16> dlogits = logits, losses(N);
  double total = 0;
  const int64_t peak = workspace_peak_of([&] {
    total = cross_entropy_forward_backward<bf16>(dlogits.data(), losses.data(), dlogits.data(), targets.data(), N, V,
                                                 ld, 0.25f);
  });
  EXPECT_EQ(total, want);
  expect_same_bits(losses, test::convert<bf16>(losses32), "losses");
  expect_same_bits(dlogits, test::convert<bf16>(x), "dlogits");  // columns V..ld left as they were, in both
  EXPECT_GT(int64_t(N) * V * 4, kBound);
  EXPECT_EQ(peak, bf16_cross_entropy_scratch_bytes(N, V));
  EXPECT_LE(peak, kBound + N * 4);
}

// The gain's and bias's gradients summed across the blocks in fp32, row after row, as over the whole.
TEST(CpuBf16Blocks, LayerNormAndRmsNormRowsInBlocks) {
  const int N = 17000, C = 512;
  const size_t n = size_t(N) * C;
  const std::vector<bf16> x = random_bf16(n, 5), w = random_bf16(C, 6), b = random_bf16(C, 7), d = random_bf16(n, 8);
  std::vector<float> mean(N), rstd(N), out32(n);
  layernorm_forward<float>(out32.data(), mean.data(), rstd.data(), test::widen(x).data(), test::widen(w).data(),
                           test::widen(b).data(), N, C);
  std::vector<bf16> out(n);
  std::vector<float> mean16(N), rstd16(N);
  EXPECT_LE(workspace_peak_of([&] {
              layernorm_forward<bf16>(out.data(), mean16.data(), rstd16.data(), x.data(), w.data(), b.data(), N, C);
            }),
            kBound + 2 * C * 4);  // the gain and bias are copied once
  expect_same_bits(out, test::convert<bf16>(out32), "layernorm out");
  EXPECT_EQ(mean16, mean);
  EXPECT_EQ(rstd16, rstd);

  std::vector<bf16> dx = random_bf16(n, 9), dw = random_bf16(C, 10), db = random_bf16(C, 11);
  std::vector<float> dx32 = test::widen(dx), dw32 = test::widen(dw), db32 = test::widen(db);
  layernorm_backward<float>(dx32.data(), dw32.data(), db32.data(), test::widen(d).data(), test::widen(x).data(),
                            test::widen(w).data(), mean.data(), rstd.data(), N, C);
  EXPECT_GT(int64_t(n) * 3 * 4, kBound);
  EXPECT_LE(workspace_peak_of([&] {
              layernorm_backward<bf16>(dx.data(), dw.data(), db.data(), d.data(), x.data(), w.data(), mean.data(),
                                       rstd.data(), N, C);
            }),
            kBound + 3 * C * 4);
  expect_same_bits(dx, test::convert<bf16>(dx32), "layernorm dinp");
  expect_same_bits(dw, test::convert<bf16>(dw32), "layernorm dweight");
  expect_same_bits(db, test::convert<bf16>(db32), "layernorm dbias");

  std::vector<float> rms(N);
  rmsnorm_forward<float>(out32.data(), rms.data(), test::widen(x).data(), test::widen(w).data(), N, C, 1e-5f);
  std::vector<float> rms16(N);
  rmsnorm_forward<bf16>(out.data(), rms16.data(), x.data(), w.data(), N, C, 1e-5f);
  expect_same_bits(out, test::convert<bf16>(out32), "rmsnorm out");
  EXPECT_EQ(rms16, rms);
  dx32 = test::widen(dx), dw32 = test::widen(dw);
  rmsnorm_backward<float>(dx32.data(), dw32.data(), test::widen(d).data(), test::widen(x).data(), test::widen(w).data(),
                          rms.data(), N, C);
  rmsnorm_backward<bf16>(dx.data(), dw.data(), d.data(), x.data(), w.data(), rms.data(), N, C);
  expect_same_bits(dx, test::convert<bf16>(dx32), "rmsnorm dinp");
  expect_same_bits(dw, test::convert<bf16>(dw32), "rmsnorm dweight");
}

TEST(CpuBf16Blocks, ElementwiseOpsInBlocks) {
  const size_t n = 9'000'011;
  const std::vector<bf16> x = random_bf16(n, 12, 4.f), y = random_bf16(n, 13, 4.f), d = random_bf16(n, 14);
  std::vector<float> out32(n);
  std::vector<bf16> out(n);
  gelu_forward<float>(out32.data(), test::widen(x).data(), n);
  EXPECT_LE(workspace_peak_of([&] { gelu_forward<bf16>(out.data(), x.data(), n); }), kBound);
  expect_same_bits(out, test::convert<bf16>(out32), "gelu out");

  std::vector<bf16> dx = random_bf16(n, 15);
  std::vector<float> dx32 = test::widen(dx);
  gelu_backward<float>(dx32.data(), test::widen(x).data(), test::widen(d).data(), n);
  const int64_t gelu_peak = workspace_peak_of([&] { gelu_backward<bf16>(dx.data(), x.data(), d.data(), n); });
  EXPECT_LE(gelu_peak, kBound);
  EXPECT_EQ(gelu_peak, bf16_gelu_backward_scratch_bytes(n));
  expect_same_bits(dx, test::convert<bf16>(dx32), "gelu dinp");

  swiglu_forward<float>(out32.data(), test::widen(x).data(), test::widen(y).data(), n);
  swiglu_forward<bf16>(out.data(), x.data(), y.data(), n);
  expect_same_bits(out, test::convert<bf16>(out32), "swiglu out");
  for (InputGrad mode : {InputGrad::accumulate, InputGrad::set}) {
    std::vector<bf16> dgate = random_bf16(n, 16), dup = random_bf16(n, 17);
    std::vector<float> dgate32 = test::widen(dgate), dup32 = test::widen(dup);
    swiglu_backward<float>(dgate32.data(), dup32.data(), test::widen(d).data(), test::widen(x).data(), test::widen(y).data(), n,
                           mode);
    const int64_t peak = workspace_peak_of(
        [&] { swiglu_backward<bf16>(dgate.data(), dup.data(), d.data(), x.data(), y.data(), n, mode); });
    EXPECT_LE(peak, kBound);
    EXPECT_EQ(peak, bf16_swiglu_backward_scratch_bytes(n));
    expect_same_bits(dgate, test::convert<bf16>(dgate32), "swiglu dgate");
    expect_same_bits(dup, test::convert<bf16>(dup32), "swiglu dup");
  }
}

// Ops whose blocks are whole sequences: a token's rotation depends on its position, attention and the
// statistics it keeps on the sequence.
TEST(CpuBf16Blocks, SequenceOpsInBlocks) {
  {
    const int B = 130, Tn = 256, NH = 8, HS = 64;
    const size_t n = size_t(B) * Tn * NH * HS;
    std::vector<bf16> x = random_bf16(n, 18);
    std::vector<float> x32 = test::widen(x);
    rope_forward<float>(x32.data(), B, Tn, NH, HS, {10000});
    EXPECT_LE(workspace_peak_of([&] { rope_forward<bf16>(x.data(), B, Tn, NH, HS, {10000}); }), kBound);
    expect_same_bits(x, test::convert<bf16>(x32), "rope");
    x32 = test::widen(x);
    rope_backward<float>(x32.data(), B, Tn, NH, HS, {10000});
    rope_backward<bf16>(x.data(), B, Tn, NH, HS, {10000});
    expect_same_bits(x, test::convert<bf16>(x32), "rope backward");
  }
  {
    const int B = 60, Tn = 128, NH = 8, NKV = 2, HS = 64;
    const size_t q = size_t(B) * Tn * NH * HS, kv = size_t(B) * Tn * NKV * HS;
    const std::vector<bf16> dqkv = random_bf16(3 * q, 19);
    std::vector<bf16> dq = random_bf16(q, 20), dk = random_bf16(kv, 21), dv = random_bf16(kv, 22);
    std::vector<float> dq32 = test::widen(dq), dk32 = test::widen(dk), dv32 = test::widen(dv);
    gqa_pack_backward<float>(dq32.data(), dk32.data(), dv32.data(), test::widen(dqkv).data(), B, Tn, NH, NKV, HS);
    EXPECT_LE(workspace_peak_of([&] {
                gqa_pack_backward<bf16>(dq.data(), dk.data(), dv.data(), dqkv.data(), B, Tn, NH, NKV, HS);
              }),
              kBound);
    expect_same_bits(dq, test::convert<bf16>(dq32), "gqa dq");
    expect_same_bits(dk, test::convert<bf16>(dk32), "gqa dk");
    expect_same_bits(dv, test::convert<bf16>(dv32), "gqa dv");
  }
  {
    const int B = 1030, Tn = 64, C = 64, NH = 4;
    const size_t rows = size_t(B) * Tn;
    const std::vector<bf16> qkv = random_bf16(rows * 3 * C, 23), dout = random_bf16(rows * C, 24);
    std::vector<float> out32(rows * C), lse32(size_t(B) * NH * Tn);
    fused_attention_forward<float>(out32.data(), lse32.data(), test::widen(qkv).data(), B, Tn, C, NH);
    std::vector<bf16> out(rows * C);
    std::vector<float> lse(lse32.size());
    EXPECT_LE(workspace_peak_of([&] { fused_attention_forward<bf16>(out.data(), lse.data(), qkv.data(), B, Tn, C, NH); }),
              kBound);
    expect_same_bits(out, test::convert<bf16>(out32), "attention out");
    EXPECT_EQ(lse, lse32);
    std::vector<float> dqkv32(rows * 3 * C);
    fused_attention_backward<float>(dqkv32.data(), test::widen(dout).data(), test::widen(qkv).data(), test::widen(out).data(),
                                    lse.data(), B, Tn, C, NH);
    std::vector<bf16> dqkv(rows * 3 * C);
    EXPECT_GT(int64_t(rows) * 8 * C * 4, kBound);
    const int64_t peak = workspace_peak_of([&] {
      fused_attention_backward<bf16>(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, Tn, C, NH);
    });
    EXPECT_LE(peak, kBound);
    EXPECT_EQ(peak, bf16_fused_attention_backward_scratch_bytes(B, Tn, C));
    expect_same_bits(dqkv, test::convert<bf16>(dqkv32), "attention dqkv");
  }
}

// The fused linear layer as cuBLASLt's epilogues round it (kernels/cpu/linear_epilogues.cpp), written out on
// whole copies: the bias gradients are fp32 column sums over every block, rounded once.
TEST(CpuBf16Blocks, LinearEpiloguesRowsInBlocks) {
  const int N = 13200, C = 256, OC = 1024;
  const std::vector<bf16> x = random_bf16(size_t(N) * C, 25), w = random_bf16(size_t(C) * OC, 26, 0.1f),
                          bias = random_bf16(OC, 27), d = random_bf16(size_t(N) * OC, 28);
  std::vector<float> z(size_t(N) * OC);
  gemm<float>(false, false, N, OC, C, 1.f, test::widen(x).data(), C, test::widen(w).data(), OC, 0.f, z.data(), OC);
  std::vector<float> gelu32(z.size()), pre32(z.size());
  for (size_t i = 0; i < z.size(); ++i) {
    pre32[i] = z[i] + float(bias[i % OC]);
    gelu32[i] = detail::gelu(pre32[i]);
  }
  std::vector<bf16> out(z.size()), pre(z.size());
  const int64_t weight_copy = int64_t(C) * OC * 4;
  EXPECT_LE(workspace_peak_of([&] {
              linear_epilogue_forward<bf16>(out.data(), pre.data(), x.data(), w.data(), bias.data(), N, C, OC);
            }),
            kBound + weight_copy);
  expect_same_bits(out, test::convert<bf16>(gelu32), "out");
  expect_same_bits(pre, test::convert<bf16>(pre32), "pre-activation");

  // Backward from the same pre-activation: the GELU's derivative and the bias gradient of the layer before.
  std::vector<float> g(size_t(N) * C), pre_sums(C, 0.f), sums(OC, 0.f);
  gemm<float>(false, true, N, C, OC, 1.f, test::widen(d).data(), OC, test::widen(w).data(), OC, 0.f, g.data(), C);
  const std::vector<bf16> pre_in = random_bf16(g.size(), 29, 3.f);
  for (size_t i = 0; i < g.size(); ++i) g[i] *= detail::gelu_grad(float(pre_in[i]));
  detail::add_column_sums(pre_sums.data(), g.data(), N, C);
  detail::add_column_sums(sums.data(), test::widen(d).data(), N, OC);
  std::vector<bf16> dinp(g.size()), pre_dbias = random_bf16(C, 30), dbias = random_bf16(OC, 31);
  std::vector<bf16> want_pre_dbias = pre_dbias, want_dbias = dbias;
  for (int c = 0; c < C; ++c) want_pre_dbias[c] = bf16(float(pre_dbias[c]) + float(bf16(pre_sums[c])));
  for (int c = 0; c < OC; ++c) want_dbias[c] = bf16(float(dbias[c]) + float(bf16(sums[c])));
  EXPECT_GT(int64_t(N) * (C + OC) * 4, kBound);
  const int64_t peak = workspace_peak_of([&] {
    linear_epilogue_backward<bf16>(dinp.data(), nullptr, dbias.data(), pre_dbias.data(), d.data(), x.data(),
                                   pre_in.data(), w.data(), N, C, OC);
  });
  EXPECT_LE(peak, kBound + weight_copy);
  EXPECT_LE(peak, bf16_linear_epilogue_scratch_bytes(N, C, OC));  // which counts the weight gradient's GEMM too
  expect_same_bits(dinp, test::convert<bf16>(g), "dinp");
  expect_same_bits(pre_dbias, want_pre_dbias, "pre-activation's bias gradient");
  expect_same_bits(dbias, want_dbias, "bias gradient");
}

}  // namespace
}  // namespace zshard::cpu
