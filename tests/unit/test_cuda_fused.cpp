// The fused ops on the GPU (<zshard/ops.h>'s linear_epilogue_*, the norms with the residual add, SwiGLU's
// backward setting its gradients) against the CPU's in fp32, on random inputs. The linear layers at sizes
// whose rows are multiples of 8 run cuBLASLt's epilogues; at odd sizes the plain GEMM and the separate
// kernels that stand in for them. A gradient the op sets starts from stale values, which must not survive;
// those it adds to start from random ones. Without a GPU every test skips.
//
// Tolerances: tests/support/cuda_arrays.h, but for what passes through a GELU computed by cuBLASLt in fp32,
// held to kGeluEpilogueTolerance: cuBLASLt may take its tanh from the hardware's approximation (relative
// error about 2^-11) where the CPU and the separate kernel use an accurate one. An index or layout bug
// still gives O(1).
#include <gtest/gtest.h>

#ifdef ZSHARD_WITH_CUDA
#include <random>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.cuh"
#include "tests/support/cuda_arrays.h"
#include "tests/support/gpu_test.h"

namespace zshard::cuda {
namespace {

using namespace arrays;

constexpr double kGeluEpilogueTolerance = 1e-3;
template <class T>
constexpr double gelu_tolerance() {
  return std::is_same_v<T, float> ? kGeluEpilogueTolerance : kBf16Tolerance;
}

constexpr float kStale = 7.f;  // what a set gradient holds before the op

// The GEMMs a check must have run with cuBLASLt's epilogues (epilogue_gemms), where its sizes allow them.
void expect_epilogue_gemms(size_t before, size_t want, const char* which) {
  EXPECT_EQ(epilogue_gemms() - before, want) << "cuBLASLt ran the epilogues of " << which << " for "
                                             << epilogue_gemms() - before << " GEMMs of " << want;
}

// One linear layer with its epilogues (bias or none) and its backward; frozen bit 0: dweight, bit 1: dbias.
// `epilogues`: the sizes allow cuBLASLt's epilogues, which must run (the forward's and the bias gradient's).
template <class T>
void check_linear_epilogue(int N, int C, int OC, bool with_bias, FrozenGrads frozen = 0, bool epilogues = false) {
  std::mt19937 rng(21);
  const Vec inp = random_vec<T>(size_t(N) * C, rng), w = random_vec<T>(size_t(C) * OC, rng);
  const Vec bias = random_vec<T>(OC, rng), dout = random_vec<T>(size_t(N) * OC, rng);
  Vec dw = random_vec<T>(w.size(), rng), db = random_vec<T>(OC, rng), out(dout.size());
  Vec dinp(inp.size(), kStale);
  DeviceArray<T> d_inp(inp), d_w(w), d_bias(bias), d_dout(dout), d_out(zeros(out.size())), d_dinp(dinp), d_dw(dw),
      d_db(db);
  const size_t before = epilogue_gemms();
  linear_epilogue_forward(d_out.get(), static_cast<T*>(nullptr), d_inp.get(), d_w.get(),
                          with_bias ? d_bias.get() : nullptr, N, C, OC);
  linear_epilogue_backward(d_dinp.get(), unless_frozen(frozen, 0, d_dw),
                           with_bias ? unless_frozen(frozen, 1, d_db) : nullptr, static_cast<T*>(nullptr),
                           d_dout.get(), d_inp.get(), static_cast<const T*>(nullptr), d_w.get(), N, C, OC);
  if (epilogues) expect_epilogue_gemms(before, with_bias && frozen == 0 ? 2 : 1, "the linear layer");
  cpu::linear_epilogue_forward(out.data(), static_cast<float*>(nullptr), inp.data(), w.data(),
                               with_bias ? bias.data() : nullptr, N, C, OC);
  cpu::linear_epilogue_backward(dinp.data(), dw.data(), with_bias ? db.data() : nullptr, static_cast<float*>(nullptr),
                                dout.data(), inp.data(), static_cast<const float*>(nullptr), w.data(), N, C, OC);
  expect_close(d_out.host(), out, tolerance<T>(), "out");
  expect_close(d_dinp.host(), dinp, tolerance<T>(), "dinp");
  expect_close_unless_frozen(frozen, 0, d_dw.host(), dw, tolerance<T>(), "dweight");
  expect_close_unless_frozen(frozen, 1, d_db.host(), db, tolerance<T>(), "dbias");
}

// GPT-2's MLP: h = gelu(pre), pre = x @ W1 + b1, out = h @ W2 + b2; the second layer's backward goes through
// the GELU and takes b1's gradient. Frozen bit 0: dW2, bit 1: db1 (the pre-activation's bias gradient).
// `epilogues`: as check_linear_epilogue's.
template <class T>
void check_gelu_mlp(int N, int C, int H, FrozenGrads frozen = 0, bool epilogues = false) {
  const int OC = C;
  std::mt19937 rng(22);
  const Vec x = random_vec<T>(size_t(N) * C, rng), w1 = random_vec<T>(size_t(C) * H, rng, -0.5f, 0.5f);
  const Vec b1 = random_vec<T>(H, rng), w2 = random_vec<T>(size_t(H) * OC, rng), b2 = random_vec<T>(OC, rng);
  const Vec dout = random_vec<T>(size_t(N) * OC, rng);
  Vec dw1 = random_vec<T>(w1.size(), rng), db1 = random_vec<T>(H, rng), dw2 = random_vec<T>(w2.size(), rng);
  Vec db2 = random_vec<T>(OC, rng), dpre(size_t(N) * H, kStale), dx(x.size(), kStale);
  DeviceArray<T> d_x(x), d_w1(w1), d_b1(b1), d_w2(w2), d_b2(b2), d_dout(dout), d_pre(zeros(dpre.size())),
      d_h(zeros(dpre.size())), d_out(zeros(dout.size())), d_dpre(dpre), d_dx(dx), d_dw1(dw1), d_db1(db1),
      d_dw2(dw2), d_db2(db2);
  const size_t before = epilogue_gemms();
  linear_epilogue_forward(d_h.get(), d_pre.get(), d_x.get(), d_w1.get(), d_b1.get(), N, C, H);
  linear_epilogue_forward(d_out.get(), static_cast<T*>(nullptr), d_h.get(), d_w2.get(), d_b2.get(), N, H, OC);
  linear_epilogue_backward(d_dpre.get(), unless_frozen(frozen, 0, d_dw2), d_db2.get(), unless_frozen(frozen, 1, d_db1),
                           d_dout.get(), d_h.get(), d_pre.get(), d_w2.get(), N, H, OC);
  linear_epilogue_backward(d_dx.get(), d_dw1.get(), static_cast<T*>(nullptr), static_cast<T*>(nullptr), d_dpre.get(),
                           d_x.get(), static_cast<const T*>(nullptr), d_w1.get(), N, C, H);
  // Both forwards, the GELU's backward and, with dW2, b2's gradient from its GEMM.
  if (epilogues) expect_epilogue_gemms(before, frozen & 1 ? 3 : 4, "the MLP");
  Vec pre(dpre.size()), h(dpre.size()), out(dout.size());
  cpu::linear_epilogue_forward(h.data(), pre.data(), x.data(), w1.data(), b1.data(), N, C, H);
  cpu::linear_epilogue_forward(out.data(), static_cast<float*>(nullptr), h.data(), w2.data(), b2.data(), N, H, OC);
  cpu::linear_epilogue_backward(dpre.data(), dw2.data(), db2.data(), db1.data(), dout.data(), h.data(), pre.data(),
                                w2.data(), N, H, OC);
  cpu::linear_epilogue_backward(dx.data(), dw1.data(), static_cast<float*>(nullptr), static_cast<float*>(nullptr),
                                dpre.data(), x.data(), static_cast<const float*>(nullptr), w1.data(), N, C, H);
  expect_close(d_pre.host(), pre, tolerance<T>(), "pre-activation");
  expect_close(d_h.host(), h, gelu_tolerance<T>(), "GELU output");
  expect_close(d_out.host(), out, gelu_tolerance<T>(), "out");
  expect_close(d_dpre.host(), dpre, gelu_tolerance<T>(), "pre-activation gradient");
  expect_close(d_dx.host(), dx, gelu_tolerance<T>(), "input gradient");
  expect_close(d_dw1.host(), dw1, gelu_tolerance<T>(), "dW1");
  expect_close_unless_frozen(frozen, 1, d_db1.host(), db1, gelu_tolerance<T>(), "db1");
  expect_close_unless_frozen(frozen, 0, d_dw2.host(), dw2, gelu_tolerance<T>(), "dW2");
  expect_close(d_db2.host(), db2, tolerance<T>(), "db2");
}

// N over 256 rows for several row chunks; C not a multiple of the warp size.
template <class T, bool kRms>
void check_norm_residual(int N, int C) {
  std::mt19937 rng(23);
  const Vec a = random_vec<T>(size_t(N) * C, rng), b = random_vec<T>(a.size(), rng);
  const Vec w = random_vec<T>(C, rng), bias = random_vec<T>(C, rng);
  DeviceArray<T> d_a(a), d_b(b), d_w(w), d_bias(bias), d_res(zeros(a.size())), d_out(zeros(a.size()));
  DeviceArray<float> d_mean(zeros(N)), d_rstd(zeros(N));
  Vec res(a.size()), out(a.size()), mean(N), rstd(N);
  if constexpr (kRms) {
    rmsnorm_residual_forward(d_res.get(), d_out.get(), d_rstd.get(), d_a.get(), d_b.get(), d_w.get(), N, C, 1e-5f);
    cpu::rmsnorm_residual_forward(res.data(), out.data(), rstd.data(), a.data(), b.data(), w.data(), N, C, 1e-5f);
  } else {
    layernorm_residual_forward(d_res.get(), d_out.get(), d_mean.get(), d_rstd.get(), d_a.get(), d_b.get(), d_w.get(),
                               d_bias.get(), N, C);
    cpu::layernorm_residual_forward(res.data(), out.data(), mean.data(), rstd.data(), a.data(), b.data(), w.data(),
                                    bias.data(), N, C);
    expect_close(d_mean.host(), mean, tolerance<T>(), "mean");
  }
  expect_close(d_res.host(), res, tolerance<T>(), "residual");
  expect_close(d_out.host(), out, tolerance<T>(), "out");
  expect_close(d_rstd.host(), rstd, tolerance<T>(), "rstd");
}

template <class T>
void check_swiglu_set() {
  const size_t n = 3001;
  std::mt19937 rng(24);
  const Vec gate = random_vec<T>(n, rng, -10.f, 10.f), up = random_vec<T>(n, rng), dout = random_vec<T>(n, rng);
  Vec dgate(n, kStale), dup(n, kStale);
  DeviceArray<T> d_gate(gate), d_up(up), d_dout(dout), d_dgate(dgate), d_dup(dup);
  swiglu_backward(d_dgate.get(), d_dup.get(), d_dout.get(), d_gate.get(), d_up.get(), n, ops::InputGrad::set);
  cpu::swiglu_backward(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), n, ops::InputGrad::set);
  expect_close(d_dgate.host(), dgate, tolerance<T>(), "dgate");
  expect_close(d_dup.host(), dup, tolerance<T>(), "dup");
}

TEST(CudaFused, LinearEpilogue) {
  ZS_REQUIRE_GPU();
  for (const bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "bias" : "no bias");
    check_linear_epilogue<float>(600, 64, 96, with_bias, 0, true);  // cuBLASLt's epilogues
    check_linear_epilogue<bf16>(600, 64, 96, with_bias, 0, true);
    check_linear_epilogue<float>(9, 13, 7, with_bias);  // odd sizes
    check_linear_epilogue<bf16>(9, 13, 7, with_bias);
  }
}

