// GPT-2 computing on the GPU against the same model on the CPU in fp32: the loss and every gradient, in
// fp32 and in bf16 on the device. Without a GPU (or a CUDA build) those tests skip; the CPU's own bf16
// against its fp32, held to the GPU's bf16 tolerance, and the refusal of the dtype/device pairs the
// model has no kernels for run everywhere.
//
// Gradient measure, per parameter tensor: max_i |gpu_i - cpu_i| / max_i |cpu_i| (test::max_rel_diff),
// the error relative to the tensor's scale, so that near-zero elements do not dominate.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <tuple>
#include <vector>

#include <zshard/error.h>
#include <zshard/testing.h>

#include "kernels/allocator.h"
#include "models/gpt2.h"
#include "tests/support/test_support.h"

#ifdef ZSHARD_WITH_CUDA
#include "tests/support/gpu_test.h"
#endif

namespace zshard {
namespace {

using ::testing::HasSubstr;

// Every code path of the model at a size that runs in well under a second on the CPU.
GPT2Config small() { return {.layers = 2, .dim = 64, .heads = 4, .vocab = 256, .ctx = 64}; }
constexpr int kB = 2, kT = 32;

std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  std::vector<int32_t> x(size_t(n), 0);
  for (int32_t& e : x) e = token(rng);
  return x;
}

// A context that only claims a device and a dtype: the model must refuse before it gathers anything.
class Claims final : public ParamContext {
 public:
  Claims(Device device, DType dtype) : device_(device), dtype_(dtype) {}
  const UnitTensors& gather(int) override { fail("gather called"); }
  void release(int) override {}
  const UnitTensors& grads(int) override { fail("grads called"); }
  void grads_ready(int) override {}
  Device device() const override { return device_; }
  DType compute_dtype() const override { return dtype_; }

