// Mixed precision on the cpu (--param-dtype bf16: bf16 parameters and gradients, fp32 master and AdamW),
// through the code a GPU runs above its kernels: every strategy trains like the single process, with the
// gradients reduced in fp32 and in bf16 (over MPI, each step of a bf16 sum in fp32); the model states are
// the ZeRO paper's mixed-precision formulas, as the memory report prints them; and bf16 reductions move
// half the bytes of fp32 ones.
//
// The tolerance. A strategy does not change what is computed in bf16, only where some of its roundings
// fall: a rank rounds its partial gradient before the reduction and the reduction rounds each sum, where
// the single process rounds the whole gradient once. Those extra roundings are a subset of the roundings
// that bf16 adds to an fp32 run as a whole (every parameter, activation and gradient), so a strategy may
// move the losses and parameters away from the single process's bf16 run by no more than bf16 moves them
// away from fp32. The test measures that effect (fp32 against bf16, one process, the same steps) and allows
// the parameters all of it (their largest difference is an AdamW step of the other sign, where a gradient
// element is near 0, whatever moved it) and the losses half of it, which also tells a strategy that
// computed in fp32 (off by all of it) from one in bf16. Measured with the tiny models over 10 steps: the
// losses within 1e-4, bf16 itself 4e-4 to 7e-4 away from fp32; the parameters within 0.7 of the effect.
// zshard-test-np: 1 2 3 4
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include <zshard/memory_report.h>

#include "tests/support/test_support.h"
#include "tests/support/training_runs.h"

namespace zshard {
namespace {

using test::describe;
using test::RunResult;
using test::strategies_for;

TrainOptions mixed(const std::string& model, DType reduce) {
  TrainOptions o = test::tiny_options(10);
  o.model.name = model;
  o.plan.placement.param_dtype = DType::bf16;
  o.plan.placement.reduce_dtype = reduce;
  return o;
}

double max_rel(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(b[i]));
  return worst;
}

TEST(MixedPrecision, EveryStrategyMatchesTheSingleProcessWithinBf16sOwnEffect) {
  for (const std::string& model : {"tiny", "llama-tiny"}) {
    const RunResult reference = test::train_single_process(mixed(model, DType::f32));
    TrainOptions fp32 = mixed(model, DType::f32);
    fp32.plan.placement.param_dtype = DType::f32;
    const RunResult full_precision = test::train_single_process(fp32);
    const double loss_effect = max_rel(full_precision.losses, reference.losses);
    const double param_effect = test::max_rel_diff(full_precision.params, reference.params);
    ASSERT_GT(loss_effect, 1e-4) << model << ": bf16 computes like fp32; is it bf16 at all?";
    ASSERT_LT(reference.losses.back(), reference.losses.front()) << model << ": it trains";
    for (DType reduce : {DType::f32, DType::bf16})
      for (const StrategyOptions& s : strategies_for(test::world().size())) {
        TrainOptions o = mixed(model, reduce);
        o.plan.strategy = s;
        const RunResult got = test::train(o, test::world());
        const std::string what = model + " " + describe(s) + " reduce " + std::string(dtype_name(reduce));
        ASSERT_EQ(got.losses.size(), reference.losses.size()) << what;
        EXPECT_LE(max_rel(got.losses, reference.losses), loss_effect / 2) << what << " (bf16 itself: " << loss_effect << ")";
        EXPECT_LE(test::max_rel_diff(got.params, reference.params), param_effect)
            << what << ": final parameters (bf16 itself: " << param_effect << ")";
      }
  }
}

// What the memory report prints for a fresh trainer's model states: its "ratio" lines.
std::string model_state_lines(const TrainOptions& o) {
  Trainer trainer(o, test::world());
  trainer.run(nullptr);
  std::ostringstream out;
  trainer.engine().memory_report().print(out);
  std::string lines, line;
  std::istringstream in(out.str());
  while (std::getline(in, line))
    if (line.rfind("model states per rank", 0) == 0) lines += line + "\n";
  return lines;
}

// The memory report's model states are the mixed-precision formulas, 2 + 2 + 12 bytes per parameter (the
// master and Adam m and v on the host with the optimizer offloaded, beside a bf16 copy of the gradients),
// for every strategy and world, to the byte but for the units' padding.
TEST(MixedPrecision, MemoryReportModelStatesAreTheMixedPrecisionFormulas) {
  for (StrategyKind k : {StrategyKind::ddp, StrategyKind::zero2, StrategyKind::zero3, StrategyKind::hybrid})
    for (bool offload : {false, true}) {
      TrainOptions o = mixed("tiny", DType::bf16);
      o.model.name = "gpt2";  // big enough that the units' padding is below the ratio's last digit
      o.model.overrides = {{"layers", 2}, {"dim", 128}, {"heads", 4}, {"vocab", 2048}, {"ctx", 64}};
      o.optimizer.steps = 1;
      o.plan.strategy.kind = k;
      if (k == StrategyKind::hybrid) o.plan.strategy.shard_group = ShardGroupRequest::equal(1);
      o.plan.placement.offload_optimizer = offload;
      const std::string lines = model_state_lines(o);
      EXPECT_NE(lines.find("ratio 1.000\n"), std::string::npos)
          << strategy_name(k) << (offload ? " offloaded" : "") << ":\n" << lines;
      if (offload) EXPECT_NE(lines.find(" + host "), std::string::npos) << lines;
    }
}

// Per collective, the bytes of one run: bf16 reductions move half of what fp32 ones do, in as many calls
// (to the byte but for each call's bus bytes rounding down, (n-1)/n of a buffer); the parameters'
// all-gathers are bf16 either way.
TEST(MixedPrecision, Bf16ReductionsMoveHalfTheBytes) {
  if (test::world().size() == 1) GTEST_SKIP() << "one rank moves nothing";
  for (StrategyKind k : {StrategyKind::ddp, StrategyKind::zero2, StrategyKind::zero3, StrategyKind::hybrid}) {
    comm::CommStats stats[2];
    for (DType reduce : {DType::f32, DType::bf16}) {
      TrainOptions o = mixed("tiny", reduce);
      o.optimizer.steps = 2;
      o.plan.strategy.kind = k;
      if (k == StrategyKind::hybrid) o.plan.strategy.shard_group = ShardGroupRequest::equal(1);
      Trainer trainer(o, test::world());
      trainer.run(nullptr);
      stats[reduce == DType::bf16] = trainer.engine().comm_stats();
    }
    const auto bytes = [&](int i, comm::Collective c) { return stats[i].bytes[int(c)]; };
    for (comm::Collective c : {comm::Collective::reduce_scatter, comm::Collective::all_reduce}) {
      const int64_t calls = stats[0].calls[int(c)];
      EXPECT_EQ(stats[1].calls[int(c)], calls) << strategy_name(k) << " " << comm::collective_name(c);
      EXPECT_NEAR(double(2 * bytes(1, c)), double(bytes(0, c)), double(2 * calls))
          << strategy_name(k) << " " << comm::collective_name(c);
    }
    EXPECT_GT(bytes(0, comm::Collective::reduce_scatter) + bytes(0, comm::Collective::all_reduce), 0) << strategy_name(k);
    EXPECT_EQ(bytes(1, comm::Collective::all_gather), bytes(0, comm::Collective::all_gather)) << strategy_name(k);
  }
}

}  // namespace
}  // namespace zshard