TEST(CudaFused, LinearEpilogueFrozen) {
  ZS_REQUIRE_GPU();
  for (const FrozenGrads frozen : {1u, 3u}) {
    SCOPED_TRACE(frozen);
    check_linear_epilogue<float>(600, 64, 96, true, frozen, true);
    check_linear_epilogue<bf16>(9, 13, 7, true, frozen);
  }
}

TEST(CudaFused, GeluMlp) {
  ZS_REQUIRE_GPU();
  check_gelu_mlp<float>(600, 64, 256, 0, true);  // cuBLASLt's GELU and its derivative with b1's gradient
  check_gelu_mlp<bf16>(600, 64, 256, 0, true);
  check_gelu_mlp<float>(9, 12, 20);  // rows of 20: no epilogue, the separate kernels
  check_gelu_mlp<bf16>(9, 12, 20);
}

TEST(CudaFused, GeluMlpFrozen) {
  ZS_REQUIRE_GPU();
  for (const FrozenGrads frozen : {1u, 2u, 3u}) {
    SCOPED_TRACE(frozen);
    check_gelu_mlp<float>(600, 64, 256, frozen, true);
    check_gelu_mlp<bf16>(9, 12, 20, frozen);
  }
}

TEST(CudaFused, LayerNormResidual) {
  ZS_REQUIRE_GPU();
  check_norm_residual<float, false>(600, 70);
  check_norm_residual<bf16, false>(600, 70);
}

TEST(CudaFused, RmsNormResidual) {
  ZS_REQUIRE_GPU();
  check_norm_residual<float, true>(600, 70);
  check_norm_residual<bf16, true>(600, 70);
}

TEST(CudaFused, SwiGluSet) {
  ZS_REQUIRE_GPU();
  check_swiglu_set<float>();
  check_swiglu_set<bf16>();
}

}  // namespace
}  // namespace zshard::cuda

#else

TEST(CudaFused, SkippedWithoutCudaBuild) { GTEST_SKIP() << "built without ZSHARD_WITH_CUDA"; }

#endif
