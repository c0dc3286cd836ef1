// The set-up memory check: a run whose estimate exceeds the budget is refused in one line with the
// estimate, the budget and the nearest configuration that fits; a run that fits passes untouched.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <zshard/model_registry.h>

#include "shard/memory/divisors.h"
#include "shard/memory/fit_check.h"
#include "shard/memory/estimator.h"
#include "tests/support/test_support.h"

namespace zshard {
namespace {

using ::testing::HasSubstr;
using test::error_of;

struct Case {
  PlanOptions plan;
  BatchShape shape;
  std::shared_ptr<Model> model = build_model("gpt2", model_config("gpt2"));
  int world = 4;
  ShardPlan resolved() const { return plan_for_world(plan, world); }
};

int64_t estimate(const Case& c, StrategyKind kind, int rank_batch) {
  PlanOptions plan;
  plan.strategy.kind = kind;
  plan.strategy.max_inflight = c.plan.strategy.max_inflight;
  return estimate_memory(estimate_input(plan_for_world(plan, c.world), *c.model, c.shape, rank_batch)).total();
}

std::string check(const Case& c, int64_t budget) {
  const int rank_batch = c.shape.batch / c.world;
  return error_of([&] { check_memory_fits(c.resolved(), *c.model, c.shape, rank_batch, rank_batch, {budget, "test"}); });
}

// The suggestions cut the batch by its divisors: each once, in order, a square's root once, and a global
// batch (--batch times --grad-accum) beyond an int's range.
TEST(MemoryCheck, DivisorsInIncreasingOrder) {
  EXPECT_EQ(divisors(12), (std::vector<int>{1, 2, 3, 4, 6, 12}));
  EXPECT_EQ(divisors(36), (std::vector<int>{1, 2, 3, 4, 6, 9, 12, 18, 36}));
  EXPECT_EQ(divisors(1), std::vector<int>{1});
  EXPECT_EQ(divisors(2147483647), (std::vector<int>{1, 2147483647}));  // a prime: the loop ends at its root
  const int64_t global = int64_t(1) << 40;
  const std::vector<int64_t> d = divisors(global);
  ASSERT_EQ(d.size(), 41u);
  for (int i = 0; i <= 40; ++i) EXPECT_EQ(d[size_t(i)], int64_t(1) << i);
}

Case gpt2_case() {
  Case c;
  c.shape.batch = 32;
  c.shape.seq = 1024;
  c.plan.strategy.kind = StrategyKind::ddp;
  return c;
}

TEST(MemoryCheck, FittingRunPasses) {
  const Case c = gpt2_case();
  EXPECT_EQ(check(c, estimate(c, StrategyKind::ddp, 8)), "(no error)");
  EXPECT_EQ(check(c, -1), "(no error)") << "an unknown budget checks nothing";
}

TEST(MemoryCheck, SuggestsMoreAccumulationKeepingTheGlobalBatch) {
  const Case c = gpt2_case();
  // Room for 4 sequences per rank, not 8: half the micro-batch, twice the accumulation.
  const std::string e = check(c, estimate(c, StrategyKind::ddp, 4));
  EXPECT_THAT(e, HasSubstr("does not fit in memory: this rank needs about "));
  EXPECT_THAT(e, HasSubstr("(test)"));
  EXPECT_THAT(e, HasSubstr("nearest that fits: --batch 16 --grad-accum 2 (the same global batch)"));
  EXPECT_THAT(e, HasSubstr("--mem-check off skips this check"));
}

TEST(MemoryCheck, SuggestsAStrategyThatShardsMore) {
  Case c = gpt2_case();
  c.shape.batch = 4;  // one sequence per rank: only sharding can help
  const int64_t zero3 = estimate(c, StrategyKind::zero3, 1);
  ASSERT_LT(zero3, estimate(c, StrategyKind::zero2, 1));
  EXPECT_THAT(check(c, zero3), HasSubstr("nearest that fits: --strategy zero3"));
}

TEST(MemoryCheck, SuggestsMoreRanksWhenNothingFitsOnThese) {
  Case c = gpt2_case();
  c.shape.batch = 4;
  c.shape.grad_accum = 4;
  Case wider = c;
  wider.world = 16;
  const int64_t zero3_on_16 = estimate(wider, StrategyKind::zero3, 1);
  ASSERT_LT(zero3_on_16, estimate(c, StrategyKind::zero3, 1));
  EXPECT_THAT(check(c, zero3_on_16),
              HasSubstr("nothing fits on 4 rank(s); nearest that fits: --strategy zero3 on 16 ranks with this much "
                        "memory each (--batch 16 --grad-accum 1)"));
  EXPECT_THAT(check(c, 1 << 20), HasSubstr("no strategy or batch split fits on 4 rank(s) or on more of them"));
}

// 13 sequences (a prime) cannot be cut: on 8 ranks some rank takes 2 of them, which is what must fit.
TEST(MemoryCheck, MoreRanksAreSuggestedOnlyWithTheBatchTheyWouldTake) {
  Case c = gpt2_case();
  c.shape.batch = 13;
  Case wider = c;
  wider.world = 8;
  const int64_t two_on_8 = estimate(wider, StrategyKind::zero3, 2);
  ASSERT_LT(estimate(wider, StrategyKind::zero3, 1), two_on_8);
  EXPECT_THAT(check(c, two_on_8), HasSubstr("nothing fits on 4 rank(s); nearest that fits: --strategy zero3 on 8 "
                                            "ranks with this much memory each (--mem-check"));
  EXPECT_THAT(check(c, two_on_8 - 1), HasSubstr("no strategy or batch split fits on 4 rank(s) or on more of them"));
}

// --rank-batches 1,1,1,29 of 32 sequences: the same world fits them split evenly, before more ranks.
TEST(MemoryCheck, UnevenRankBatchesAreSplitEvenlyFirst) {
  Case c = gpt2_case();
  c.shape.even = false;
  const auto uneven = [&](int64_t budget) {
    return error_of([&] { check_memory_fits(c.resolved(), *c.model, c.shape, 29, 29, {budget, "test"}); });
  };
  EXPECT_THAT(uneven(estimate(c, StrategyKind::ddp, 8)), HasSubstr("nearest that fits: without --rank-batches (--mem-check"));
  EXPECT_THAT(uneven(estimate(c, StrategyKind::ddp, 4)),
              HasSubstr("nearest that fits: --batch 16 --grad-accum 2 without --rank-batches (the same global batch)"));
}

// Checked by arithmetic, without a GPU: the cuda estimate's host part against a host budget.
TEST(MemoryCheck, OffloadedOptimizerMustFitInHostMemory) {
  Case c = gpt2_case();
  c.plan.placement = {Device::cuda, DType::bf16, DType::f32, true};
  c.plan.strategy.kind = StrategyKind::zero3;
  EstimateInput in = estimate_input(c.resolved(), *c.model, c.shape, 1);
  const int64_t host = estimate_memory(in).host_apart();
  ASSERT_GT(host, 0);
  const auto host_check = [&](const Case& k, int64_t budget) {
    return error_of([&] { check_host_memory_fits(k.resolved(), *k.model, k.shape, {budget, "test host"}); });
  };
  EXPECT_EQ(host_check(c, host), "(no error)");
  EXPECT_EQ(host_check(c, -1), "(no error)") << "an unknown budget checks nothing";
  const std::string e = host_check(c, host - 1);
  EXPECT_THAT(e, HasSubstr("--offload optimizer does not fit in host memory: this rank needs about "));
  EXPECT_THAT(e, HasSubstr("(test host); nearest that fits: --strategy zero3 on 8 ranks with this much host "
                           "memory each, or --offload none"));
  Case hybrid = c;  // groups of 2 hold twice zero3's host shard on 4 ranks
  hybrid.plan.strategy = {StrategyKind::hybrid, ShardGroupRequest::equal(2), true, 2};
  EXPECT_THAT(host_check(hybrid, host),
              HasSubstr("nearest that fits: --strategy zero3 (without --shard-group), or --offload none"));
  // With the snapshot of asynchronous saves, held by group 0 alone: hybrid in groups of 3 and 2 on 5 ranks,
  // a rank of group 0 holds a third of the states and needs more host memory than group 1's, with half.
  Case unequal = c;
  unequal.world = 5;
  unequal.plan.strategy = {StrategyKind::hybrid, ShardGroupRequest::list({3, 2}), true, 2};
  unequal.shape.checkpoint_snapshot = true;
  EstimateInput first = estimate_input(unequal.resolved(), *unequal.model, unequal.shape, 1);
  first.group = 0;
  EstimateInput second = first;
  second.group = 1;
  const int64_t first_host = estimate_memory(first).host_apart();
  ASSERT_GT(first_host, estimate_memory(second).host_apart());
  EXPECT_EQ(host_check(unequal, first_host), "(no error)");
  EXPECT_THAT(host_check(unequal, first_host - 1),
              HasSubstr("--offload optimizer with the snapshot of --save-mode async does not fit in host memory"));
  Case cpu = c;  // the cpu's host bytes are its device's, checked by check_memory_fits
  cpu.plan.placement.device = Device::cpu;
  cpu.plan.placement.param_dtype = DType::f32;
  EXPECT_EQ(host_check(cpu, 1), "(no error)");
}

TEST(MemoryCheck, BudgetOfThisHostIsKnown) {
  const MemoryBudget b = usable_memory(Device::cpu, 2);
  ASSERT_GT(b.bytes, 0);
  EXPECT_THAT(b.source, HasSubstr("shared by 2 ranks on this host"));
  EXPECT_NEAR(double(usable_memory(Device::cpu, 1).bytes) / double(b.bytes), 2.0, 0.1);
}

}  // namespace
}  // namespace zshard
