// A training step keeps its loss, its gradient norm and the clip factor in device memory and reads them
// once, at its end. Against the step computed the way it was before, which read each micro-step's loss
// and the norm's sum back to the host and clipped there (below, with the CPU kernels and collectives on
// host values): the same losses, norms and weights, bit for bit, on every strategy, mixed precision and
// the offloaded optimizer. One wait for the device per step (ZSHARD_TEST_COUNT_DEVICE_WAITS counts them
// on the cpu), a micro-step's loss read only when the loop reads it, and a non-finite step skipped by
// AdamW itself: weights and Adam state untouched, every rank stopped alike.
// zshard-test-np: 1 2 3 4
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <zshard/engine.h>

#include "kernels/cpu/ops.h"
#include "kernels/test_hooks.h"
#include "models/gpt2.h"
#include "shard/engine_internals.h"
#include "tests/support/test_support.h"
#include "tests/support/training_runs.h"

namespace zshard {
namespace {

using ::testing::HasSubstr;
using test::world;

constexpr int kB = 2, kT = 8, kMicroSteps = 2;
constexpr uint64_t kSeed = 5;

int64_t tokens_per_step() { return int64_t(kB) * kT * kMicroSteps * world().size(); }

// Micro-step k of step s on this rank: tokens of its own.
struct Tokens {
  std::vector<int32_t> inputs, targets;
  Tokens(int s, int k) {
    const int salt = 31 * world().rank() + 7 * s + 3 * k;
    for (int i = 0; i < kB * kT; ++i) {
      inputs.push_back((7 * i + salt + 3) % 256);
      targets.push_back((5 * i + 2 * salt + 10) % 256);
    }
  }
  Batch batch() const { return {inputs.data(), targets.data(), kB, kT}; }
};

// Clipping on, off, and with a bound above the norm.
AdamW hyper_parameters(int s) {
  const float clips[] = {0.5f, 0.0f, 100.0f};
  return {.lr = 1e-2f, .weight_decay = 0.1f, .grad_clip = clips[s % 3]};
}

struct Run {
  std::vector<double> losses, norms;
  std::vector<float> params;  // every unit's full parameters after the last step
};

std::vector<float> all_params(ShardedParams& p) {
  std::vector<float> all;
  for (int u = 0; u < p.num_units(); ++u) {
    const FlatValues unit = p.full_unit_params(u);
    all.insert(all.end(), unit.begin(), unit.end());
  }
  return all;
}

// The sum over the world of a value each rank of a shard group holds a part of, as the host added it up:
// the shard group's parts (the first group's where groups differ), in rank order.
double host_partition_sum(const ShardGroups& groups, double part) {
  std::vector<double> all(size_t(world().size()));
  world().all_gather(&part, all.data(), 1, DType::f64)->wait();
  const int group = groups.equal() ? groups.group_of(world().rank()) : 0;
  double sum = 0;
  for (int r = 0; r < groups.size(group); ++r) sum += all[size_t(groups.first_rank(group) + r)];
  return sum;
}

// The steps as the engine took them when it read back each micro-step's loss and the norm's sum: the
// losses summed and all-reduced with the tokens on the host, the norm's sums per segment on the host,
// the clip factor there, and AdamW segment by segment with the CPU kernel.
template <class G>
Run host_read_steps_of(const ShardPlan& plan, int steps) {
  ShardedParams p(test::tiny_gpt2(), world(), plan, kSeed);
  Run run;
  const int shard = p.shard_index();
  for (int s = 0; s < steps; ++s) {
    double loss_sum = 0;
    for (int k = 0; k < kMicroSteps; ++k) {
      const Tokens tokens(s, k);
      p.begin_micro_step(k == kMicroSteps - 1);
      double loss = test::tiny_gpt2().forward_backward(p, tokens.batch(), float(1.0 / double(tokens_per_step())));
      p.end_micro_step();
      loss += p.take_loss_sum();
      loss_sum += loss;
    }
    double sums[2] = {double(kB * kT * kMicroSteps), loss_sum};
    world().all_reduce(sums, 2, DType::f64, comm::ReduceOp::sum)->wait();
    double own = 0;
    for (int i = 0; i < p.num_units(); ++i) {
      const G* g = p.owned_grads(i).data<G>();
      const int64_t base = p.layout(i).shard_begin(shard);
      for (const FlatSegment& seg : p.layout(i).shard_segments(shard))
        own += cpu::sum_squares(g + (seg.flat_begin - base), size_t(seg.count));
    }
    const double norm = std::sqrt(host_partition_sum(p.groups(), own));
    const AdamW hp = hyper_parameters(s);
    float clip_scale = 1.0f;
    if (hp.grad_clip > 0 && hp.grad_clip / (norm + 1e-6) < 1.0) clip_scale = float(hp.grad_clip / (norm + 1e-6));
    for (int i = 0; i < p.num_units(); ++i) {
      const G* g = p.owned_grads(i).data<G>();
      float *master = p.owned_params(i).data<float>(), *m = p.adam_m(i).data<float>(), *v = p.adam_v(i).data<float>();
      const int64_t base = p.layout(i).shard_begin(shard);
      for (const FlatSegment& seg : p.layout(i).shard_segments(shard)) {
        const bool decays = p.layout(i).spec().params[size_t(seg.param)].weight_decay;
        const cpu::AdamWParams segment_hp{hp.lr, hp.beta1, hp.beta2, hp.eps, decays ? hp.weight_decay : 0, s + 1,
                                          clip_scale};
        const int64_t at = seg.flat_begin - base;
        cpu::adamw_step(master + at, g + at, m + at, v + at, size_t(seg.count), segment_hp);
      }
    }
    p.discard_gradients();
    p.sync_resident_params();
    run.losses.push_back(sums[1] / double(tokens_per_step()));
    run.norms.push_back(norm);
  }
  run.params = all_params(p);
  return run;
}

// The offloaded optimizer gives the same bits as the one on the device.
Run host_read_steps(ShardPlan plan, int steps) {
  plan.placement.offload_optimizer = false;
  return plan.placement.param_dtype == DType::bf16 ? host_read_steps_of<bf16>(plan, steps)
                                                   : host_read_steps_of<float>(plan, steps);
}

Run engine_steps(const ShardPlan& plan, int steps) {
  Engine engine(test::tiny_gpt2(), world(), plan,
                {.seed = kSeed, .grad_accum = kMicroSteps, .tokens_per_step = tokens_per_step()});
  Run run;
  for (int s = 0; s < steps; ++s) {
    for (int k = 0; k < kMicroSteps; ++k) engine.forward_backward(Tokens(s, k).batch());
    const StepStats stats = engine.step(hyper_parameters(s));
    run.losses.push_back(stats.loss);
    run.norms.push_back(stats.grad_norm);
  }
  run.params = all_params(EngineInternals::params(engine));
  return run;
}

void expect_same_bits(const Run& got, const Run& want, const std::string& what) {
  EXPECT_EQ(got.losses, want.losses) << what;
  EXPECT_EQ(got.norms, want.norms) << what;
  ASSERT_EQ(got.params.size(), want.params.size()) << what;
  EXPECT_EQ(std::memcmp(got.params.data(), want.params.data(), got.params.size() * sizeof(float)), 0)
      << what << ": the weights differ";
}

TEST(StepSums, LossesNormsAndWeightsAreTheHostReadStepsBitForBit) {
  constexpr int kSteps = 3;
  std::vector<std::pair<ShardPlan, std::string>> plans;
  for (const StrategyOptions& s : test::strategies_for(world().size()))
    plans.emplace_back(test::plan(s), test::describe(s));
  plans.emplace_back(test::plan({StrategyKind::zero3}, {.param_dtype = DType::bf16}), "zero3 bf16");
  plans.emplace_back(test::plan({StrategyKind::zero2}, {.offload_optimizer = true}), "zero2 offloaded");
  plans.emplace_back(test::plan({StrategyKind::zero2}, {.param_dtype = DType::bf16, .offload_optimizer = true}),
                     "zero2 bf16 offloaded");
  for (const auto& [plan, what] : plans)
    expect_same_bits(engine_steps(plan, kSteps), host_read_steps(plan, kSteps), what);
}

std::unique_ptr<Engine> zero3_engine(const Placement& placement = {}) {
  const EngineOptions options{.seed = kSeed, .grad_accum = kMicroSteps, .tokens_per_step = tokens_per_step()};
  return std::make_unique<Engine>(test::tiny_gpt2(), world(), test::plan({StrategyKind::zero3}, placement), options);
}

// The host waits for the device once a step, when step() reads its sums; a micro-step never does.
TEST(StepSums, AStepWaitsForTheDeviceOnce) {
  const test::ScopedHook count("ZSHARD_TEST_COUNT_DEVICE_WAITS", "1");
  const std::unique_ptr<Engine> engine = zero3_engine();
  for (int s = 0; s < 3; ++s) {
    const int64_t before = device_waits_counted();
    for (int k = 0; k < kMicroSteps; ++k) engine->forward_backward(Tokens(s, k).batch());
    EXPECT_EQ(device_waits_counted() - before, 0) << "step " << s + 1 << ": the micro-steps waited";
    engine->step(hyper_parameters(s));
    EXPECT_EQ(device_waits_counted() - before, 1) << "step " << s + 1;
  }
}

// A micro-step's loss is the double it always was, read from the device when the loop reads it (one wait),
// then kept on the host from the step's own read until the next step ends.
TEST(StepSums, AMicroStepsLossIsReadWhenTheLoopReadsIt) {
  const test::ScopedHook count("ZSHARD_TEST_COUNT_DEVICE_WAITS", "1");
  const std::unique_ptr<Engine> engine = zero3_engine();
  const int64_t before = device_waits_counted();
  const MicroStepLoss first = engine->forward_backward(Tokens(0, 0).batch());
  const MicroStepLoss second = engine->forward_backward(Tokens(0, 1).batch());
  const double mine = first;
  EXPECT_EQ(device_waits_counted() - before, 1);
  const StepStats stats = engine->step(hyper_parameters(0));
  EXPECT_EQ(device_waits_counted() - before, 2);
  double global = mine + second.value();
  comm::all_reduce_sum(world(), &global, 1);
  EXPECT_EQ(stats.loss, global / double(tokens_per_step()));
  EXPECT_EQ(first.value(), mine);
  EXPECT_EQ(device_waits_counted() - before, 2) << "read from the step's own read";
  for (int k = 0; k < kMicroSteps; ++k) engine->forward_backward(Tokens(1, k).batch());
  engine->grad_norm();  // reads the next step's sums
  EXPECT_EQ(first.value(), mine) << "kept until the next step ends";
  engine->step(hyper_parameters(1));
  EXPECT_THAT(test::error_of([&] { first.value(); }),
              HasSubstr("a micro-step's loss is kept until the end of the step after its own"));
}

// A NaN in the weights: AdamW skips the step on the device (or, offloaded, is not run), every rank stops
// with the same error, and the weights and Adam state are as they were; the step's gradients are dropped,
// so the loop can go on once it has repaired the weights.
TEST(StepSums, ANonFiniteStepLeavesWeightsAndAdamStateAsTheyWere) {
  for (const Placement& placement : {Placement{}, Placement{.offload_optimizer = true}}) {
    SCOPED_TRACE(placement.offload_optimizer ? "offloaded" : "on the device");
    const std::unique_ptr<Engine> engine = zero3_engine(placement);
    ShardedParams& params = EngineInternals::params(*engine);
    for (int k = 0; k < kMicroSteps; ++k) engine->forward_backward(Tokens(0, k).batch());
    engine->step(hyper_parameters(0));  // Adam state worth keeping
    const FlatValues good = params.full_unit_params(0);
    FlatValues poisoned = good;
    poisoned[0] = std::numeric_limits<float>::quiet_NaN();
    params.set_unit_params(0, poisoned.data());
    const std::vector<float> weights = all_params(params);
    const auto state = [&] {
      std::vector<float> all;
      for (int u = 0; u < params.num_units(); ++u)
        for (const Tensor& t : {params.adam_m(u), params.adam_v(u)})
          all.insert(all.end(), t.data<float>(), t.data<float>() + t.numel());
      return all;
    };
    const std::vector<float> adam = state();
    for (int k = 0; k < kMicroSteps; ++k) engine->forward_backward(Tokens(1, k).batch());
    EXPECT_THAT(test::error_of([&] { engine->step(hyper_parameters(1)); }),
                HasSubstr("step 2: non-finite loss (loss nan, gradient norm nan); stopped before the optimizer step"));
    EXPECT_EQ(engine->steps_done(), 1);
    const std::vector<float> after = all_params(params), adam_after = state();
    EXPECT_EQ(std::memcmp(after.data(), weights.data(), weights.size() * sizeof(float)), 0) << "weights";
    EXPECT_EQ(adam_after, adam) << "Adam state";
    params.set_unit_params(0, good.data());
    for (int k = 0; k < kMicroSteps; ++k) engine->forward_backward(Tokens(1, k).batch());
    EXPECT_TRUE(std::isfinite(engine->step(hyper_parameters(1)).loss));
    EXPECT_EQ(engine->steps_done(), 2);
  }
}

}  // namespace
}  // namespace zshard
