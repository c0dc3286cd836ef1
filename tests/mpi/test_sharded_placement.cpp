// ShardedParams with bf16 parameters and gradients, run on the host. The model states follow the ZeRO
// paper's mixed-precision formulas, the fp32 master shards hold the initial values exactly and the bf16
// compute copy (resident or gathered) is their rounding, and bf16 gradients reduced in fp32 or in bf16
// land in the owned shard, converted back or added. (Training in bf16: tests/mpi/test_mixed_precision.cpp.)
// zshard-test-np: 1 2 3 4
#include <gtest/gtest.h>

#include <algorithm>

#include "kernels/allocator.h"
#include "models/gpt2.h"
#include "shard/memory/zero_arithmetic.h"
#include "shard/sharded_params.h"
#include "tests/support/test_support.h"

namespace zshard {
namespace {

constexpr uint64_t kSeed = 5;
constexpr Placement kMixed{Device::cpu, DType::bf16, DType::f32};

GPT2& tiny_model() {
  static GPT2 model(gpt2_config("tiny"));
  return model;
}

StrategyOptions strategy(StrategyKind kind) {
  return {kind, kind == StrategyKind::hybrid ? ShardGroupRequest::equal(1) : ShardGroupRequest(), true, 2};
}

int64_t live(Category c) { return Allocator::of(Device::cpu).stats().live[int(c)]; }

TEST(ShardedPlacement, MixedPrecisionModelStatesFollowTheFormulas) {
  const int n = test::world().size();
  int64_t psi = 0;
  for (const UnitSpec& u : tiny_model().units()) psi += u.numel();
  for (StrategyKind k : {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2, StrategyKind::zero3}) {
    const int64_t params = live(Category::params), grads = live(Category::grads);
    const int64_t optimizer = live(Category::optimizer);
    ShardedParams p(tiny_model(), test::world(), test::plan(strategy(k), kMixed), kSeed);
    const ModelStateBytes want =
        predict_model_states(k, k == StrategyKind::ddp ? 1 : n, psi, DtypePolicy::mixed_bf16());
    // Only padding (under n elements per unit) separates the measurement from the formula.
    EXPECT_NEAR(double(live(Category::params) - params) / double(want.params), 1.0, 1e-3) << strategy_name(k);
    EXPECT_NEAR(double(live(Category::grads) - grads) / double(want.grads), 1.0, 1e-3) << strategy_name(k);
    EXPECT_NEAR(double(live(Category::optimizer) - optimizer) / double(want.optimizer), 1.0, 1e-3)
        << strategy_name(k);
  }
}

TEST(ShardedPlacement, Bf16ComputeCopyIsTheRoundedFp32Master) {
  ShardedParams reference(tiny_model(), test::world(), test::plan(strategy(StrategyKind::ddp)), kSeed);
  for (StrategyKind k : {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero3, StrategyKind::hybrid}) {
    ShardedParams p(tiny_model(), test::world(), test::plan(strategy(k), kMixed), kSeed);
    EXPECT_EQ(p.compute_dtype(), DType::bf16);
    p.begin_forward_only();  // gathers only: no gradients to hand back
    for (int u = 0; u < p.num_units(); ++u) {
      const FlatValues master = p.full_unit_params(u), want = reference.full_unit_params(u);
      const int64_t numel = p.layout(u).numel();  // the padding depends on the group size
      EXPECT_TRUE(std::equal(want.begin(), want.begin() + numel, master.begin()))
          << strategy_name(k) << " unit " << u;
      const UnitTensors& views = p.gather(u);
      for (size_t i = 0; i < views.size(); ++i) {
        ASSERT_EQ(views[i].dtype(), DType::bf16);
        const bf16* got = views[i].data<bf16>();
        const float* want = master.data() + p.layout(u).offset(int(i));
        int64_t wrong = 0;
        for (int64_t j = 0; j < views[i].numel(); ++j) wrong += got[j].bits != bf16(want[j]).bits;
        EXPECT_EQ(wrong, 0) << strategy_name(k) << " unit " << u << " param " << i;
      }
      p.release(u);
    }
    p.end_micro_step();
  }
}

// Every rank adds rank + 1 into every gradient element; after the reduction, in fp32 or in bf16, the owned
// bf16 shard holds the sum over ranks (small integers, exact in bf16) and its padding stays 0. ddp and
// zero1 land the reduced shard by conversion; the sharded strategies add it.
TEST(ShardedPlacement, Bf16GradientsReducedInFp32AndBf16) {
  const int n = test::world().size(), rank = test::world().rank();
  const float sum = float(n * (n + 1) / 2);
  for (DType reduce : {DType::f32, DType::bf16})
    for (StrategyKind k : {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2, StrategyKind::zero3,
                           StrategyKind::hybrid}) {
      ShardedParams p(tiny_model(), test::world(), test::plan(strategy(k), {Device::cpu, DType::bf16, reduce}), kSeed);
      p.begin_micro_step(true);
      for (int u = p.num_units() - 1; u >= 0; --u) {
        for (const Tensor& g : p.grads(u)) {
          ASSERT_EQ(g.dtype(), DType::bf16);
          std::fill_n(g.data<bf16>(), g.numel(), bf16(float(rank + 1)));
        }
        p.grads_ready(u);
      }
      p.end_micro_step();
      for (int u = 0; u < p.num_units(); ++u) {
        const FlatLayout& layout = p.layout(u);
        const Tensor owned = p.owned_grads(u);
        ASSERT_EQ(owned.dtype(), DType::bf16);
        int64_t wrong = 0;
        for (int64_t j = 0; j < owned.numel(); ++j) {
          const bool real = layout.shard_begin(p.shard_index()) + j < layout.numel();
          wrong += float(owned.data<bf16>()[j]) != (real ? sum : 0.0f);
        }
        EXPECT_EQ(wrong, 0) << strategy_name(k) << " reduce " << dtype_name(reduce) << " unit " << u;
      }
    }
}

}  // namespace
}  // namespace zshard