 private:
  Device device_;
  DType dtype_;
};

TEST(CudaModel, UnsupportedPairsNameDtypeAndDevice) {
  GPT2 model(small());
  const std::vector<int32_t> tokens = random_tokens(kB * kT, small().vocab, 24);
  for (const auto& [device, dtype, part] : {std::tuple{Device::cuda, DType::f64, "not in f64 on cuda"},
                                            std::tuple{Device::cpu, DType::f16, "not in f16 on cpu"},
                                            std::tuple{Device::cuda, DType::f16, "not in f16 on cuda"}}) {
    Claims ctx(device, dtype);
    EXPECT_THAT(test::error_of([&] { model.forward(ctx, {tokens.data(), tokens.data(), kB, kT}); }),
                HasSubstr(part));
  }
}

using test::max_rel_diff;

struct Tolerance {
  double loss;  // |gpu - cpu| / |cpu| of the summed token loss
  double grad;  // the per-tensor measure above
};
// fp32 on both sides, and cuBLAS without TF32 (kernels/cuda/ops.cuh): only the summation order and
// libm-versus-CUDA math differ (1e-5 per op in test_cuda_ops); two blocks and the head add little.
constexpr Tolerance kF32{1e-5, 1e-4};
// bf16 on the device: parameters, activations and gradients are stored with an 8-bit significand (unit
// roundoff 2^-8 ~ 4e-3 per rounding) and every op rounds its output again, so a gradient carries the
// roundings of the whole forward and backward chain through two blocks and the tied head: a few 1e-2 by
// the max-norm. The loss is a sum over B*T tokens whose errors
// partly cancel, so it is tighter. 2e-2 and 1e-1 leave a margin, while an indexing or layout bug,
// whose errors are of order 1, still fails.
constexpr Tolerance kBf16{2e-2, 1e-1};
// The fused ops in fp32 on the device: cuBLASLt's GELU may take its tanh from the hardware's approximation
// (relative error about 2^-11, tests/unit/test_cuda_fused.cpp), which the chain carries to the loss and
// the gradients, far below what a layout bug gives.
constexpr Tolerance kF32Fused{1e-3, 1e-2};

int64_t live_activation_bytes(Device device) {
  return Allocator::of(device).stats().live[int(Category::activations)];
}

// The same initial parameters on the CPU in fp32 and on `where` in `dtype`: forward_backward on each
// (twice on `where`, zeroing the grads in between, so that the second pass reuses the activations and
// token buffers), then forward. Losses and every gradient within `tol` of the CPU's. `fused`: the model on
// `where` computes through the fused ops or not (Model::set_fused_epilogues).
void expect_matches_cpu_fp32(Device where, DType dtype, Tolerance tol,
                             FusedEpilogues fused = FusedEpilogues::automatic) {
  const GPT2Config config = small();
  GPT2 cpu_model(config), gpu_model(config);
  gpu_model.set_fused_epilogues(fused);
  LocalParams host(cpu_model, DType::f32);
  host.init(cpu_model, 21);
  LocalParams device(gpu_model, dtype, where);
  device.copy_params_from(host);
  const std::vector<int32_t> inputs = random_tokens(kB * kT, config.vocab, 22);
  const std::vector<int32_t> targets = random_tokens(kB * kT, config.vocab, 23);
  const Batch batch{inputs.data(), targets.data(), kB, kT};

  const double want = cpu_model.forward_backward(host, batch, 1.0f);
  ASSERT_TRUE(std::isfinite(want));
  const int64_t before = live_activation_bytes(where);
  const std::vector<UnitSpec> units = gpu_model.units();
  for (int pass = 0; pass < 2; ++pass) {
    SCOPED_TRACE(pass);
    device.zero_grads();
    EXPECT_NEAR(gpu_model.forward_backward(device, batch, 1.0f), want, tol.loss * std::abs(want));
    for (int u = 0; u < device.num_units(); ++u)
      for (size_t i = 0; i < units[u].params.size(); ++i)
        EXPECT_LE(max_rel_diff(to_doubles(device.grad_tensors(u)[i]), to_doubles(host.grad_tensors(u)[i])),
                  tol.grad)
            << units[u].params[i].name;
  }
  EXPECT_NEAR(gpu_model.forward(device, batch), cpu_model.forward(host, batch), tol.loss * std::abs(want));
  // What the device holds for activations, token buffers included, is what activation_bytes says.
  EXPECT_EQ(live_activation_bytes(where) - before, gpu_model.activation_bytes(kB, kT, dtype));
}

// The CPU's bf16 path, which rounds where the GPU's does, within the GPU's bf16 tolerance of fp32.
TEST(CudaModel, CpuBf16MatchesCpuFp32) { expect_matches_cpu_fp32(Device::cpu, DType::bf16, kBf16); }
TEST(CudaModel, CpuBf16FusedMatchesCpuFp32) {
  expect_matches_cpu_fp32(Device::cpu, DType::bf16, kBf16, FusedEpilogues::on);
}

#ifdef ZSHARD_WITH_CUDA

TEST(CudaModel, Fp32MatchesCpu) {
  ZS_REQUIRE_GPU();
  expect_matches_cpu_fp32(Device::cuda, DType::f32, kF32);
}

TEST(CudaModel, Bf16MatchesCpuFp32) {
  ZS_REQUIRE_GPU();
  expect_matches_cpu_fp32(Device::cuda, DType::bf16, kBf16);
}

TEST(CudaModel, FusedFp32MatchesCpu) {
  ZS_REQUIRE_GPU();
  expect_matches_cpu_fp32(Device::cuda, DType::f32, kF32Fused, FusedEpilogues::on);
}

TEST(CudaModel, FusedBf16MatchesCpuFp32) {
  ZS_REQUIRE_GPU();
  expect_matches_cpu_fp32(Device::cuda, DType::bf16, kBf16, FusedEpilogues::on);
}

#else

TEST(CudaModel, SkippedWithoutCudaBuild) { GTEST_SKIP() << "built without ZSHARD_WITH_CUDA"; }

#endif

}  // namespace
}  // namespace zshard
