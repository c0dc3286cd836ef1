// The device-dispatched ops (<zshard/ops.h>, kernels/engine_ops.h) without a GPU: the host bf16 type, that
// ops:: on cpu is exactly the CPU reference, the f32<->bf16 conversion on cpu, bf16 on the cpu rounding
// where the CUDA kernels store, the optimizer step's ops, and the errors for pairings that cannot run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <zshard/ops.h>

#include "kernels/cpu/ops.h"
#include "kernels/engine_ops.h"
#include "kernels/test_hooks.h"
#include "tests/support/test_support.h"

namespace zshard {
namespace {

using ::testing::HasSubstr;
using test::error_of;

float from_bits(uint32_t u) { return std::bit_cast<float>(u); }
uint16_t bf16_bits(float f) { return bf16(f).bits; }

template <class T>
std::vector<T> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<T> dist(-2, 2);
  std::vector<T> x(n);
  for (T& e : x) e = dist(rng);
  return x;
}

TEST(Bf16Host, RoundsToNearestEven) {
  EXPECT_EQ(bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(float(bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_bits(-2.5f), 0xc020);
  // bf16 keeps the upper 16 bits; the lower 16 decide the rounding. 0x8000 below is exactly half way.
  EXPECT_EQ(bf16_bits(from_bits(0x3f807fffu)), 0x3f80);  // below half: down
  EXPECT_EQ(bf16_bits(from_bits(0x3f808001u)), 0x3f81);  // above half: up
  EXPECT_EQ(bf16_bits(from_bits(0x3f808000u)), 0x3f80);  // tie, 0x3f80 even: stays
  EXPECT_EQ(bf16_bits(from_bits(0x3f818000u)), 0x3f82);  // tie, 0x3f81 odd: up to even
  EXPECT_EQ(bf16_bits(from_bits(0xbf818000u)), 0xbf82);  // the same for negatives (magnitude rounds)
  // A carry out of the mantissa moves the exponent: 1.99999 rounds to 2.
  EXPECT_EQ(float(bf16(from_bits(0x3fffffffu))), 2.0f);
}

TEST(Bf16Host, InfinitiesAndNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(bf16_bits(inf), 0x7f80);
  EXPECT_EQ(bf16_bits(-inf), 0xff80);
  // The largest float is above bf16's largest finite value by more than half an ulp: rounds to inf.
  EXPECT_EQ(bf16_bits(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_TRUE(std::isnan(float(bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload is only in the dropped bits must not truncate (or round) to infinity.
  EXPECT_TRUE(std::isnan(float(bf16(from_bits(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(float(bf16(from_bits(0xffffffffu)))));
  EXPECT_EQ(bf16_bits(-0.0f), 0x8000);
}

// Same inputs through ops:: and cpu::: the results must be bit for bit the same, since the CPU path's
// numerics are what the parity tests compare.
TEST(OpsDispatch, CpuIsExactlyTheReference) {
  const int N = 5, C = 12, OC = 7;
  const auto inp = random_values<float>(size_t(N) * C, 1), w = random_values<float>(size_t(C) * OC, 2);
  const auto bias = random_values<float>(OC, 3);
  std::vector<float> got(size_t(N) * OC), want(got.size());
  ops::linear_forward(Device::cpu, got.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  cpu::linear_forward(want.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  EXPECT_EQ(got, want);

  // gemm in double with fp32 alpha and beta, both transposed.
  const auto a = random_values<double>(size_t(C) * N, 4), b = random_values<double>(size_t(OC) * C, 5);
  std::vector<double> c_got = random_values<double>(size_t(N) * OC, 6), c_want = c_got;
  ops::gemm(Device::cpu, true, true, N, OC, C, 0.5f, a.data(), N, b.data(), C, -1.25f, c_got.data(), OC);
  cpu::gemm(true, true, N, OC, C, 0.5, a.data(), N, b.data(), C, -1.25, c_want.data(), OC);
  EXPECT_EQ(c_got, c_want);

  const int V = 9;
  const auto logits = random_values<double>(size_t(N) * V, 7);
  const std::vector<int32_t> targets = {0, 8, 3, 3, 5};
  std::vector<double> dl_got(logits.size()), dl_want(logits.size()), l_got(N), l_want(N);
  const float dloss = 1.0f / 3;
  const double sum_got = ops::cross_entropy_forward_backward(Device::cpu, dl_got.data(), l_got.data(),
                                                             logits.data(), targets.data(), N, V, V, dloss);
  const double sum_want = cpu::cross_entropy_forward_backward(dl_want.data(), l_want.data(), logits.data(),
                                                              targets.data(), N, V, V, double(dloss));
  EXPECT_EQ(sum_got, sum_want);
  EXPECT_EQ(dl_got, dl_want);
  EXPECT_EQ(l_got, l_want);
}

TEST(OpsDispatch, ConvertsBetweenF32AndBf16OnCpu) {
  const std::vector<float> x = {1.0f, -2.5f, from_bits(0x3f818000u), 3.14159f, 0.0f, 1e-30f};
  std::vector<bf16> half(x.size());
  ops::convert(Device::cpu, half.data(), DType::bf16, x.data(), DType::f32, x.size());
  std::vector<float> back(x.size()), same(x.size());
  ops::convert(Device::cpu, back.data(), DType::f32, half.data(), DType::bf16, x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(half[i].bits, bf16(x[i]).bits) << i;
    EXPECT_EQ(back[i], float(bf16(x[i]))) << i;
  }
  ops::convert(Device::cpu, same.data(), DType::f32, x.data(), DType::f32, x.size());  // a plain copy
  EXPECT_EQ(same, x);
  EXPECT_THAT(error_of([&] { ops::convert(Device::cpu, same.data(), DType::f64, x.data(), DType::f32, 1); }),
              HasSubstr("convert: f32 and bf16 only, not f32 -> f64"));
}

// What ops::sum_squares adds to a double that starts at 0.
template <class T>
double sum_squares(std::span<const std::span<const T>> parts) {
  double sum = 0;
  ops::sum_squares<T>(Device::cpu, &sum, parts);
  return sum;
}

TEST(OpsDispatch, SumSquaresAddsEveryPart) {
  std::vector<double> x(10);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.5 * double(i) - 2.0;
  const std::span<const double> all(x);
  const std::vector<std::span<const double>> parts{all.subspan(0, 3), all.subspan(3, 0), all.subspan(3)};
  EXPECT_EQ(sum_squares<double>(parts), cpu::sum_squares(x.data(), x.size()));
  EXPECT_EQ(sum_squares<double>({}), 0.0);
}

// A unit's owned shard: segments with padding between them and after, every other one decayed.
TEST(OpsDispatch, AdamWStepsEachSegmentOrSkipsTheStep) {
  const std::vector<ops::ShardSegment> segments = {{2, 5, true}, {7, 300, false}, {310, 0, true}, {311, 9, true}};
  const size_t n = 324;
  const std::vector<float> param0 = random_values<float>(n, 16), m0 = random_values<float>(n, 17);
  std::vector<float> v0 = random_values<float>(n, 18), grad = random_values<float>(n, 19);
  for (float& x : v0) x *= x;
  const ops::AdamWParams hp{.lr = 1e-2f, .weight_decay = 0.1f, .step = 2};
  ops::StepScalars scalars{.grad_scale = 0.25};
  const cpu::StepSettings settings{cpu::adamw_factors<float>(hp)};
  ops::set_step_settings(Device::cpu, &scalars, &settings);
  std::vector<float> param = param0, m = m0, v = v0;
  std::vector<bf16> copy(n, bf16(9.0f));
  ops::adamw_step(Device::cpu, param.data(), grad.data(), m.data(), v.data(), segments, &scalars, copy.data());
  // The CPU kernel segment by segment, with the step's scale and each segment's decay; the rest untouched.
  std::vector<float> want_param = param0, want_m = m0, want_v = v0;
  for (const ops::ShardSegment& s : segments) {
    ops::AdamWParams segment_hp = hp;
    segment_hp.grad_scale = 0.25f;
    if (!s.weight_decay) segment_hp.weight_decay = 0;
    cpu::adamw_step(want_param.data() + s.begin, grad.data() + s.begin, want_m.data() + s.begin,
                    want_v.data() + s.begin, s.count, segment_hp);
  }
  EXPECT_EQ(param, want_param);
  EXPECT_EQ(m, want_m);
  EXPECT_EQ(v, want_v);
  for (size_t i : {size_t(0), size_t(1), size_t(307), size_t(320), n - 1}) {
    EXPECT_EQ(param[i], param0[i]) << "padding " << i;
    EXPECT_EQ(copy[i].bits, bf16(9.0f).bits) << "padding " << i;
  }
  EXPECT_EQ(copy[100].bits, bf16(param[100]).bits);
  // A non-finite step: nothing is written.
  scalars.skip = 1;
  const std::vector<float> before = param;
  ops::adamw_step(Device::cpu, param.data(), grad.data(), m.data(), v.data(), segments, &scalars, copy.data());
  EXPECT_EQ(param, before);
}

// The step's scalars where the device keeps them: the sums in order, then torch's clip_grad_norm_.
TEST(OpsDispatch, StepScalarsStayInDeviceMemory) {
  const std::vector<float> g = {3.0f, 4.0f};
  const std::vector<std::span<const float>> parts{g};
  double own = 1;
  ops::sum_squares<float>(Device::cpu, &own, parts);
  EXPECT_EQ(own, 26.0) << "added to what was there";
  const std::vector<double> ranks = {0.1, 0.2, 0.3};
  ops::StepScalars s{.loss_sum = 12};
  ops::sum_in_order(Device::cpu, &s.norm_squares, ranks.data(), ranks.size());
  EXPECT_EQ(s.norm_squares, (0.1 + 0.2) + 0.3);
  s.norm_squares = 4;
  // The clip bound as step() sets it, in the scalars' memory.
  const auto clip = [&](float max_norm) {
    const cpu::StepSettings settings{.max_norm = max_norm};
    ops::set_step_settings(Device::cpu, &s, &settings);
    ops::clip_grad_norm(Device::cpu, &s);
  };
  clip(1.0f);
  EXPECT_EQ(s.norm, 2.0);
  EXPECT_EQ(s.grad_scale, double(float(1.0 / (2.0 + 1e-6))));
  EXPECT_EQ(s.skip, 0);
  clip(3.0f);
  EXPECT_EQ(s.grad_scale, 1.0) << "a norm below the bound is not scaled";
  clip(0.0f);
  EXPECT_EQ(s.grad_scale, 1.0) << "0: no clipping";
  s.loss_sum = std::numeric_limits<double>::quiet_NaN();
  clip(1.0f);
  EXPECT_EQ(s.skip, 1);
  s = ops::StepScalars{.loss_sum = 1, .norm_squares = std::numeric_limits<double>::infinity()};
  clip(1.0f);
  EXPECT_EQ(s.skip, 1);
}

// Under ZSHARD_TEST_COUNT_DEVICE_WAITS every read back and synchronize counts, on the cpu too.
TEST(OpsDispatch, ReadBackIsACountedWait) {
  const std::vector<double> device = {1.5, -2.5};
  std::vector<double> host(2);
  {
    const test::ScopedHook count("ZSHARD_TEST_COUNT_DEVICE_WAITS", "1");
    const int64_t before = device_waits_counted();
    ops::read_back(Device::cpu, host.data(), device.data(), 2 * sizeof(double));
    ops::synchronize(Device::cpu);
    EXPECT_EQ(device_waits_counted() - before, 2);
  }
  EXPECT_EQ(host, device);
  const int64_t before = device_waits_counted();
  ops::synchronize(Device::cpu);
  EXPECT_EQ(device_waits_counted(), before) << "nothing counted with the hook off";
}

std::vector<bf16> to_bf16(const std::vector<float>& x) { return std::vector<bf16>(x.begin(), x.end()); }
std::vector<float> to_float(const std::vector<bf16>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = float(x[i]);
  return out;
}
std::vector<uint16_t> bits(const std::vector<bf16>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i].bits;
  return out;
}

// bf16 through ops:: on the cpu: the fp32 result rounded once where a CUDA kernel stores (an element-wise
// op, axpy), and where the CUDA path stores twice, twice (a linear layer's GEMM output, then the bias
// added to it). Bit for bit, since both sides compute the same fp32 values here.
TEST(OpsDispatch, Bf16OnCpuRoundsWhereTheCudaKernelsStore) {
  const int N = 5, C = 12, OC = 7;
  const std::vector<bf16> x = to_bf16(random_values<float>(size_t(N) * C, 11));
  const std::vector<bf16> w = to_bf16(random_values<float>(size_t(C) * OC, 12));
  const std::vector<bf16> b = to_bf16(random_values<float>(OC, 13));

  std::vector<bf16> gelu(x.size());
  ops::gelu_forward(Device::cpu, gelu.data(), x.data(), x.size());
  std::vector<float> gelu_f(x.size());
  cpu::gelu_forward(gelu_f.data(), to_float(x).data(), x.size());
  EXPECT_EQ(bits(gelu), bits(to_bf16(gelu_f)));

  std::vector<bf16> y = to_bf16(random_values<float>(x.size(), 14)), want(y.size());
  for (size_t i = 0; i < y.size(); ++i) want[i] = bf16(float(y[i]) + -0.75f * float(x[i]));
  ops::axpy(Device::cpu, y.data(), x.data(), -0.75f, y.size());
  EXPECT_EQ(bits(y), bits(want));

  std::vector<bf16> out(size_t(N) * OC);
  ops::linear_forward(Device::cpu, out.data(), x.data(), w.data(), b.data(), N, C, OC);
  std::vector<float> product(out.size());
  cpu::gemm<float>(false, false, N, OC, C, 1, to_float(x).data(), C, to_float(w).data(), OC, 0, product.data(), OC);
  std::vector<bf16> expected(out.size());
  for (size_t i = 0; i < product.size(); ++i) expected[i] = bf16(float(bf16(product[i])) + float(b[i % OC]));
  EXPECT_EQ(bits(out), bits(expected));

  const std::vector<std::span<const bf16>> parts{x};
  double squares = 0;
  for (bf16 v : x) squares += double(float(v)) * double(float(v));
  EXPECT_NEAR(sum_squares<bf16>(parts), squares, 1e-12 * squares);
  EXPECT_NO_THROW(ops::synchronize(Device::cpu));
}

// With a loss sum to add to, cross-entropy returns 0 and adds there what it would have returned.
TEST(OpsDispatch, CrossEntropyAddsItsSumWhereAsked) {
  const int N = 4, V = 9;
  const std::vector<bf16> logits = to_bf16(random_values<float>(size_t(N) * V, 15));
  const std::vector<int32_t> targets = {0, 8, 3, 3};
  std::vector<bf16> losses(N);
  const double returned = ops::cross_entropy_forward_backward<bf16>(Device::cpu, nullptr, losses.data(),
                                                                    logits.data(), targets.data(), N, V, V, 1.f);
  double sum = 0.25;
  EXPECT_EQ(ops::cross_entropy_forward_backward<bf16>(Device::cpu, nullptr, losses.data(), logits.data(),
                                                      targets.data(), N, V, V, 1.f, &sum),
            0.0);
  EXPECT_EQ(sum, 0.25 + returned);
}

// Both checks run before anything touches the device, so they hold on a machine without a GPU.
TEST(OpsDispatch, CudaCallsFailClearlyWhereTheyCannotRun) {
  std::vector<double> d(4);
#ifdef ZSHARD_WITH_CUDA
  EXPECT_THAT(error_of([&] { ops::gelu_forward(Device::cuda, d.data(), d.data(), d.size()); }),
              HasSubstr("gelu_forward: f64 is computed on cpu only"));
#else
  std::vector<float> f(4);
  for (const std::string& msg :
       {error_of([&] { ops::gelu_forward(Device::cuda, f.data(), f.data(), f.size()); }),
        error_of([&] { ops::residual_forward(Device::cuda, d.data(), d.data(), d.data(), d.size()); }),
        error_of([&] { ops::convert(Device::cuda, f.data(), DType::f32, f.data(), DType::f32, f.size()); }),
        error_of([&] { ops::synchronize(Device::cuda); })})
    EXPECT_THAT(msg, HasSubstr("built without the CUDA path"));
#endif
}

}  // namespace
}  // namespace zshard
