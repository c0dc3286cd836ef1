// Every CUDA op against its CPU reference (kernels/cpu) on random inputs. Plain C++: the kernels are
// reached through the zshard::cuda API and data moves with cudaMemcpy. Without a GPU every test skips.
// The tolerances: tests/support/cuda_arrays.h.
#include <gtest/gtest.h>

#ifdef ZSHARD_WITH_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/runtime.h"
#include "tests/support/cuda_arrays.h"
#include "tests/support/gpu_test.h"
#include "tests/support/test_support.h"

namespace zshard::cuda {
namespace {

using namespace arrays;

std::vector<int32_t> random_ints(size_t n, int hi, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> dist(0, hi - 1);
  std::vector<int32_t> x(n);
  for (int32_t& e : x) e = dist(rng);
  return x;
}

// V < B*Tn, so tokens repeat; with V = 3 and B*Tn = 512 each token's dwte row sums ~170 rows of dout.
// Without positions (Llama) wpe and dwpe are null on both sides.
template <class T>
void check_embedding(int B, int Tn, int V, bool positions = true, FrozenGrads frozen = 0) {
  const int C = 40;
  std::mt19937 rng(1);
  const auto tokens = random_ints(size_t(B) * Tn, V, rng);
  const Vec wte = random_vec<T>(size_t(V) * C, rng), wpe = random_vec<T>(size_t(Tn) * C, rng);
  const Vec dout = random_vec<T>(size_t(B) * Tn * C, rng);
  Vec dwte = random_vec<T>(wte.size(), rng), dwpe = random_vec<T>(wpe.size(), rng);  // backward accumulates
  test::DeviceVector<int32_t> d_tokens(tokens);
  DeviceArray<T> d_wte(wte), d_wpe(wpe), d_dout(dout), d_out(zeros(dout.size())), d_dwte(dwte), d_dwpe(dwpe);
  embedding_forward(d_out.get(), d_tokens.get(), d_wte.get(), positions ? d_wpe.get() : nullptr, B, Tn, C);
  embedding_backward(unless_frozen(frozen, 0, d_dwte), positions ? unless_frozen(frozen, 1, d_dwpe) : nullptr,
                     d_dout.get(), d_tokens.get(), B, Tn, C);
  Vec out(dout.size());
  cpu::embedding_forward(out.data(), tokens.data(), wte.data(), positions ? wpe.data() : nullptr, B, Tn, C);
  cpu::embedding_backward(dwte.data(), positions ? dwpe.data() : nullptr, dout.data(), tokens.data(), B, Tn,
                          C);
  expect_close(d_out.host(), out, tolerance<T>(), "out");
  // dwte is summed in fp32 and rounded once, however often a token repeats: within one rounding of the
  // result (half a bf16 ulp, 2^-9, of the largest entry; 1/256 leaves room for the inputs' spread).
  expect_close_unless_frozen(frozen, 0, d_dwte.host(), dwte, std::is_same_v<T, float> ? kF32Tolerance : 1.0 / 256,
                             "dwte");
  // Untouched without positions: still the random values both sides started from.
  expect_close_unless_frozen(frozen, 1, d_dwpe.host(), dwpe, tolerance<T>(), "dwpe");
}

// C is not a multiple of the warp size; N over 256 spreads the parameter-gradient column sums over several
// row chunks (kernels/cuda/column_sums.cuh), the last one partial.
template <class T>
void check_layernorm(int N, int C = 70, FrozenGrads frozen = 0) {
  std::mt19937 rng(2);
  const Vec inp = random_vec<T>(size_t(N) * C, rng), w = random_vec<T>(C, rng), b = random_vec<T>(C, rng);
  const Vec dout = random_vec<T>(inp.size(), rng);
  Vec dinp = random_vec<T>(inp.size(), rng), dw = random_vec<T>(C, rng), db = random_vec<T>(C, rng);
  DeviceArray<T> d_inp(inp), d_w(w), d_b(b), d_dout(dout), d_out(zeros(inp.size())), d_dinp(dinp), d_dw(dw),
      d_db(db);
  DeviceArray<float> d_mean(zeros(N)), d_rstd(zeros(N));  // fp32 whatever T is
  layernorm_forward(d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(), d_w.get(), d_b.get(), N, C);
  layernorm_backward(d_dinp.get(), unless_frozen(frozen, 0, d_dw), unless_frozen(frozen, 1, d_db), d_dout.get(),
                     d_inp.get(), d_w.get(), d_mean.get(), d_rstd.get(), N, C);
  Vec out(inp.size()), mean(N), rstd(N);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
  cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), mean.data(),
                          rstd.data(), N, C);
  expect_close(d_out.host(), out, tolerance<T>(), "out");
  // Computed in fp32 from the same (rounded) inputs and stored unrounded: fp32 agreement for bf16 too.
  expect_close(d_mean.host(), mean, kF32Tolerance, "mean");
  expect_close(d_rstd.host(), rstd, kF32Tolerance, "rstd");
  expect_close(d_dinp.host(), dinp, tolerance<T>(), "dinp");
  expect_close_unless_frozen(frozen, 0, d_dw.host(), dw, tolerance<T>(), "dweight");
  expect_close_unless_frozen(frozen, 1, d_db.host(), db, tolerance<T>(), "dbias");
}

