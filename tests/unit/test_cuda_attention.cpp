// Fused attention on cuda (cuDNN's SDPA, kernels/cuda/cudnn/) against the CPU's fused op on the same bf16
// inputs, through <zshard/ops.h> as the models call it. The CPU runs the fp32 op on the bf16 values and
// rounds its output and gradient once; cuDNN rounds the probabilities and score gradients to bf16 for its
// tensor-core GEMMs as well, a few roundings of 2^-8 in a chain: 3e-2 of the largest element, as the blocks
// path's bf16 tests (test_cuda_ops.cpp). The statistics stay fp32 on both sides: 1e-3. Without a GPU every
// test skips; on a GPU of a build without cuDNN's frontend headers too, saying so; a GPU whose libcudnn
// does not load fails, naming why.
#include <gtest/gtest.h>

#ifdef ZSHARD_WITH_CUDA
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <zshard/error.h>
#include <zshard/ops.h>
#include <zshard/tensor.h>

#include "kernels/cpu/ops.h"
#include "kernels/device_memory.h"
#include "kernels/engine_ops.h"
#include "tests/support/gpu_test.h"
#include "tests/support/test_support.h"

namespace zshard {
namespace {

constexpr double kBf16Tolerance = 3e-2;
constexpr double kStatTolerance = 1e-3;

// Skips without a GPU or in a build without cuDNN's frontend headers; fails where the build has them and
// libcudnn does not load.
#define ZS_REQUIRE_CUDNN()                                                                         \
  ZS_REQUIRE_GPU();                                                                                \
  const std::string cudnn_missing = ops::fused_attention_unavailable(Device::cuda, DType::bf16);  \
  if (cudnn_missing.find("built without") != std::string::npos) GTEST_SKIP() << cudnn_missing;     \
  ASSERT_EQ(cudnn_missing, "") << "this build has fused attention on cuda"

// Random bf16 values, and a device copy.
std::vector<bf16> random_bf16(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  std::vector<bf16> x(n);
  for (bf16& e : x) e = bf16(dist(rng));
  return x;
}
template <class T>
Tensor on_device(const std::vector<T>& host, DType dtype) {
  Tensor t = Tensor::empty({int64_t(host.size())}, dtype, Device::cuda, Category::workspace);
  copy_bytes(t.raw(), Device::cuda, host.data(), Device::cpu, host.size() * sizeof(T));
  return t;
}
template <class T>
std::vector<double> doubles(const std::vector<T>& x) {
  std::vector<double> out;
  for (T e : x) out.push_back(double(float(e)));
  return out;
}
template <class T>
std::vector<double> on_host(const Tensor& t) {
  std::vector<T> staged(size_t(t.numel()));
  copy_bytes(staged.data(), Device::cpu, t.raw(), Device::cuda, staged.size() * sizeof(T));
  ops::synchronize(Device::cuda);
  return doubles(staged);
}

struct Outputs {
  std::vector<double> out, lse, dqkv;
};

Outputs run_cuda(const std::vector<bf16>& qkv, const std::vector<bf16>& dout, int B, int Tn, int C, int NH) {
  const Tensor d_qkv = on_device(qkv, DType::bf16), d_dout = on_device(dout, DType::bf16);
  const Tensor out = Tensor::empty({int64_t(dout.size())}, DType::bf16, Device::cuda, Category::workspace);
  const Tensor lse = Tensor::empty({int64_t(B) * NH * Tn}, DType::f32, Device::cuda, Category::workspace);
  // Written whole by the backward: what was there must not matter.
  const Tensor dqkv = on_device(std::vector<bf16>(qkv.size(), bf16(7.f)), DType::bf16);
  ops::fused_attention_forward(Device::cuda, out.data<bf16>(), lse.data<float>(), d_qkv.data<bf16>(), B, Tn, C, NH);
  ops::fused_attention_backward(Device::cuda, dqkv.data<bf16>(), d_dout.data<bf16>(), d_qkv.data<bf16>(),
                                out.data<bf16>(), lse.data<float>(), B, Tn, C, NH);
  return {on_host<bf16>(out), on_host<float>(lse), on_host<bf16>(dqkv)};
}

Outputs run_cpu(const std::vector<bf16>& qkv, const std::vector<bf16>& dout, int B, int Tn, int C, int NH) {
  std::vector<bf16> out(dout.size()), dqkv(qkv.size());
  std::vector<float> lse(size_t(B) * NH * Tn);
  cpu::fused_attention_forward(out.data(), lse.data(), qkv.data(), B, Tn, C, NH);
  cpu::fused_attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, Tn, C, NH);
  return {doubles(out), doubles(lse), doubles(dqkv)};
}

void check_fused_attention(int B, int Tn, int C, int NH) {
  std::mt19937 rng(41);
  const std::vector<bf16> qkv = random_bf16(size_t(B) * Tn * 3 * C, rng), dout = random_bf16(size_t(B) * Tn * C, rng);
  const Outputs gpu = run_cuda(qkv, dout, B, Tn, C, NH), cpu = run_cpu(qkv, dout, B, Tn, C, NH);
  EXPECT_LE(test::max_rel_diff(gpu.out, cpu.out), kBf16Tolerance) << "out";
  EXPECT_LE(test::max_rel_diff(gpu.lse, cpu.lse), kStatTolerance) << "lse";
  EXPECT_LE(test::max_rel_diff(gpu.dqkv, cpu.dqkv), kBf16Tolerance) << "dqkv";
  // Deterministic: a second run gives the same bits.
  const Outputs again = run_cuda(qkv, dout, B, Tn, C, NH);
  EXPECT_EQ(again.out, gpu.out);
  EXPECT_EQ(again.lse, gpu.lse);
  EXPECT_EQ(again.dqkv, gpu.dqkv) << "the backward is not deterministic";
}

// GPT-2's head size (64), three heads, a length that is no multiple of cuDNN's tiles.
TEST(CudaFusedAttention, MatchesCpuGpt2Heads) {
  ZS_REQUIRE_CUDNN();
  check_fused_attention(2, 37, 192, 3);
}
// The tiny models' head size (16), across the CPU kernel's row blocks of 64; a second shape also takes a
// graph of its own from the cache, beside the first's.
TEST(CudaFusedAttention, MatchesCpuAcrossRowBlocks) {
  ZS_REQUIRE_CUDNN();
  check_fused_attention(1, 130, 64, 4);
  check_fused_attention(2, 37, 192, 3);
}

// cuDNN's kernels take 16-bit inputs: fp32 on cuda is refused, naming why (the runtime keeps blocks).
TEST(CudaFusedAttention, RefusesFp32) {
  ZS_REQUIRE_GPU();
  const std::string why = ops::fused_attention_unavailable(Device::cuda, DType::f32);
  EXPECT_NE(why.find("bf16 only"), std::string::npos) << why;
  const Tensor x = Tensor::zeros({3 * 8 * 4}, DType::f32, Device::cuda, Category::workspace);
  const Tensor lse = Tensor::zeros({8}, DType::f32, Device::cuda, Category::workspace);
  EXPECT_THROW(ops::fused_attention_forward(Device::cuda, x.data<float>(), lse.data<float>(), x.data<float>(), 1, 8,
                                            4, 1),
               Error);
}

}  // namespace
}  // namespace zshard

#else

TEST(CudaFusedAttention, SkippedWithoutCudaBuild) { GTEST_SKIP() << "built without ZSHARD_WITH_CUDA"; }

#endif
