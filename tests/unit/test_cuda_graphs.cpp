// Steps replayed as CUDA graphs (EngineOptions::cuda_graphs, shard/step_graph.h) against the same steps
// run plainly: every loss and norm the same bits, through a learning rate and a clip bound that change
// every step (the step's settings come from memory the host rewrites), an evaluation between steps (which
// drops the recording)
// and the steps after it, for ddp in bf16 with two micro-steps a step and zero3 in fp32 with one. Also
// what a replay still checks on the host, and a step that fails while it is recorded. The refusal on the
// cpu runs everywhere.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include <zshard/engine.h>
#include <zshard/error.h>

#include "comm/self_communicator.h"
#include "models/gpt2.h"
#include "shard/engine_internals.h"
#include "tests/support/test_support.h"

#ifdef ZSHARD_WITH_CUDA
#include "tests/support/gpu_test.h"
#endif

namespace zshard {
namespace {

using ::testing::HasSubstr;

constexpr int kB = 2, kT = 32;

GPT2Config small() { return {.layers = 2, .dim = 64, .heads = 4, .vocab = 256, .ctx = 64}; }

struct Tokens {
  std::vector<int32_t> inputs, targets;
  explicit Tokens(int salt, int T = kT) {
    for (int i = 0; i < kB * T; ++i) {
      inputs.push_back((7 * i + 31 * salt + 3) % 256);
      targets.push_back((5 * i + 17 * salt + 10) % 256);
    }
  }
  Batch batch() const { return {inputs.data(), targets.data(), kB, int(inputs.size()) / kB}; }
};

struct Setup {
  Device device = Device::cuda;
  StrategyKind strategy = StrategyKind::ddp;
  DType dtype = DType::bf16;
  int grad_accum = 2;
};

// One rank's engine over `model`.
Engine make_engine(GPT2& model, comm::Communicator& world, const Setup& s, bool graphs) {
  const Placement placement{.device = s.device, .param_dtype = s.dtype};
  return Engine(model, world, plan_for_world({.strategy = {.kind = s.strategy}, .placement = placement}, 1),
                EngineOptions{.seed = 5, .grad_accum = s.grad_accum, .tokens_per_step = int64_t(s.grad_accum) * kB * kT,
                              .cuda_graphs = graphs});
}

TEST(CudaGraphs, RefusedOnTheCpu) {
  comm::SelfCommunicator world;
  GPT2 model(small());
  EXPECT_THAT(test::error_of([&] { make_engine(model, world, {.device = Device::cpu, .dtype = DType::f32}, true); }),
              HasSubstr("CUDA graphs record GPU work; this run is on the cpu"));
}

#ifdef ZSHARD_WITH_CUDA

struct Seen {
  std::vector<double> values;  // every step's loss and norm, each micro-step's loss, the evaluation
  int64_t replays = 0;
};

// 7 steps with an evaluation after the fourth; cuDNN's attention where it loads, and the fused epilogues
// (cuda's default).
Seen run(const Setup& s, bool graphs) {
  comm::SelfCommunicator world;
  GPT2 model(small());
  choose_attention(model, AttentionKernel::automatic, Device::cuda, s.dtype);
  Engine engine = make_engine(model, world, s, graphs);
  Seen seen;
  for (int step = 0; step < 7; ++step) {
    std::vector<MicroStepLoss> losses;
    for (int k = 0; k < s.grad_accum; ++k)
      losses.push_back(engine.forward_backward(Tokens(step * s.grad_accum + k).batch()));
    // A bound under the norm every other step, so that the replays clip some steps and not others.
    const StepStats stats =
        engine.step({.lr = 1e-3f * float(step + 1), .weight_decay = 0.1f, .grad_clip = step % 2 ? 1e-3f : 1e3f});
    seen.values.insert(seen.values.end(), {stats.loss, stats.grad_norm});
    for (const MicroStepLoss& loss : losses) seen.values.push_back(loss.value());
    if (step == 3) seen.values.push_back(engine.forward(Tokens(100).batch()));
  }
  seen.replays = EngineInternals::graph_replays(engine);
  return seen;
}

void expect_replays_give_plain_bits(const Setup& s) {
  const Seen plain = run(s, false), replayed = run(s, true);
  // Plain, recorded, replayed twice, the evaluation; plain, recorded, replayed.
  EXPECT_EQ(replayed.replays, 5);
  ASSERT_EQ(plain.values.size(), replayed.values.size());
  for (size_t i = 0; i < plain.values.size(); ++i) EXPECT_EQ(replayed.values[i], plain.values[i]) << "value " << i;
}

TEST(CudaGraphs, ReplayedStepsGiveThePlainStepsBits) {
  if (!test::gpu_ready()) GTEST_SKIP() << "no usable GPU";
  expect_replays_give_plain_bits({});
}

TEST(CudaGraphs, ReplayedZero3Fp32StepsGiveThePlainStepsBits) {
  if (!test::gpu_ready()) GTEST_SKIP() << "no usable GPU";
  expect_replays_give_plain_bits({.strategy = StrategyKind::zero3, .dtype = DType::f32, .grad_accum = 1});
}

TEST(CudaGraphs, AReplayStillChecksWhatTheHostGives) {
  if (!test::gpu_ready()) GTEST_SKIP() << "no usable GPU";
  comm::SelfCommunicator world;
  GPT2 model(small());
  Engine engine = make_engine(model, world, {}, true);
  const auto take_step = [&] {
    engine.forward_backward(Tokens(0).batch());
    engine.forward_backward(Tokens(1).batch());
    return engine.step({});
  };
  take_step();  // plain
  take_step();  // recorded, then replayed
  Tokens bad(0);
  bad.targets[5] = 256;
  EXPECT_THAT(test::error_of([&] { engine.forward_backward(bad.batch()); }),
              HasSubstr("target token 256 at position 5 is outside the vocabulary [0, 256)"));
  const MicroStepLoss first = engine.forward_backward(Tokens(0).batch());  // to be replayed
  EXPECT_THAT(test::error_of([&] { (void)first.value(); }), HasSubstr("read its losses after it"));
  EXPECT_THAT(test::error_of([&] { engine.forward(Tokens(2).batch()); }), HasSubstr("evaluate between steps"));
  engine.forward_backward(Tokens(1).batch());
  EXPECT_THAT(test::error_of([&] { engine.grad_norm(); }), HasSubstr("read StepStats::grad_norm"));
  EXPECT_TRUE(std::isfinite(engine.step({}).loss));  // replayed
  engine.forward_backward(Tokens(0).batch());
  EXPECT_THAT(test::error_of([&] { engine.forward_backward(Tokens(1, kT / 2).batch()); }),
              HasSubstr("micro-step 1's batch is 2 x 16, the step's first was 2 x 32"));
  EXPECT_TRUE(std::isfinite(take_step().loss));
  EXPECT_EQ(EngineInternals::graph_replays(engine), 2);
}

// A micro-step that fails while its step is recorded ends the recording unused and drops the step; the
// steps after it are plain, then recorded again, with the plain run's bits.
TEST(CudaGraphs, AStepThatFailsWhileRecordedIsDropped) {
  if (!test::gpu_ready()) GTEST_SKIP() << "no usable GPU";
  comm::SelfCommunicator world;
  GPT2 plain_model(small()), graph_model(small());
  Engine plain = make_engine(plain_model, world, {}, false);
  Engine graphs = make_engine(graph_model, world, {}, true);
  const auto take_step = [](Engine& engine, int salt) {
    engine.forward_backward(Tokens(salt).batch());
    engine.forward_backward(Tokens(salt + 1).batch());
    return engine.step({.lr = 1e-3f * float(salt + 1)});
  };
  EXPECT_EQ(take_step(graphs, 0).loss, take_step(plain, 0).loss);
  graphs.forward_backward(Tokens(2).batch());  // recorded
  Tokens bad(3);
  bad.inputs[0] = -1;
  EXPECT_THAT(test::error_of([&] { graphs.forward_backward(bad.batch()); }), HasSubstr("input token -1"));
  for (int salt = 4; salt < 10; salt += 2) EXPECT_EQ(take_step(graphs, salt).loss, take_step(plain, salt).loss);
  EXPECT_EQ(EngineInternals::graph_replays(graphs), 2);
}

#endif

}  // namespace
}  // namespace zshard