// As LayerNorm: C not a multiple of the warp size, and N over 256 for several row chunks of dweight.
template <class T>
void check_rmsnorm(int N, int C, FrozenGrads frozen = 0) {
  const float eps = 1e-5f;
  std::mt19937 rng(10);
  const Vec inp = random_vec<T>(size_t(N) * C, rng), w = random_vec<T>(C, rng);
  const Vec dout = random_vec<T>(inp.size(), rng);
  Vec dinp = random_vec<T>(inp.size(), rng), dw = random_vec<T>(C, rng);
  DeviceArray<T> d_inp(inp), d_w(w), d_dout(dout), d_out(zeros(inp.size())), d_dinp(dinp), d_dw(dw);
  DeviceArray<float> d_rstd(zeros(N));  // fp32 whatever T is
  rmsnorm_forward(d_out.get(), d_rstd.get(), d_inp.get(), d_w.get(), N, C, eps);
  rmsnorm_backward(d_dinp.get(), unless_frozen(frozen, 0, d_dw), d_dout.get(), d_inp.get(), d_w.get(), d_rstd.get(),
                   N, C);
  Vec out(inp.size()), rstd(N);
  cpu::rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), N, C, eps);
  cpu::rmsnorm_backward(dinp.data(), dw.data(), dout.data(), inp.data(), w.data(), rstd.data(), N, C);
  expect_close(d_out.host(), out, tolerance<T>(), "out");
  expect_close(d_rstd.host(), rstd, kF32Tolerance, "rstd");
  expect_close(d_dinp.host(), dinp, tolerance<T>(), "dinp");
  expect_close_unless_frozen(frozen, 0, d_dw.host(), dw, tolerance<T>(), "dweight");
}

// Forward on one array and backward on another, each in place. The GPU takes its angles in fp64 as the
// CPU does, so a long sequence (angles of hundreds of radians) is held to fp32 agreement too.
template <class T>
void check_rope(int B, int Tn, int NH, int HS, const ops::RopeFrequencies& freq = {}) {
  std::mt19937 rng(11);
  Vec x = random_vec<T>(size_t(B) * Tn * NH * HS, rng), dx = random_vec<T>(x.size(), rng);
  DeviceArray<T> d_x(x), d_dx(dx);
  rope_forward(d_x.get(), B, Tn, NH, HS, freq);
  rope_backward(d_dx.get(), B, Tn, NH, HS, freq);
  cpu::rope_forward(x.data(), B, Tn, NH, HS, freq);
  cpu::rope_backward(dx.data(), B, Tn, NH, HS, freq);
  expect_close(d_x.host(), x, tolerance<T>(), "x");
  expect_close(d_dx.host(), dx, tolerance<T>(), "dx");
}

// The forward copies values, so it is exact for both types; the backward sums each kv head's group.
template <class T>
void check_gqa_pack(int B, int Tn, int NH, int NKV, int HS) {
  std::mt19937 rng(12);
  const size_t rows = size_t(B) * Tn, qn = rows * NH * HS, kn = rows * NKV * HS;
  const Vec q = random_vec<T>(qn, rng), k = random_vec<T>(kn, rng), v = random_vec<T>(kn, rng);
  const Vec dqkv = random_vec<T>(3 * qn, rng);
  Vec dq = random_vec<T>(qn, rng), dk = random_vec<T>(kn, rng), dv = random_vec<T>(kn, rng);
  DeviceArray<T> d_q(q), d_k(k), d_v(v), d_qkv(zeros(3 * qn)), d_dqkv(dqkv), d_dq(dq), d_dk(dk), d_dv(dv);
  gqa_pack(d_qkv.get(), d_q.get(), d_k.get(), d_v.get(), B, Tn, NH, NKV, HS);
  gqa_pack_backward(d_dq.get(), d_dk.get(), d_dv.get(), d_dqkv.get(), B, Tn, NH, NKV, HS);
  Vec qkv(3 * qn);
  cpu::gqa_pack(qkv.data(), q.data(), k.data(), v.data(), B, Tn, NH, NKV, HS);
  cpu::gqa_pack_backward(dq.data(), dk.data(), dv.data(), dqkv.data(), B, Tn, NH, NKV, HS);
  EXPECT_EQ(d_qkv.host(), qkv) << "qkv";
  expect_close(d_dq.host(), dq, tolerance<T>(), "dq");
  expect_close(d_dk.host(), dk, tolerance<T>(), "dk");
  expect_close(d_dv.host(), dv, tolerance<T>(), "dv");
}

