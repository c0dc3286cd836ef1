// Every strategy trains each small model (GPT-2's tiny, llama-tiny) exactly like the single-process run
// with the same global batch:
// same per-step losses and same final parameters, clipping on (a tied Llama too, its head's weight
// gradient deferred on the ranks and not in the single process). Also gradient accumulation against the
// large batch, uneven per-rank batches (fixed, and re-split by speed) against the even split, activation checkpointing against none
// (bit for bit), and memory against the ZeRO formulas.
// zshard-test-np: 2 3 4
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>

#include "kernels/allocator.h"
#include "shard/memory/zero_arithmetic.h"
#include "tests/support/test_support.h"
#include "tests/support/training_runs.h"

namespace zshard {
namespace {

using test::describe;
using test::RunResult;
using test::strategies_for;

constexpr double kTolerance = 1e-5;

void expect_same_run(const RunResult& got, const RunResult& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t s = 0; s < want.losses.size(); ++s)
    EXPECT_LE(std::abs(got.losses[s] - want.losses[s]) / std::abs(want.losses[s]), kTolerance)
        << what << ": loss of step " << s + 1 << " is " << got.losses[s] << ", want " << want.losses[s];
  EXPECT_LE(test::max_rel_diff(got.params, want.params), kTolerance) << what << ": final parameters";
}

// The runtime has no case for any model: every small model of the registry goes through the same tests.
const std::vector<std::string> kModels = {"tiny", "llama-tiny"};

TEST(StrategyParity, EveryStrategyMatchesSingleProcess) {
  for (const std::string& model : kModels) {
    TrainOptions base = test::tiny_options(30);
    base.model.name = model;
    const RunResult reference = test::train_single_process(base);
    ASSERT_LT(reference.losses.back(), reference.losses.front()) << model;  // it really trains
    for (const StrategyOptions& s : strategies_for(test::world().size())) {
      TrainOptions o = base;
      o.plan.strategy = s;
      expect_same_run(test::train(o, test::world()), reference, model + " " + describe(s));
    }
  }
}

// A tied Llama on one sequence of 32 tokens per rank, fewer than its 64 channels: every rank defers its
// head's weight gradient to the embedding's backward, while the single process, with 32 tokens per rank
// of the world, as many as the channels or more, adds it at the head. Every strategy still matches it.
TEST(StrategyParity, TiedLlamaDeferringItsHeadMatchesSingleProcess) {
  const int n = test::world().size();
  TrainOptions base = test::tiny_options(10);
  base.model.name = "llama-tiny";
  base.model.overrides["tie_embeddings"] = 1;
  base.data.batch = n;
  const RunResult reference = test::train_single_process(base);
  ASSERT_LT(reference.losses.back(), reference.losses.front());
  for (const StrategyOptions& s : strategies_for(n)) {
    TrainOptions o = base;
    o.plan.strategy = s;
    expect_same_run(test::train(o, test::world()), reference, "tied llama-tiny " + describe(s));
  }
}

TEST(StrategyParity, GradAccumulationEqualsLargeBatch) {
  const int n = test::world().size();
  for (StrategyKind k : {StrategyKind::ddp, StrategyKind::zero3}) {
    TrainOptions large = test::tiny_options(10);
    large.plan.strategy.kind = k;
    large.data.batch = 4 * n;
    TrainOptions accumulated = large;
    accumulated.data.batch = n;
    accumulated.data.grad_accum = 4;
    expect_same_run(test::train(accumulated, test::world()), test::train(large, test::world()),
                    std::string(strategy_name(k)) + " grad-accum 4");
  }
}

TEST(StrategyParity, UnevenRankBatchesEqualEvenSplit) {
  if (test::world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  for (const std::string& model : kModels)
    for (StrategyKind k : {StrategyKind::ddp, StrategyKind::zero3}) {
      TrainOptions even = test::tiny_options(10);
      even.model.name = model;
      even.plan.strategy.kind = k;
      TrainOptions uneven = even;
      uneven.data.rank_batches = {3, 1, 2, 2};
      even.data.rank_batches = {2, 2, 2, 2};
      expect_same_run(test::train(uneven, test::world()), test::train(even, test::world()),
                      model + " " + std::string(strategy_name(k)) + " rank-batches 3,1,2,2");
    }
}

// Evaluation between steps (--eval-every): every strategy gives the single process's held-out losses, and
// training is as it was without it, bit for bit and in bytes moved: the forward-only passes prefetch
// along a gather order of their own, not training's.
TEST(StrategyParity, EvaluationMatchesSingleProcessAndLeavesTrainingAsItWas) {
  const int n = test::world().size();
  for (const std::string& model : kModels) {
    TrainOptions plain = test::tiny_options(6);
    plain.model.name = model;
    TrainOptions evaluated = plain;
    evaluated.eval.source = "default";
    evaluated.eval.every = 2;  // after steps 2, 4 and 6
    evaluated.eval.batches = 2;
    const RunResult reference = test::train_single_process(evaluated);
    ASSERT_EQ(reference.eval_losses.size(), 3u) << model;
    EXPECT_LT(reference.eval_losses.back(), reference.eval_losses.front()) << model << ": it learns";
    for (const StrategyOptions& s : std::vector<StrategyOptions>{{StrategyKind::ddp, {}, true, 2},
                                                                 {StrategyKind::zero3, {}, true, 2},
                                                                 {StrategyKind::zero3, {}, false, 2},
                                                                 {StrategyKind::hybrid, ShardGroupRequest::equal(n % 2 ? 1 : 2), true, 2}}) {
      const std::string what = model + " " + describe(s);
      plain.plan.strategy = evaluated.plan.strategy = s;
      const RunResult with = test::train(evaluated, test::world()), without = test::train(plain, test::world());
      EXPECT_EQ(with.losses, without.losses) << what;
      EXPECT_EQ(with.grad_norms, without.grad_norms) << what;
      EXPECT_EQ(with.params, without.params) << what;
      EXPECT_EQ(with.comm_bytes, without.comm_bytes) << what;
      ASSERT_EQ(with.eval_losses.size(), reference.eval_losses.size()) << what;
      for (size_t e = 0; e < with.eval_losses.size(); ++e)
        EXPECT_LE(std::abs(with.eval_losses[e] - reference.eval_losses[e]) / reference.eval_losses[e], kTolerance)
            << what << ": evaluation " << e;
    }
  }
}

// Runs `plain` and `changed` (the same run but for one setting that must not change the math) and
// expects the same bits: losses, gradient norms and final parameters.
void expect_same_bits(const TrainOptions& plain, const TrainOptions& changed, const std::string& what) {
  const RunResult want = test::train(plain, test::world()), got = test::train(changed, test::world());
  EXPECT_EQ(got.losses, want.losses) << what;
  EXPECT_EQ(got.grad_norms, want.grad_norms) << what;
  EXPECT_EQ(got.params, want.params) << what;
}

// --rank-batches auto re-splits the batch mid-run (rank 1 made to report 4x its compute time through the
// test hook) and the run still equals the single process: which rank computes a sequence changes nothing.
TEST(StrategyParity, AutoRankBatchesResplitAndMatchSingleProcess) {
  const int n = test::world().size();
  for (StrategyKind k : {StrategyKind::ddp, StrategyKind::zero3}) {
    TrainOptions o = test::tiny_options(8);
    o.plan.strategy.kind = k;
    o.data.batch = 4 * n;
    o.data.rank_batches_auto = true;
    o.data.rebalance_every = 2;
    const RunResult got = [&] {
      const test::ScopedHook slow("ZSHARD_TEST_SLOW_RANK", "1:4");
      return test::train(o, test::world());
    }();
    const std::string what = "auto " + std::string(strategy_name(k));
    expect_same_run(got, test::train_single_process(o), what);
    EXPECT_EQ(got.rank_batches.front(), std::vector<int>(n, 4)) << what;
    const std::vector<int>& last = got.rank_batches.back();
    EXPECT_LT(last[1], last[0]) << what << ": the slow rank keeps its share";
    EXPECT_EQ(std::accumulate(last.begin(), last.end(), 0), o.data.batch) << what;
  }
}

// Recomputation runs the same ops on the same inputs under the same gathers: every strategy's losses,
// gradient norms and parameters are the same bits with and without it.
TEST(StrategyParity, RecomputeChangesNoBit) {
  for (const std::string& model : kModels)
    for (const StrategyOptions& s : strategies_for(test::world().size())) {
      TrainOptions plain = test::tiny_options(5);
      plain.model.name = model;
      plain.plan.strategy = s;
      TrainOptions recomputed = plain;
      recomputed.model.recompute = Recompute::blocks;
      expect_same_bits(plain, recomputed, model + " " + describe(s) + " blocks");
    }
}

// An offloaded optimizer runs the same AdamW on a master of its own, copied into the fp32 compute copy.
// With ZSHARD_TEST_OFFLOAD_COPIES=1 the host gradients are buffers of their own, copied as each unit's
// reduction lands, as on a GPU; with two micro-steps only the second one's reductions are final. With
// ZSHARD_TEST_COPY_STREAM=async the copies run on a thread of their own, later than queued, as on a GPU.
TEST(StrategyParity, OffloadedOptimizerChangesNoBit) {
  for (const std::string& model : kModels)
    for (const StrategyOptions& s : strategies_for(test::world().size()))
      for (int accum : {1, 2}) {
        TrainOptions plain = test::tiny_options(5);
        plain.model.name = model;
        plain.plan.strategy = s;
        plain.data.grad_accum = accum;
        const RunResult want = test::train(plain, test::world());
        TrainOptions offloaded = plain;
        offloaded.plan.placement.offload_optimizer = true;
        for (const int copies : {0, 1, 2}) {  // at once into the gradients, at once, on a thread
          const test::ScopedHook own_buffers("ZSHARD_TEST_OFFLOAD_COPIES", copies > 0 ? "1" : "");
          const test::ScopedHook queued("ZSHARD_TEST_COPY_STREAM", copies > 1 ? "async" : "");
          const RunResult got = test::train(offloaded, test::world());
          const std::string what = model + " " + describe(s) + " grad-accum " + std::to_string(accum) +
                                   " offload optimizer" + (copies > 0 ? " with host copies" : "") +
                                   (copies > 1 ? " on a thread" : "");
          EXPECT_EQ(got.losses, want.losses) << what;
          EXPECT_EQ(got.grad_norms, want.grad_norms) << what;
          EXPECT_EQ(got.params, want.params) << what;
        }
      }
}

// Live model-state bytes of a freshly built trainer, max over ranks.
int64_t model_state_bytes(const TrainOptions& o) {
  const int64_t before = Allocator::of(Device::cpu).stats().model_states_live();
  Trainer trainer(o, test::world());
  double bytes = double(Allocator::of(Device::cpu).stats().model_states_live() - before);
  double all[8] = {};
  test::world().all_gather(&bytes, all, 1, DType::f64)->wait();
  return int64_t(*std::max_element(all, all + test::world().size()));
}

TEST(StrategyMemory, MeasuredModelStatesFollowTheFormulas) {
  const int n = test::world().size();
  TrainOptions o = test::tiny_options(1);
  o.model.name = "gpt2";  // big enough that padding is negligible
  o.model.overrides = {{"layers", 2}, {"dim", 256}, {"heads", 4}, {"vocab", 4096}, {"ctx", 128}};
  const int64_t psi = num_params(*build_model(o.model.name, resolve_model_config(o.model)));
  int64_t ddp_bytes = 0;
  for (StrategyKind k : {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2, StrategyKind::zero3}) {
    o.plan.strategy.kind = k;
    const int64_t measured = model_state_bytes(o);
    const int64_t predicted =
        predict_model_states(k, k == StrategyKind::ddp ? 1 : n, psi, DtypePolicy::fp32()).total();
    EXPECT_NEAR(double(measured) / double(predicted), 1.0, 0.05) << strategy_name(k);
    if (k == StrategyKind::ddp) ddp_bytes = measured;
    if (k == StrategyKind::zero3 && n == 4) EXPECT_LE(double(measured), 0.3 * double(ddp_bytes));
  }
}

// ZeRO-Offload's split: the master and Adam m and v (12 bytes per owned parameter) are host bytes, and
// no optimizer state is left in the optimizer category.
TEST(StrategyMemory, OffloadedOptimizerStateIsHostMemory) {
  const int n = test::world().size();
  TrainOptions o = test::tiny_options(1);
  o.plan.placement.offload_optimizer = true;
  const int64_t psi = num_params(*build_model(o.model.name, resolve_model_config(o.model)));
  for (StrategyKind k : {StrategyKind::ddp, StrategyKind::zero2, StrategyKind::zero3}) {
    o.plan.strategy.kind = k;
    const MemStats before = Allocator::of(Device::cpu).stats();
    Trainer trainer(o, test::world());
    const MemStats after = Allocator::of(Device::cpu).stats();
    const ModelStateBytes want =
        predict_model_states(k, k == StrategyKind::ddp ? 1 : n, psi, DtypePolicy::fp32(), true);
    const auto grew = [&](Category c) { return double(after.live[int(c)] - before.live[int(c)]); };
    EXPECT_NEAR(grew(Category::host) / double(want.host), 1.0, 0.05) << strategy_name(k);
    EXPECT_EQ(grew(Category::optimizer), 0.0) << strategy_name(k);
    EXPECT_NEAR(grew(Category::params) / double(want.params), 1.0, 0.05) << strategy_name(k);
  }
}

}  // namespace
}  // namespace zshard
