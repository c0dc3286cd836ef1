// The optimizer step's ops on the GPU against the CPU, through ops:: as the engine calls them: AdamW over a
// unit's segments (weight decay per segment, the padding untouched, a non-finite step skipped), the sums
// of squares of many parts, the step's scalars computed on the device, the read back, and the timer the
// trainer measures the micro-steps with. Without a GPU every test skips.
#include <gtest/gtest.h>

#ifdef ZSHARD_WITH_CUDA
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "kernels/device_timer.h"
#include "kernels/engine_ops.h"
#include "kernels/test_hooks.h"
#include "tests/support/gpu_test.h"
#include "tests/support/test_support.h"

namespace zshard {
namespace {

using ops::ShardSegment;
using ops::StepScalars;
using test::DeviceVector;

template <class T>
std::vector<T> random_values(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<T> x(n);
  for (T& e : x) e = T(dist(rng));
  return x;
}

std::vector<uint16_t> bits(const std::vector<bf16>& x) {
  std::vector<uint16_t> out;
  for (bf16 e : x) out.push_back(e.bits);
  return out;
}

// 70 segments (two launches' worth) of uneven lengths, one long enough for several blocks, with gaps of
// padding between them and at the end, decay on every other one.
std::vector<ShardSegment> segments_with_gaps(size_t* total) {
  std::vector<ShardSegment> segments;
  size_t at = 3;
  for (size_t s = 0; s < 70; ++s) {
    const size_t count = s == 5 ? 9000 : 1 + 37 * s % 101;
    segments.push_back({at, count, s % 2 == 0});
    at += count + s % 3;
  }
  *total = at + 5;
  return segments;
}

template <class G>
void check_adamw_segments(bool skip) {
  size_t n = 0;
  const std::vector<ShardSegment> segments = segments_with_gaps(&n);
  std::mt19937 rng(21);
  const std::vector<float> param = random_values<float>(n, rng, -2, 2), m = random_values<float>(n, rng, -0.1f, 0.1f);
  const std::vector<float> v = random_values<float>(n, rng, 0, 0.1f);
  const std::vector<G> grad = random_values<G>(n, rng, -2, 2);
  const std::vector<bf16> copy(n, bf16(7.0f));
  const ops::AdamWParams hp{.lr = 1e-2f, .weight_decay = 0.1f, .step = 3};
  StepScalars scalars{.grad_scale = 0.5, .skip = skip};
  DeviceVector<float> d_param(param), d_m(m), d_v(v);
  DeviceVector<G> d_grad(grad);
  DeviceVector<bf16> d_copy(copy);
  DeviceVector<StepScalars> d_scalars({scalars});
  const cpu::StepSettings settings{cpu::adamw_factors<float>(hp)};
  ops::set_step_settings(Device::cuda, d_scalars.get(), &settings);
  ops::set_step_settings(Device::cpu, &scalars, &settings);
  ops::adamw_step(Device::cuda, d_param.get(), d_grad.get(), d_m.get(), d_v.get(), segments, d_scalars.get(),
                  d_copy.get());
  std::vector<float> want_param = param, want_m = m, want_v = v;
  std::vector<bf16> want_copy = copy;
  ops::adamw_step(Device::cpu, want_param.data(), grad.data(), want_m.data(), want_v.data(), segments, &scalars,
                  want_copy.data());
  // The host's bits (no operation fused on either side), and the padding as it was on both.
  EXPECT_EQ(d_param.host(), want_param);
  EXPECT_EQ(d_m.host(), want_m);
  EXPECT_EQ(d_v.host(), want_v);
  EXPECT_EQ(bits(d_copy.host()), bits(want_copy));
  EXPECT_EQ(d_param.host()[0], param[0]) << "padding";
  EXPECT_EQ(d_param.host()[n - 1], param[n - 1]) << "padding";
  if (skip) EXPECT_EQ(want_param, param) << "a skipped step writes nothing";
}

TEST(CudaOps, AdamWSegments) { ZS_REQUIRE_GPU(); check_adamw_segments<float>(false); }
TEST(CudaOps, AdamWSegmentsBf16Grads) { ZS_REQUIRE_GPU(); check_adamw_segments<bf16>(false); }
TEST(CudaOps, AdamWSkipsANonFiniteStep) { ZS_REQUIRE_GPU(); check_adamw_segments<float>(true); }

// The same bits, or both NaN (a NaN's payload is the hardware's).
void expect_same(double got, double want) {
  if (std::isnan(got) && std::isnan(want)) return;
  EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0) << got << " on cuda, " << want << " on cpu";
}

// The norm's sums in device memory: the squares of 70 parts added to what the double held, then the
// scalars from them with the CPU's code, bit for bit (the same additions, division and square root).
TEST(CudaOps, StepSums) {
  ZS_REQUIRE_GPU();
  size_t n = 0;
  const std::vector<ShardSegment> segments = segments_with_gaps(&n);
  std::mt19937 rng(22);
  const std::vector<bf16> x = random_values<bf16>(n, rng, -2, 2);
  DeviceVector<bf16> d_x(x);
  std::vector<std::span<const bf16>> parts, host_parts;
  for (const ShardSegment& s : segments) {
    parts.emplace_back(d_x.get() + s.begin, s.count);
    host_parts.emplace_back(x.data() + s.begin, s.count);
  }
  double want = 0.25;
  DeviceVector<double> d_sum({want});
  ops::sum_squares<bf16>(Device::cuda, d_sum.get(), parts);
  ops::sum_squares<bf16>(Device::cpu, &want, host_parts);
  EXPECT_NEAR(d_sum.host()[0], want, 1e-12 * want) << "only the order within a part differs";

  const std::vector<double> values = {0.1, 1e16, -3.5, 2.0 / 3.0};
  DeviceVector<double> d_values(values), d_in_order({0.0});
  ops::sum_in_order(Device::cuda, d_in_order.get(), d_values.get(), values.size(), 1.5);
  double in_order = 0;
  ops::sum_in_order(Device::cpu, &in_order, values.data(), values.size(), 1.5);
  EXPECT_EQ(d_in_order.host()[0], in_order);

  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (const StepScalars start : {StepScalars{.loss_sum = 3, .norm_squares = 17.3}, StepScalars{.norm_squares = 0.01},
                                  StepScalars{.loss_sum = inf, .norm_squares = 2}, StepScalars{.norm_squares = nan}}) {
    for (float max_norm : {0.0f, 1.0f}) {
      StepScalars bounded = start;
      bounded.settings.max_norm = max_norm;
      DeviceVector<StepScalars> d_step({bounded});
      ops::clip_grad_norm(Device::cuda, d_step.get());
      StepScalars want_step = bounded;
      ops::clip_grad_norm(Device::cpu, &want_step);
      const StepScalars got = d_step.host()[0];
      SCOPED_TRACE(testing::Message() << "norm squares " << start.norm_squares << ", max norm " << max_norm);
      expect_same(got.norm, want_step.norm);
      expect_same(got.grad_scale, want_step.grad_scale);
      EXPECT_EQ(got.skip, want_step.skip);
    }
  }
}

// The read back copies what the device wrote and counts as one wait for the device.
TEST(CudaOps, ReadBack) {
  ZS_REQUIRE_GPU();
  const test::ScopedHook count("ZSHARD_TEST_COUNT_DEVICE_WAITS", "1");
  DeviceVector<double> d_values({1.5, -2.25});
  std::vector<double> host(2);
  const int64_t before = device_waits_counted();
  ops::read_back(Device::cuda, host.data(), d_values.get(), 2 * sizeof(double));
  EXPECT_EQ(host, std::vector<double>({1.5, -2.25}));
  EXPECT_EQ(device_waits_counted() - before, 1);
}

// A span of the device's work timed without the host waiting inside it: read after one wait for all.
TEST(CudaOps, DeviceTimerTimesTheDevicesWork) {
  ZS_REQUIRE_GPU();
  std::mt19937 rng(23);
  const std::vector<float> x = random_values<float>(size_t(1) << 24, rng, -1, 1);
  DeviceVector<float> d_x(x);
  DeviceVector<double> d_sum({0.0});
  const std::vector<std::span<const float>> parts(8, std::span<const float>(d_x.get(), x.size()));
  DeviceTimer timer(Device::cuda);
  timer.start();
  ops::sum_squares<float>(Device::cuda, d_sum.get(), parts);
  timer.stop();
  ops::synchronize(Device::cuda);
  EXPECT_GT(timer.elapsed_ms(), 0.0);
}

}  // namespace
}  // namespace zshard

#else

TEST(CudaOps, StepOpsSkippedWithoutCudaBuild) { GTEST_SKIP() << "built without ZSHARD_WITH_CUDA"; }

#endif