// Gates over [-10, 10]: sigmoid near 0 and 1 as well as in between.
template <class T>
void check_swiglu() {
  const size_t n = 3001;
  std::mt19937 rng(13);
  const Vec gate = random_vec<T>(n, rng, -10.f, 10.f), up = random_vec<T>(n, rng);
  const Vec dout = random_vec<T>(n, rng);
  Vec dgate = random_vec<T>(n, rng), dup = random_vec<T>(n, rng);
  DeviceArray<T> d_gate(gate), d_up(up), d_dout(dout), d_out(zeros(n)), d_dgate(dgate), d_dup(dup);
  swiglu_forward(d_out.get(), d_gate.get(), d_up.get(), n);
  swiglu_backward(d_dgate.get(), d_dup.get(), d_dout.get(), d_gate.get(), d_up.get(), n);
  Vec out(n);
  cpu::swiglu_forward(out.data(), gate.data(), up.data(), n);
  cpu::swiglu_backward(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), n);
  expect_close(d_out.host(), out, tolerance<T>(), "out");
  expect_close(d_dgate.host(), dgate, tolerance<T>(), "dgate");
  expect_close(d_dup.host(), dup, tolerance<T>(), "dup");
}

template <class T>
void check_linear(int N, int OC = 33, FrozenGrads frozen = 0) {
  const int C = 20;
  std::mt19937 rng(3);
  const Vec inp = random_vec<T>(size_t(N) * C, rng), w = random_vec<T>(size_t(C) * OC, rng);
  const Vec bias = random_vec<T>(OC, rng), dout = random_vec<T>(size_t(N) * OC, rng);
  Vec dinp = random_vec<T>(inp.size(), rng), dw = random_vec<T>(w.size(), rng), db = random_vec<T>(OC, rng);
  DeviceArray<T> d_inp(inp), d_w(w), d_bias(bias), d_dout(dout), d_out(zeros(dout.size())), d_dinp(dinp),
      d_dw(dw), d_db(db);
  linear_forward(d_out.get(), d_inp.get(), d_w.get(), d_bias.get(), N, C, OC);
  linear_backward(d_dinp.get(), unless_frozen(frozen, 0, d_dw), unless_frozen(frozen, 1, d_db), d_dout.get(),
                  d_inp.get(), d_w.get(), N, C, OC);
  Vec out(dout.size());
  cpu::linear_forward(out.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  cpu::linear_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC);
  expect_close(d_out.host(), out, tolerance<T>(), "out");
  expect_close(d_dinp.host(), dinp, tolerance<T>(), "dinp");
  expect_close_unless_frozen(frozen, 0, d_dw.host(), dw, tolerance<T>(), "dweight");
  expect_close_unless_frozen(frozen, 1, d_db.host(), db, tolerance<T>(), "dbias");
}

// LoRA on a frozen layer against the cpu op in fp32 on the same values: the output, the saved hidden and the
// three gradients, accumulated onto random values. R = 5 leaves the adapter's GEMMs unaligned.
template <class T>
void check_lora_linear(int N, WeightLayout layout, bool with_bias) {
  const int C = 20, OC = 33, R = 5;
  const float scale = 16.f / R;
  std::mt19937 rng(14);
  const Vec inp = random_vec<T>(size_t(N) * C, rng), w = random_vec<T>(size_t(C) * OC, rng);
  const Vec bias = random_vec<T>(OC, rng), a = random_vec<T>(size_t(R) * C, rng);
  const Vec b = random_vec<T>(size_t(OC) * R, rng), dout = random_vec<T>(size_t(N) * OC, rng);
  Vec dinp = random_vec<T>(inp.size(), rng), da = random_vec<T>(a.size(), rng), db = random_vec<T>(b.size(), rng);
  DeviceArray<T> d_inp(inp), d_w(w), d_bias(bias), d_a(a), d_b(b), d_dout(dout), d_out(zeros(dout.size())),
      d_hidden(zeros(size_t(N) * R)), d_dinp(dinp), d_da(da), d_db(db);
  lora_linear_forward(d_out.get(), d_hidden.get(), d_inp.get(), d_w.get(), with_bias ? d_bias.get() : nullptr,
                      d_a.get(), d_b.get(), N, C, OC, R, scale, layout);
  lora_linear_backward(d_dinp.get(), d_da.get(), d_db.get(), d_dout.get(), d_inp.get(), d_w.get(), d_a.get(),
                       d_b.get(), d_hidden.get(), N, C, OC, R, scale, layout);
  Vec out(dout.size()), hidden(size_t(N) * R);
  cpu::lora_linear_forward(out.data(), hidden.data(), inp.data(), w.data(), with_bias ? bias.data() : nullptr,
                           a.data(), b.data(), N, C, OC, R, scale, layout);
  cpu::lora_linear_backward(dinp.data(), da.data(), db.data(), dout.data(), inp.data(), w.data(), a.data(),
                            b.data(), hidden.data(), N, C, OC, R, scale, layout);
  expect_close(d_out.host(), out, tolerance<T>(), "out");
  expect_close(d_hidden.host(), hidden, tolerance<T>(), "hidden");
  expect_close(d_dinp.host(), dinp, tolerance<T>(), "dinp");
  expect_close(d_da.host(), da, tolerance<T>(), "dlora_a");
  expect_close(d_db.host(), db, tolerance<T>(), "dlora_b");
}

