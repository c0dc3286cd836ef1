// Secondary groups (--secondary-shard, ZeRO++'s hpZ) under zero3: backward gathers each unit from the
// shares kept after its forward, inside groups of 2, so a run computes with the very weights plain zero3
// computes with, bit for bit, in fp32 and bf16, with frozen parameters, quantized gathers and reductions,
// and gradient accumulation; the run holds the shares, within the estimator's bound; and every value or
// combination that would be another option's behaviour, or none, is refused with one line.
// zshard-test-np: 4
#include <gtest/gtest.h>

#include "kernels/allocator.h"
#include "shard/engine_internals.h"
#include "shard/memory/estimator.h"
#include "shard/memory/fit_check.h"
#include "shard/plan_internals.h"
#include "tests/support/test_support.h"
#include "tests/support/training_runs.h"

namespace zshard {
namespace {

StrategyOptions zero3(GatherQuantization gathers = GatherQuantization::none,
                      ReductionQuantization reductions = ReductionQuantization::none) {
  StrategyOptions s{StrategyKind::zero3};
  s.quantize_gathers = gathers;
  s.quantize_reductions = reductions;
  return s;
}

StrategyOptions with_pairs(StrategyOptions s) {
  s.secondary_shard = {SecondaryShard::Kind::size, 2};
  return s;
}

TEST(SecondaryShard, TrainsBitForBitAsZero3) {
  struct Case {
    std::string model;
    DType dtype;
    StrategyOptions strategy;
    std::vector<std::string> freeze;
  };
  const std::vector<Case> cases = {
      {"tiny", DType::f32, zero3(), {}},
      {"tiny", DType::bf16, zero3(), {"wpe.weight", "h.0.mlp.*"}},
      {"llama-tiny", DType::f32, zero3(), {}},
      {"tiny", DType::f32, zero3(GatherQuantization::int8, ReductionQuantization::int4), {"h.0.mlp.*"}},
      {"llama-tiny", DType::bf16, zero3(GatherQuantization::int8, ReductionQuantization::int8), {}},
  };
  for (const Case& c : cases) {
    TrainOptions o = test::tiny_options(3);
    o.model.name = c.model;
    o.model.freeze = c.freeze;
    o.plan.placement.param_dtype = c.dtype;
    o.data.grad_accum = 2;
    o.plan.strategy = c.strategy;
    const test::RunResult plain = test::train(o, test::world());
    o.plan.strategy = with_pairs(c.strategy);
    const test::RunResult paired = test::train(o, test::world());
    const std::string what = c.model + " " + std::string(dtype_name(c.dtype)) + " " + test::describe(c.strategy);
    ASSERT_EQ(paired.losses.size(), 3u) << what;
    EXPECT_EQ(paired.losses, plain.losses) << what;
    EXPECT_EQ(paired.grad_norms, plain.grad_norms) << what;
    EXPECT_EQ(paired.params, plain.params) << what;
    // Backward's gathers moved inside the pairs: half their elements cross per rank instead of three
    // quarters, so the run moved less (unquantized gathers) or more (the pairs' gathers are not quantized).
    EXPECT_NE(paired.comm_bytes, plain.comm_bytes) << what;
  }
}

int64_t comm_peak() { return Allocator::of(Device::cpu).stats().peak[int(Category::comm)]; }
int64_t comm_live() { return Allocator::of(Device::cpu).stats().live[int(Category::comm)]; }

// The shares one rank keeps: a pair's half of every unit's padded buffer, fp32.
int64_t share_bytes(const ShardedParams& params) {
  int64_t bytes = 0;
  for (int u = 0; u < params.num_units(); ++u) bytes += 4 * ((params.layout(u).padded_numel() + 1) / 2);
  return bytes;
}

// One training step's comm peak above what was live before it (when reductions land moves it from run to
// run), and the estimator's comm prediction (gathered units in flight and comm buffers) for the same plan.
struct CommMemory {
  int64_t measured, predicted, shares;
};
CommMemory comm_memory(const StrategyOptions& strategy) {
  TrainOptions o = test::tiny_options(1);
  o.model.overrides["layers"] = 6;  // enough units that the shares kept add up
  o.plan.strategy = strategy;
  Trainer trainer(o, test::world());
  const int64_t before = comm_live();
  Allocator::of(Device::cpu).reset_peaks();
  trainer.run(nullptr);
  const MemoryEstimate e = estimate_memory(
      estimate_input(trainer.plan(), trainer.model(), {o.data.batch, o.data.seq}, o.data.batch / test::world().size()));
  return {comm_peak() - before, e.gathered_in_flight + e.comm_buffers,
          share_bytes(EngineInternals::params(trainer.engine()))};
}

TEST(SecondaryShard, SharesAreHeldAndTheEstimatorBoundsThem) {
  const CommMemory plain = comm_memory(zero3()), paired = comm_memory(with_pairs(zero3()));
  // Every unit's share is alive at the end of forward, the last unit's gathered copy beside them.
  // At the end of forward every unit's share is alive, beside the last unit's gathered copy; plain zero3
  // holds no such thing, and the estimator's bound holds for both.
  EXPECT_GE(paired.measured, paired.shares);
  EXPECT_LE(plain.measured, plain.predicted);
  EXPECT_LE(paired.measured, paired.predicted);
  EXPECT_GT(paired.predicted - plain.predicted, 0);
  EXPECT_LE(paired.predicted - plain.predicted, paired.shares);
}

TEST(SecondaryShard, RefusedWhereItWouldBeAnotherOptionOrNothing) {
  const auto refusal = [](StrategyOptions s, int world) {
    return test::error_of([&] { plan_for_world({s}, world); });
  };
  StrategyOptions s = with_pairs(zero3());
  s.kind = StrategyKind::hybrid;
  s.shard_group = ShardGroupRequest::equal(2);
  EXPECT_EQ(refusal(s, 4),
            "--secondary-shard is only for --strategy zero3 (hybrid's gathers already stay inside its shard group: "
            "give --shard-group the secondary group's size instead)");
  for (StrategyKind k : {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2}) {
    s = with_pairs(zero3());
    s.kind = k;
    EXPECT_EQ(refusal(s, 4), "--secondary-shard is only for --strategy zero3") << strategy_name(k);
  }
  s = with_pairs(zero3());
  s.reshard_after_forward = false;
  EXPECT_EQ(refusal(s, 4),
            "--secondary-shard needs --reshard-after-forward true: without resharding the whole unit is kept from "
            "forward to backward, and there is nothing to partition");
  EXPECT_EQ(refusal(with_pairs(zero3()), 3),
            "--secondary-shard 2 does not divide the world size 3 (secondary groups are runs of N consecutive ranks)");
  EXPECT_EQ(refusal(with_pairs(zero3()), 2),
            "--secondary-shard 2: a secondary group of the whole world is the shard group itself, which is "
            "--reshard-after-forward true");
  EXPECT_EQ(test::error_of([] { parse_secondary_shard("1"); }),
            "--secondary-shard 1: a secondary group of one rank keeps whole units from forward to backward, which "
            "is --reshard-after-forward false");
  EXPECT_EQ(test::error_of([] { parse_secondary_shard("rack"); }),
            "--secondary-shard: unknown value 'rack' (valid: none, host, or a group size N >= 2)");
  s = zero3();
  s.secondary_shard = {SecondaryShard::Kind::host, 0};
  EXPECT_EQ(refusal(s, 4),
            "--secondary-shard host: the hosts decide host groups, and this plan has none (give the ranks per host, "
            "e.g. 8)");
  EXPECT_EQ(test::error_of([&] { plan_on_hosts({s}, {1, 1, 1}); }),
            "--secondary-shard host: every host runs one rank, so each would keep whole units from forward to "
            "backward, which is --reshard-after-forward false");
}

TEST(SecondaryShard, HostGroupsAreTheHostsRanks) {
  StrategyOptions s = zero3();
  s.secondary_shard = {SecondaryShard::Kind::host, 0};
  EXPECT_EQ(plan_on_hosts({s}, {2, 2}).secondary_groups->sizes(), (std::vector<int>{2, 2}));
  EXPECT_EQ(plan_on_hosts({s}, {4, 2, 1}).secondary_groups->sizes(), (std::vector<int>{4, 2, 1}));
  // One host: its group would be the shard group itself, so the run is plain zero3.
  EXPECT_FALSE(plan_on_hosts({s}, {4}).secondary_groups.has_value());
}

}  // namespace
}  // namespace zshard
