// Steps replayed as CUDA graphs (EngineOptions::cuda_graphs, shard/step_graph.h) against the same steps
// run plainly: every loss and norm the same bits, through two micro-steps a step, a learning rate that
// changes every step (AdamW's factors come from memory the host rewrites), an evaluation between steps
// (which drops the recording) and the steps after it. Also what a replay still checks on the host: the
// tokens, and reads of the device before step(). The refusal on the cpu runs everywhere.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include <zshard/engine.h>
#include <zshard/error.h>

#include "comm/self_communicator.h"
#include "models/gpt2.h"
#include "tests/support/test_support.h"

#ifdef ZSHARD_WITH_CUDA
#include "tests/support/gpu_test.h"
#endif

namespace zshard {
namespace {

using ::testing::HasSubstr;

constexpr int kB = 2, kT = 32, kAccum = 2;

GPT2Config small() { return {.layers = 2, .dim = 64, .heads = 4, .vocab = 256, .ctx = 64}; }

struct Tokens {
  std::vector<int32_t> inputs, targets;
  explicit Tokens(int salt) {
    for (int i = 0; i < kB * kT; ++i) {
      inputs.push_back((7 * i + 31 * salt + 3) % 256);
      targets.push_back((5 * i + 17 * salt + 10) % 256);
    }
  }
  Batch batch() const { return {inputs.data(), targets.data(), kB, kT}; }
};

// One rank's engine over `model` in bf16 on `device`.
Engine make_engine(GPT2& model, comm::Communicator& world, Device device, bool graphs) {
  const Placement placement{.device = device, .param_dtype = device == Device::cuda ? DType::bf16 : DType::f32};
  return Engine(model, world, plan_for_world({.strategy = {}, .placement = placement}, 1),
                EngineOptions{.seed = 5, .grad_accum = kAccum, .tokens_per_step = int64_t(kAccum) * kB * kT,
                              .cuda_graphs = graphs});
}

TEST(CudaGraphs, RefusedOnTheCpu) {
  comm::SelfCommunicator world;
  GPT2 model(small());
  EXPECT_THAT(test::error_of([&] { make_engine(model, world, Device::cpu, true); }),
              HasSubstr("CUDA graphs record GPU work; this run is on the cpu"));
}

#ifdef ZSHARD_WITH_CUDA

// Every step's loss and norm, each micro-step's loss read after its step, and the evaluations; with
// cuDNN's attention where it loads, and the fused epilogues (cuda's default).
std::vector<double> run(bool graphs) {
  comm::SelfCommunicator world;
  GPT2 model(small());
  choose_attention(model, AttentionKernel::automatic, Device::cuda, DType::bf16);
  Engine engine = make_engine(model, world, Device::cuda, graphs);
  std::vector<double> seen;
  for (int step = 0; step < 7; ++step) {
    std::vector<MicroStepLoss> losses;
    for (int k = 0; k < kAccum; ++k) losses.push_back(engine.forward_backward(Tokens(step * kAccum + k).batch()));
    const StepStats stats = engine.step({.lr = 1e-3f * float(step + 1), .weight_decay = 0.1f});
    seen.insert(seen.end(), {stats.loss, stats.grad_norm});
    for (const MicroStepLoss& loss : losses) seen.push_back(loss.value());
    if (step == 3) seen.push_back(engine.forward(Tokens(100).batch()));
  }
  return seen;
}

TEST(CudaGraphs, ReplayedStepsGiveThePlainStepsBits) {
  if (!test::gpu_ready()) GTEST_SKIP() << "no usable GPU";
  const std::vector<double> plain = run(false), replayed = run(true);
  ASSERT_EQ(plain.size(), replayed.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(replayed[i], plain[i]) << "value " << i;
}

TEST(CudaGraphs, AReplayStillChecksTheTokensAndWaitsForStep) {
  if (!test::gpu_ready()) GTEST_SKIP() << "no usable GPU";
  comm::SelfCommunicator world;
  GPT2 model(small());
  Engine engine = make_engine(model, world, Device::cuda, true);
  const auto take_step = [&] {
    for (int k = 0; k < kAccum; ++k) engine.forward_backward(Tokens(k).batch());
    return engine.step({});
  };
  take_step();  // plain
  take_step();  // recorded, then replayed
  Tokens bad(0);
  bad.targets[5] = 256;
  EXPECT_THAT(test::error_of([&] { engine.forward_backward(bad.batch()); }),
              HasSubstr("target token 256 at position 5 is outside the vocabulary [0, 256)"));
  const MicroStepLoss first = engine.forward_backward(Tokens(0).batch());
  EXPECT_THAT(test::error_of([&] { (void)first.value(); }), HasSubstr("read its losses after it"));
  engine.forward_backward(Tokens(1).batch());
  EXPECT_THAT(test::error_of([&] { engine.grad_norm(); }), HasSubstr("read StepStats::grad_norm"));
  const StepStats stats = engine.step({});
  EXPECT_TRUE(std::isfinite(stats.loss));
  EXPECT_GT(first.value(), 0);
}

#endif

}  // namespace
}  // namespace zshard