// Padded leading dimensions, alpha and beta, either operand transposed: the paths linear does not take.
template <class T>
void check_gemm(bool trans_a, bool trans_b, int M, int N, int K) {
  const int lda = (trans_a ? M : K) + 3, ldb = (trans_b ? K : N) + 2, ldc = N + 1;
  std::mt19937 rng(4);
  const Vec A = random_vec<T>(size_t(trans_a ? K : M) * lda, rng);
  const Vec Bm = random_vec<T>(size_t(trans_b ? N : K) * ldb, rng);
  Vec Cm = random_vec<T>(size_t(M) * ldc, rng);
  DeviceArray<T> d_a(A), d_b(Bm), d_c(Cm);
  const float alpha = 0.5f, beta = -1.5f;
  gemm<T>(trans_a, trans_b, M, N, K, alpha, d_a.get(), lda, d_b.get(), ldb, beta, d_c.get(), ldc);
  cpu::gemm<float>(trans_a, trans_b, M, N, K, alpha, A.data(), lda, Bm.data(), ldb, beta, Cm.data(), ldc);
  expect_close(d_c.host(), Cm, tolerance<T>(), "C");
}

// Extents of 64 and more that are not multiples of 8 are cut into an aligned bulk and a remainder
// (kernels/cuda/linear.cu): each of the eight parts, under every pair of transposes.
template <class T>
void check_gemm_unaligned_extents() {
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      SCOPED_TRACE(testing::Message() << "trans_a " << ta << ", trans_b " << tb);
      check_gemm<T>(ta, tb, 67, 75, 70);
    }
}

template <class T>
void check_attention(int B, int Tn, int C, int NH) {
  std::mt19937 rng(5);
  const Vec qkv = random_vec<T>(size_t(B) * Tn * 3 * C, rng), dout = random_vec<T>(size_t(B) * Tn * C, rng);
  Vec dqkv = random_vec<T>(qkv.size(), rng);
  const size_t att_size = size_t(B) * NH * Tn * Tn;
  DeviceArray<T> d_qkv(qkv), d_dout(dout), d_out(zeros(dout.size())), d_att(zeros(att_size)), d_dqkv(dqkv);
  attention_forward(d_out.get(), d_att.get(), d_qkv.get(), B, Tn, C, NH);
  attention_backward(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_att.get(), B, Tn, C, NH);
  Vec out(dout.size()), att(att_size);
  cpu::attention_forward(out.data(), att.data(), qkv.data(), B, Tn, C, NH);
  cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, Tn, C, NH);
  expect_close(d_out.host(), out, tolerance<T>(), "out");
  expect_close(d_att.host(), att, tolerance<T>(), "att");
  expect_close(d_dqkv.host(), dqkv, tolerance<T>(), "dqkv");
}

template <class T>
void check_elementwise(size_t n = 3001) {
  std::mt19937 rng(6);
  const Vec x = random_vec<T>(n, rng, -5.f, 5.f), y = random_vec<T>(n, rng), dout = random_vec<T>(n, rng);
  Vec dx = random_vec<T>(n, rng), da = random_vec<T>(n, rng), db = random_vec<T>(n, rng);
  Vec acc = random_vec<T>(n, rng);
  DeviceArray<T> d_x(x), d_y(y), d_dout(dout), d_gelu(zeros(n)), d_sum(zeros(n)), d_dx(dx), d_da(da),
      d_db(db), d_acc(acc);
  gelu_forward(d_gelu.get(), d_x.get(), n);
  gelu_backward(d_dx.get(), d_x.get(), d_dout.get(), n);
  residual_forward(d_sum.get(), d_x.get(), d_y.get(), n);
  residual_backward(d_da.get(), d_db.get(), d_dout.get(), n);
  axpy(d_acc.get(), d_y.get(), -0.75f, n);
  Vec gelu(n), sum(n);
  cpu::gelu_forward(gelu.data(), x.data(), n);
  cpu::gelu_backward(dx.data(), x.data(), dout.data(), n);
  cpu::residual_forward(sum.data(), x.data(), y.data(), n);
  cpu::residual_backward(da.data(), db.data(), dout.data(), n);
  cpu::axpy(acc.data(), y.data(), -0.75f, n);
  expect_close(d_gelu.host(), gelu, tolerance<T>(), "gelu");
  expect_close(d_dx.host(), dx, tolerance<T>(), "gelu dinp");
  expect_close(d_sum.host(), sum, tolerance<T>(), "residual");
  expect_close(d_da.host(), da, tolerance<T>(), "residual da");
  expect_close(d_db.host(), db, tolerance<T>(), "residual db");
  expect_close(d_acc.host(), acc, tolerance<T>(), "axpy");
}

