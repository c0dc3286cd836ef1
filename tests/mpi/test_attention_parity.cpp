// --attention fused against blocks on whole training runs of each small model (GPT-2's tiny, llama-tiny):
// the same per-step losses and final parameters but for rounding (the probabilities recomputed from the
// saved statistics), at np 1 under ddp and at np 2 under zero3, whose gathers and reductions fused
// attention leaves as they are.
// zshard-test-np: 1 2
#include <gtest/gtest.h>

#include <cmath>

#include "tests/support/test_support.h"
#include "tests/support/training_runs.h"

namespace zshard {
namespace {

constexpr double kTolerance = 1e-5;

TEST(AttentionParity, FusedTrainsAsBlocks) {
  const int world = test::world().size();
  for (const std::string model : {"tiny", "llama-tiny"}) {
    TrainOptions blocks = test::tiny_options(10);
    blocks.model.name = model;
    blocks.data.seq = 70;  // crosses the CPU kernels' row blocks of 64 queries
    blocks.plan.strategy.kind = world == 1 ? StrategyKind::ddp : StrategyKind::zero3;
    blocks.model.attention = AttentionKernel::blocks;
    TrainOptions fused = blocks;
    fused.model.attention = AttentionKernel::fused;
    const test::RunResult want = test::train(blocks, test::world()), got = test::train(fused, test::world());
    const std::string what = model + " " + test::describe(blocks.plan.strategy);
    ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
    ASSERT_LT(want.losses.back(), want.losses.front()) << what;  // it really trains
    for (size_t s = 0; s < want.losses.size(); ++s)
      EXPECT_LE(std::abs(got.losses[s] - want.losses[s]) / std::abs(want.losses[s]), kTolerance)
          << what << ": loss of step " << s + 1 << " is " << got.losses[s] << ", want " << want.losses[s];
    EXPECT_LE(test::max_rel_diff(got.params, want.params), kTolerance) << what << ": final parameters";
    EXPECT_NE(got.losses, want.losses) << what << ": fused and blocks gave the same bits; is fused running?";
  }
}

}  // namespace
}  // namespace zshard