// V > the 512 threads of a row's block and not a multiple of a 16-byte pack; rows ld apart, the padding
// compared too (neither side writes it). An ld of V + 12 starts every row 16-byte aligned (packed loads,
// then an element at a time for the tail); V + 3 leaves most rows unaligned (an element at a time).
// With `masked`, some logits are -inf (a masked vocabulary entry), the first element a thread reads among
// them: they add nothing to the row's sum.
template <class T>
void check_cross_entropy(bool in_place, int ld_pad = 12, bool masked = false) {
  const int N = 6, V = 1500, ld = V + ld_pad;
  std::mt19937 rng(7);
  Vec logits = random_vec<T>(size_t(N) * ld, rng, -4.f, 4.f);
  auto targets = random_ints(N, V, rng);
  if (masked)
    for (int r = 0; r < N; ++r) {
      for (const int j : {0, 1, 8, 777, V - 1}) logits[size_t(r) * ld + j] = -INFINITY;
      targets[r] = 100 + r;
    }
  const float dloss = 1.f / N;
  test::DeviceVector<int32_t> d_targets(targets);
  DeviceArray<T> d_logits(logits), d_losses(zeros(N)), d_dlogits(zeros(logits.size()));
  T* dl = in_place ? d_logits.get() : d_dlogits.get();
  const double total = cross_entropy_forward_backward(dl, d_losses.get(), d_logits.get(), d_targets.get(), N,
                                                      V, ld, dloss);
  Vec dlogits = in_place ? logits : zeros(logits.size()), losses(N);
  const double want = cpu::cross_entropy_forward_backward(dlogits.data(), losses.data(), logits.data(),
                                                          targets.data(), N, V, ld, dloss);
  expect_close(d_losses.host(), losses, tolerance<T>(), "losses");
  expect_close(in_place ? d_logits.host() : d_dlogits.host(), dlogits, tolerance<T>(), "dlogits");
  // The sum comes from fp32 row losses whatever T is, so bf16 logits still give an fp32-exact sum.
  EXPECT_NEAR(total, want, kF32Tolerance * std::abs(want)) << "loss sum";
  // Added to a device double instead, without a host wait: the same sum, bit for bit.
  double* d_sum = nullptr;
  ZS_CUDA_CHECK(cudaMalloc(&d_sum, sizeof(double)));
  const double start = 0.5;
  ZS_CUDA_CHECK(cudaMemcpy(d_sum, &start, sizeof start, cudaMemcpyHostToDevice));
  DeviceArray<T> d_logits2(logits);
  EXPECT_EQ(cross_entropy_forward_backward(in_place ? d_logits2.get() : d_dlogits.get(), d_losses.get(),
                                           d_logits2.get(), d_targets.get(), N, V, ld, dloss, d_sum),
            0.0);
  double added = 0;
  ZS_CUDA_CHECK(cudaMemcpy(&added, d_sum, sizeof added, cudaMemcpyDeviceToHost));
  cudaFree(d_sum);
  EXPECT_EQ(added, start + total) << "loss sum added on the device";
}

template <class G>
void check_adamw() {
  const size_t n = 4099;
  std::mt19937 rng(8);
  Vec param = random_vec<float>(n, rng), m = random_vec<float>(n, rng, -0.1f, 0.1f);
  Vec v = random_vec<float>(n, rng, 0.f, 0.1f);
  const Vec grad = random_vec<G>(n, rng);
  const cpu::AdamWParams hp{.lr = 1e-2f, .weight_decay = 0.1f, .step = 3, .grad_scale = 0.5f};
  DeviceArray<float> d_param(param), d_m(m), d_v(v);
  DeviceArray<G> d_grad(grad);
  DeviceArray<bf16> d_copy(zeros(n));
  // The whole array as one decayed segment, scaled by hp.grad_scale read from device memory.
  const ShardSegment all{0, n, true};
  StepScalars scale{.grad_scale = hp.grad_scale};
  scale.settings.adamw = cpu::adamw_factors<float>(hp);
  StepScalars* d_scale = nullptr;
  ZS_CUDA_CHECK(cudaMalloc(&d_scale, sizeof scale));
  ZS_CUDA_CHECK(cudaMemcpy(d_scale, &scale, sizeof scale, cudaMemcpyHostToDevice));
  adamw_step(d_param.get(), d_grad.get(), d_m.get(), d_v.get(), std::span(&all, 1), d_scale, d_copy.get());
  cudaFree(d_scale);
  cpu::adamw_step(param.data(), grad.data(), m.data(), v.data(), n, hp);
  // The same bits as the host's step (the offloaded optimizer's): no operation is fused on either side.
  expect_close(d_param.host(), param, 0, "fp32 master");
  expect_close(d_m.host(), m, 0, "m");
  expect_close(d_v.host(), v, 0, "v");
  // The compute copy is the master rounded once, to nearest even.
  expect_close(d_copy.host(), rounded<bf16>(param), 0, "bf16 copy");
}

template <class T>
void check_sum_squares() {
  const size_t n = 100003;
  std::mt19937 rng(9);
  const Vec x = random_vec<T>(n, rng);
  DeviceArray<T> d_x(x);
  const double want = cpu::sum_squares(x.data(), n);
  // Uneven parts, an empty one among them, in one launch, added to a device double.
  const T* p = d_x.get();
  const std::vector<std::span<const T>> parts{{p, 7}, {p + 7, 0}, {p + 7, n - 1007}, {p + n - 1000, 1000}};
  double *d_sum = nullptr, sum = 0;
  ZS_CUDA_CHECK(cudaMalloc(&d_sum, sizeof sum));
  ZS_CUDA_CHECK(cudaMemset(d_sum, 0, sizeof sum));
  sum_squares<T>(d_sum, parts);
  ZS_CUDA_CHECK(cudaMemcpy(&sum, d_sum, sizeof sum, cudaMemcpyDeviceToHost));
  cudaFree(d_sum);
  // Exact inputs and double accumulation on both sides: only the summation order differs.
  EXPECT_NEAR(sum, want, 1e-12 * want);
}

TEST(CudaOps, Embedding) { ZS_REQUIRE_GPU(); check_embedding<float>(3, 7, 13); }
TEST(CudaOps, EmbeddingBf16) { ZS_REQUIRE_GPU(); check_embedding<bf16>(3, 7, 13); }
TEST(CudaOps, EmbeddingFrequentTokens) { ZS_REQUIRE_GPU(); check_embedding<float>(8, 64, 3); }
TEST(CudaOps, EmbeddingFrequentTokensBf16) { ZS_REQUIRE_GPU(); check_embedding<bf16>(8, 64, 3); }
// More distinct tokens than the dwte kernel's blocks: each block takes several runs in turn.
TEST(CudaOps, EmbeddingManyDistinctTokens) { ZS_REQUIRE_GPU(); check_embedding<float>(4, 1024, 50257); }
TEST(CudaOps, EmbeddingWithoutPositions) { ZS_REQUIRE_GPU(); check_embedding<float>(3, 7, 13, false); }
TEST(CudaOps, EmbeddingWithoutPositionsBf16) { ZS_REQUIRE_GPU(); check_embedding<bf16>(3, 7, 13, false); }
// A frozen table's null gradient: each alone and both, in a many-token batch.
TEST(CudaOps, EmbeddingFrozen) {
  ZS_REQUIRE_GPU();
  for (FrozenGrads frozen : {1u, 2u, 3u}) {
    SCOPED_TRACE(frozen);
    check_embedding<float>(8, 64, 3, true, frozen);
    check_embedding<bf16>(8, 64, 3, true, frozen);
  }
}
// Over several row chunks of the column sums, so that a skipped output is skipped in every chunk.
TEST(CudaOps, LayerNormFrozen) {
  ZS_REQUIRE_GPU();
  for (FrozenGrads frozen : {1u, 2u, 3u}) {
    SCOPED_TRACE(frozen);
    check_layernorm<float>(600, 70, frozen);
    check_layernorm<bf16>(600, 96, frozen);
  }
}
TEST(CudaOps, RmsNormFrozen) {
  ZS_REQUIRE_GPU();
  check_rmsnorm<float>(600, 70, 1);
  check_rmsnorm<bf16>(7, 37, 1);
}
TEST(CudaOps, LinearFrozen) {
  ZS_REQUIRE_GPU();
  for (FrozenGrads frozen : {1u, 3u}) {
    SCOPED_TRACE(frozen);
    check_linear<float>(600, 33, frozen);
    check_linear<bf16>(9, 33, frozen);
  }
}
TEST(CudaOps, LayerNorm) { ZS_REQUIRE_GPU(); check_layernorm<float>(11); }
TEST(CudaOps, LayerNormBf16) { ZS_REQUIRE_GPU(); check_layernorm<bf16>(11); }
TEST(CudaOps, LayerNormManyRows) { ZS_REQUIRE_GPU(); check_layernorm<float>(600); }
TEST(CudaOps, LayerNormManyRowsBf16) { ZS_REQUIRE_GPU(); check_layernorm<bf16>(600); }
// Rows of a multiple of 16 bytes: the packed loads of kernels/cuda/common.cuh.
TEST(CudaOps, LayerNormPackedRows) { ZS_REQUIRE_GPU(); check_layernorm<float>(600, 96); }
TEST(CudaOps, LayerNormPackedRowsBf16) { ZS_REQUIRE_GPU(); check_layernorm<bf16>(600, 96); }
TEST(CudaOps, RmsNorm) { ZS_REQUIRE_GPU(); check_rmsnorm<float>(7, 37); }
TEST(CudaOps, RmsNormBf16) { ZS_REQUIRE_GPU(); check_rmsnorm<bf16>(7, 37); }
TEST(CudaOps, RmsNormManyRows) { ZS_REQUIRE_GPU(); check_rmsnorm<float>(600, 70); }
TEST(CudaOps, RmsNormManyRowsBf16) { ZS_REQUIRE_GPU(); check_rmsnorm<bf16>(600, 70); }
TEST(CudaOps, Rope) { ZS_REQUIRE_GPU(); check_rope<float>(2, 5, 4, 6); }
TEST(CudaOps, RopeBf16) { ZS_REQUIRE_GPU(); check_rope<bf16>(2, 5, 4, 6); }
// 40 heads: two slices of the heads a rope thread turns (kernels/cuda/llama_ops.cu), the second partial.
TEST(CudaOps, RopeLongSequence) { ZS_REQUIRE_GPU(); check_rope<float>(5, 700, 8, 64); }
TEST(CudaOps, RopeLongSequenceBf16) { ZS_REQUIRE_GPU(); check_rope<bf16>(5, 700, 8, 64); }
// Llama 3.2's rescaled frequencies (all three regimes at head size 64): the device's fp64 angles are the CPU's.
TEST(CudaOps, RopeScaled) { ZS_REQUIRE_GPU(); check_rope<float>(2, 300, 4, 64, {500000, {32, 1, 4, 8192}}); }
TEST(CudaOps, GqaPack) { ZS_REQUIRE_GPU(); check_gqa_pack<float>(2, 5, 4, 2, 6); }
TEST(CudaOps, GqaPackBf16) { ZS_REQUIRE_GPU(); check_gqa_pack<bf16>(2, 5, 4, 2, 6); }
TEST(CudaOps, GqaPackOneKvHead) { ZS_REQUIRE_GPU(); check_gqa_pack<float>(2, 5, 6, 1, 7); }
TEST(CudaOps, GqaPackNoSharing) { ZS_REQUIRE_GPU(); check_gqa_pack<float>(2, 5, 3, 3, 7); }
TEST(CudaOps, SwiGlu) { ZS_REQUIRE_GPU(); check_swiglu<float>(); }
TEST(CudaOps, SwiGluBf16) { ZS_REQUIRE_GPU(); check_swiglu<bf16>(); }
TEST(CudaOps, Linear) { ZS_REQUIRE_GPU(); check_linear<float>(9); }
TEST(CudaOps, LinearBf16) { ZS_REQUIRE_GPU(); check_linear<bf16>(9); }
TEST(CudaOps, LinearManyRows) { ZS_REQUIRE_GPU(); check_linear<float>(600); }
TEST(CudaOps, LinearManyRowsBf16) { ZS_REQUIRE_GPU(); check_linear<bf16>(600); }
// Output rows of whole 16-byte packs: the packed bias add.
TEST(CudaOps, LinearPackedBias) { ZS_REQUIRE_GPU(); check_linear<float>(5000, 40); }
TEST(CudaOps, LinearPackedBiasBf16) { ZS_REQUIRE_GPU(); check_linear<bf16>(600, 40); }
TEST(CudaOps, LoraLinear) { ZS_REQUIRE_GPU(); check_lora_linear<float>(9, WeightLayout::in_out, true); }
TEST(CudaOps, LoraLinearBf16) { ZS_REQUIRE_GPU(); check_lora_linear<bf16>(9, WeightLayout::in_out, true); }
TEST(CudaOps, LoraLinearOutIn) { ZS_REQUIRE_GPU(); check_lora_linear<float>(600, WeightLayout::out_in, false); }
TEST(CudaOps, LoraLinearOutInBf16) { ZS_REQUIRE_GPU(); check_lora_linear<bf16>(600, WeightLayout::out_in, true); }
TEST(CudaOps, GemmTransposed) { ZS_REQUIRE_GPU(); check_gemm<float>(true, true, 7, 12, 5); }
TEST(CudaOps, GemmTransposedBf16) { ZS_REQUIRE_GPU(); check_gemm<bf16>(true, true, 7, 12, 5); }
TEST(CudaOps, GemmUnalignedExtents) { ZS_REQUIRE_GPU(); check_gemm_unaligned_extents<float>(); }
TEST(CudaOps, GemmUnalignedExtentsBf16) { ZS_REQUIRE_GPU(); check_gemm_unaligned_extents<bf16>(); }
// T > 32: rows span several warp iterations. At T = 37 the row blocks are not 16-byte aligned, so the
// batch elements take a GEMM each; at T = 48 (and head size 16) one pointer-array GEMM takes them all.
TEST(CudaOps, Attention) { ZS_REQUIRE_GPU(); check_attention<float>(2, 37, 24, 3); }
TEST(CudaOps, AttentionBf16) { ZS_REQUIRE_GPU(); check_attention<bf16>(2, 37, 24, 3); }
TEST(CudaOps, AttentionSingleBatchElement) { ZS_REQUIRE_GPU(); check_attention<float>(1, 37, 24, 3); }
TEST(CudaOps, AttentionAligned) { ZS_REQUIRE_GPU(); check_attention<float>(3, 48, 48, 3); }
TEST(CudaOps, AttentionAlignedBf16) { ZS_REQUIRE_GPU(); check_attention<bf16>(3, 48, 48, 3); }
// Scores of 48 MiB per batch element: the backward takes passes of 5, 5 and 1 elements.
TEST(CudaOps, AttentionBackwardInPasses) {
  ZS_REQUIRE_GPU();
  const int B = 11, Tn = 1024, C = 96, NH = 12;
  const int chunk = attention_backward_chunk(B, Tn, NH, sizeof(float));
  ASSERT_GT(B, 2 * chunk) << "the shape no longer gives two full passes";
  check_attention<float>(B, Tn, C, NH);
}
TEST(CudaOps, Elementwise) { ZS_REQUIRE_GPU(); check_elementwise<float>(); }
TEST(CudaOps, ElementwiseBf16) { ZS_REQUIRE_GPU(); check_elementwise<bf16>(); }
// A length of whole 16-byte packs: the packed GELU kernels.
TEST(CudaOps, ElementwisePacked) { ZS_REQUIRE_GPU(); check_elementwise<float>(3000); }
TEST(CudaOps, ElementwisePackedBf16) { ZS_REQUIRE_GPU(); check_elementwise<bf16>(3000); }
TEST(CudaOps, CrossEntropy) { ZS_REQUIRE_GPU(); check_cross_entropy<float>(false); }
TEST(CudaOps, CrossEntropyInPlace) { ZS_REQUIRE_GPU(); check_cross_entropy<float>(true); }
TEST(CudaOps, CrossEntropyBf16) { ZS_REQUIRE_GPU(); check_cross_entropy<bf16>(false); }
TEST(CudaOps, CrossEntropyUnalignedRows) { ZS_REQUIRE_GPU(); check_cross_entropy<float>(false, 3); }
TEST(CudaOps, CrossEntropyUnalignedRowsBf16InPlace) { ZS_REQUIRE_GPU(); check_cross_entropy<bf16>(true, 3); }
TEST(CudaOps, CrossEntropyMaskedLogits) { ZS_REQUIRE_GPU(); check_cross_entropy<float>(false, 12, true); }
TEST(CudaOps, CrossEntropyMaskedLogitsBf16) { ZS_REQUIRE_GPU(); check_cross_entropy<bf16>(true, 3, true); }
TEST(CudaOps, AdamW) { ZS_REQUIRE_GPU(); check_adamw<float>(); }
TEST(CudaOps, AdamWBf16Grads) { ZS_REQUIRE_GPU(); check_adamw<bf16>(); }
TEST(CudaOps, SumSquares) { ZS_REQUIRE_GPU(); check_sum_squares<float>(); }
TEST(CudaOps, SumSquaresBf16) { ZS_REQUIRE_GPU(); check_sum_squares<bf16>(); }

TEST(CudaRuntime, AvailabilityQueryNeverThrows) { EXPECT_NO_THROW(cuda_available()); }

}  // namespace
}  // namespace zshard::cuda

#else

TEST(CudaOps, SkippedWithoutCudaBuild) { GTEST_SKIP() << "built without ZSHARD_WITH_CUDA"; }

#endif
