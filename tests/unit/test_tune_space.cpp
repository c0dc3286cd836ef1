// zshard-tune's search space, pruning and cost model: arithmetic, checked without running anything.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <set>

#include <zshard/error.h>
#include <zshard/model_registry.h>

#include "runtime/planning/tune_cost.h"
#include "shard/comm_volume.h"
#include "shard/frozen_params.h"

namespace zshard {
namespace {

struct Tiny {
  std::unique_ptr<Model> model = build_model("tiny", model_config("tiny"));
  TuneProblem problem;
  Tiny(int world, int global_batch, int64_t budget = int64_t(1) << 40) {
    problem.model = model.get();
    problem.world = world;
    problem.global_batch = global_batch;
    problem.seq = 32;
    problem.budget = budget;
  }
};

TEST(TuneSpace, EveryCombinationKeepsTheGlobalBatch) {
  Tiny t(4, 16);
  const std::vector<Candidate> all = enumerate_candidates(t.problem, TuneSpace{});
  // 4 sequences per rank: 1, 2 or 4 micro-steps. ddp, zero1, zero2: 3 x 2 checkpointing x 2 offload; zero3
  // and hybrid (groups of 2) four times that again (prefetch depth 2 or 1, resharding or not).
  EXPECT_EQ(all.size(), size_t(3 * 12 + 2 * 12 * 4));
  std::set<std::vector<std::string>> distinct;
  for (const Candidate& c : all) {
    EXPECT_EQ(c.batch * c.grad_accum, 16) << c.label();
    EXPECT_EQ(c.batch % 4, 0) << c.label();
    EXPECT_EQ(c.kind == StrategyKind::hybrid, c.groups == std::vector<int>({2, 2})) << c.label();
    if (!params_sharded(c.kind)) EXPECT_TRUE(c.max_inflight == 2 && c.reshard_after_forward) << c.label();
    distinct.insert(c.train_flags());
  }
  EXPECT_EQ(distinct.size(), all.size());
  // Simplest first: the first candidate is plain ddp at one micro-step.
  EXPECT_EQ(all.front().label(), "ddp b16x1");
}

TEST(TuneSpace, RefusesABatchThatDoesNotCut) {
  Tiny t(4, 10);
  try {
    enumerate_candidates(t.problem, TuneSpace{});
    FAIL() << "10 sequences on 4 ranks";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--global-batch: 10 sequences do not divide over 4 ranks"), std::string::npos)
        << e.what();
  }
  Tiny u(4, 16);
  TuneSpace space;
  space.grad_accums = {1, 3};
  try {
    enumerate_candidates(u.problem, space);
    FAIL() << "--grad-accum 3 of 4 sequences per rank";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--grad-accum 3 does not divide the 4 sequences per rank"), std::string::npos)
        << e.what();
  }
}

TEST(TuneSpace, HybridGroupsAreTheWorldsDivisorsOrTheHosts) {
  Tiny t(8, 8);
  EXPECT_EQ(hybrid_groupings(t.problem), (std::vector<std::vector<int>>{{2, 2, 2, 2}, {4, 4}}));
  t.problem.world = 3;
  EXPECT_TRUE(hybrid_groupings(t.problem).empty());
  t.problem.world = 6;
  t.problem.hosts = {4, 2};
  EXPECT_EQ(hybrid_groupings(t.problem), (std::vector<std::vector<int>>{{4, 2}}));
}

TEST(TuneSpace, TrainFlagsSayEverythingThatIsNotTheDefault) {
  Candidate c;
  EXPECT_EQ(c.train_flags(), (std::vector<std::string>{"--strategy", "ddp", "--batch", "1", "--grad-accum", "1"}));
  c = {StrategyKind::hybrid, {4, 2}, 12, 3, Recompute::blocks, true, 1, false, true, 5};
  EXPECT_EQ(c.train_flags(),
            (std::vector<std::string>{"--strategy", "hybrid", "--batch", "12", "--grad-accum", "3", "--shard-group",
                                      "4,2", "--activation-checkpointing", "blocks", "--offload", "optimizer",
                                      "--max-inflight", "1", "--reshard-after-forward", "false", "--rank-batches",
                                      "auto", "--max-rank-batch", "5"}));
  EXPECT_EQ(c.label(), "hybrid G4,2 b12x3 blocks offload inflight1 keep auto");
}

// The communication modes are dimensions of the space where the strategy takes them; the candidates
// the runtime refuses are not in it.
TEST(TuneSpace, CommunicationModesWhereTheRuntimeTakesThem) {
  Tiny t(4, 16);
  TuneSpace space;
  space.grad_accums = {1};
  space.checkpointing = {Recompute::none};
  space.offload = {false};
  space.max_inflight = {2};
  space.quantize_gathers = {GatherQuantization::none, GatherQuantization::int8};
  space.quantize_reductions = {ReductionQuantization::none, ReductionQuantization::int8, ReductionQuantization::int4};
  const SecondaryShard two{SecondaryShard::Kind::size, 2}, three{SecondaryShard::Kind::size, 3};
  space.secondary_shard = {SecondaryShard{}, two, three, {SecondaryShard::Kind::host, 0}};
  const std::vector<Candidate> all = enumerate_candidates(t.problem, space);
  const auto count = [&](StrategyKind k) {
    return std::count_if(all.begin(), all.end(), [&](const Candidate& c) { return c.kind == k; });
  };
  // ddp takes none of the modes; zero1 and zero2 the reductions (3); hybrid the gathers too, resharding or
  // not (2 x 3 x 2); zero3 those and a secondary shard of 2 when it reshards (12 + 6). Groups of 3 do not
  // divide 4 ranks, a secondary shard needs resharding, and on one host `host` would be plain zero3.
  EXPECT_EQ(count(StrategyKind::ddp), 1);
  EXPECT_EQ(count(StrategyKind::zero1), 3);
  EXPECT_EQ(count(StrategyKind::zero2), 3);
  EXPECT_EQ(count(StrategyKind::hybrid), 12);
  EXPECT_EQ(count(StrategyKind::zero3), 18);
  std::set<std::vector<std::string>> distinct;
  for (const Candidate& c : all) {
    EXPECT_NO_THROW(candidate_plan(t.problem, c)) << c.label();
    if (c.secondary_shard.kind != SecondaryShard::Kind::none)
      EXPECT_TRUE(c.kind == StrategyKind::zero3 && c.secondary_shard == two && c.reshard_after_forward) << c.label();
    if (c.quantize_gathers != GatherQuantization::none) EXPECT_TRUE(params_sharded(c.kind)) << c.label();
    distinct.insert(c.train_flags());
  }
  EXPECT_EQ(distinct.size(), all.size());
  // On two hosts of 2, `host` is the hosts' groups.
  t.problem.hosts = {2, 2};
  space.strategies = {StrategyKind::zero3};
  space.secondary_shard = {{SecondaryShard::Kind::host, 0}};
  const std::vector<Candidate> on_hosts = enumerate_candidates(t.problem, space);
  EXPECT_EQ(on_hosts.size(), size_t(6));  // resharding only: 2 gathers x 3 reductions
  EXPECT_EQ(candidate_plan(t.problem, on_hosts.at(0)).secondary_groups->sizes(), (std::vector<int>{2, 2}));
}

TEST(TuneSpace, AStrategyWithNoCandidateTheRuntimeTakesIsRefused) {
  Tiny t(4, 16);
  TuneSpace space;
  space.strategies = {StrategyKind::zero2, StrategyKind::zero3};
  space.secondary_shard = {{SecondaryShard::Kind::size, 3}};
  try {
    enumerate_candidates(t.problem, space);
    FAIL() << "--secondary-shard 3 on 4 ranks";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "--strategies zero3: no candidate runs as asked: --secondary-shard 3 does not divide the world size 4 "
              "(secondary groups are runs of N consecutive ranks)");
  }
}

TEST(TuneSpace, TrainFlagsCarryTheCommunicationModes) {
  Candidate c{StrategyKind::zero3, {}, 16, 1};
  c.quantize_gathers = GatherQuantization::int8;
  c.quantize_reductions = ReductionQuantization::int4;
  c.secondary_shard = {SecondaryShard::Kind::host, 0};
  EXPECT_EQ(c.train_flags(),
            (std::vector<std::string>{"--strategy", "zero3", "--batch", "16", "--grad-accum", "1", "--quantize-gathers",
                                      "int8", "--quantize-reductions", "int4", "--secondary-shard", "host"}));
  EXPECT_EQ(c.label(), "zero3 b16x1 gathers-int8 reductions-int4 secondary-host");
}

// The estimate of a candidate is the estimator's for the same settings, and leaves the model as it was.
TEST(TuneSpace, EstimateIsTheEstimatorsAndPrunesByTheBudget) {
  Tiny t(4, 16);
  Candidate c{StrategyKind::zero3, {}, 8, 2, Recompute::blocks, true, 1, false};
  PlanOptions o;
  o.strategy = {StrategyKind::zero3, {}, false, 1};
  o.placement.offload_optimizer = true;
  EstimateInput in;
  in.model = t.model.get();
  in.plan = plan_for_world(o, 4);
  in.rank_batch = 2;
  in.seq = 32;
  in.grad_accum = 2;
  t.model->set_recompute(Recompute::blocks);
  const int64_t want = estimate_memory(in).total();
  t.model->set_recompute(Recompute::none);
  EXPECT_EQ(estimate_candidate(t.problem, c).total(), want);
  EXPECT_EQ(t.model->activation_bytes(2, 32, DType::f32), estimate_memory(in).activations);  // back at none
  t.problem.budget = want;
  EXPECT_TRUE(fits(t.problem, c));
  t.problem.budget = want - 1;
  EXPECT_FALSE(fits(t.problem, c));
}

// An auto split may give one rank more than an even share: as many as fit the budget, leaving each other
// rank one sequence.
TEST(TuneSpace, AutoSplitTakesWhatTheBudgetAllowsARank) {
  Tiny t(4, 16);
  TuneSpace space;
  space.strategies = {StrategyKind::zero2};
  space.grad_accums = {1};
  space.checkpointing = {Recompute::none};
  space.offload = {false};
  space.auto_split = {true};
  Candidate c = enumerate_candidates(t.problem, space).at(0);
  EXPECT_EQ(c.max_rank_batch, 13);  // the budget is no limit here
  const int64_t at6 = [&] {
    Candidate six = c;
    six.max_rank_batch = 6;
    return estimate_candidate(t.problem, six).total();
  }();
  t.problem.budget = at6;
  c = enumerate_candidates(t.problem, space).at(0);
  EXPECT_EQ(c.max_rank_batch, 6);
  EXPECT_EQ(estimate_candidate(t.problem, c).total(), at6);
}

MeasuredRun measured_run() {
  MeasuredRun m;
  m.step_ms = 120;
  m.seq_per_s = {100, 100, 100, 100};
  m.comm_exposed_ms = 2;
  m.comm_total_ms = 40;
  m.comm_latency_ms = 10;
  return m;
}

// The calibrated model predicts the calibrating run itself, and its rates are the run's.
TEST(TuneCost, CalibrationReproducesTheRun) {
  Tiny t(4, 16);
  const Candidate ran{StrategyKind::zero2, {}, 16, 1, Recompute::blocks};
  const Calibration rates = calibrate(t.problem, ran, measured_run());
  EXPECT_TRUE(rates.measured);
  // zero2 at one micro-step: a reduce-scatter and an all-gather per unit.
  EXPECT_DOUBLE_EQ(rates.comm_ms_per_call, 10.0 / (2 * double(t.model->units().size())));
  EXPECT_NEAR(rates.exposed_fraction, 2.0 / 40, 1e-12);  // 2 ms exposed of the 40 the replay took
  const double factor = recompute_factor(*t.model, 32);
  for (double s : rates.seconds_per_seq) EXPECT_DOUBLE_EQ(s, 0.01 / factor);
  const StepCost cost = predict_step(t.problem, ran, rates);
  EXPECT_NEAR(cost.compute_ms, 40, 1e-9);  // 4 sequences per rank at 10 ms each
  EXPECT_NEAR(cost.comm_ms, 2, 1e-9);
  EXPECT_NEAR(cost.step_ms(), 120, 1e-9);
  EXPECT_GT(cost.optimizer_ms, 0);
}

// A rank's blocked time holds its wait for the slowest rank, whose compute is counted already: where the
// two exceed the step, the exposed share gives way and the run is still predicted as it ran.
TEST(TuneCost, CalibrationTakesAStragglersWaitOutOfTheExposedShare) {
  Tiny t(4, 16);
  const Candidate ran{StrategyKind::zero2, {}, 16, 1, Recompute::blocks};
  MeasuredRun m = measured_run();
  m.step_ms = 41;  // 40 of compute and 2 blocked
  const Calibration rates = calibrate(t.problem, ran, m);
  const StepCost cost = predict_step(t.problem, ran, rates);
  EXPECT_NEAR(cost.step_ms(), 41, 1e-9);
  EXPECT_NEAR(cost.comm_ms, 1, 1e-9);
  EXPECT_EQ(cost.optimizer_ms, 0);
  EXPECT_LT(rates.exposed_fraction, 2.0 / 40);
}

TEST(TuneCost, TermsFollowTheStrategy) {
  Tiny t(4, 16);
  const Calibration rates = calibrate(t.problem, Candidate{StrategyKind::zero2, {}, 16, 1}, measured_run());
  const auto cost = [&](Candidate c) { return predict_step(t.problem, c, rates); };
  const StepCost ddp = cost({StrategyKind::ddp, {}, 16, 1}), zero1 = cost({StrategyKind::zero1, {}, 16, 1});
  const StepCost zero2 = cost({StrategyKind::zero2, {}, 16, 1}), zero3 = cost({StrategyKind::zero3, {}, 16, 1});
  // The same volume for ddp, zero1 and zero2 at one micro-step, in one all-reduce per unit for ddp and two
  // collectives per unit for the others; zero3 gathers twice on top.
  EXPECT_LT(ddp.comm_ms, zero1.comm_ms);
  EXPECT_DOUBLE_EQ(zero1.comm_ms, zero2.comm_ms);
  EXPECT_NEAR(zero3.comm_ms, 1.5 * zero2.comm_ms, 1e-9 * zero3.comm_ms);
  // ddp steps every parameter, the others a quarter.
  EXPECT_NEAR(ddp.optimizer_ms, 4 * zero2.optimizer_ms, 1e-3 * ddp.optimizer_ms);
  EXPECT_DOUBLE_EQ(ddp.compute_ms, zero3.compute_ms);
  // zero2 reduce-scatters every micro-step, ddp once per step; keeping gathered units gathers once.
  const StepCost zero2_accum = cost({StrategyKind::zero2, {}, 8, 2}), ddp_accum = cost({StrategyKind::ddp, {}, 8, 2});
  EXPECT_GT(zero2_accum.comm_ms, 1.4 * zero2.comm_ms);
  EXPECT_DOUBLE_EQ(ddp_accum.comm_ms, ddp.comm_ms);
  EXPECT_DOUBLE_EQ(ddp_accum.compute_ms, ddp.compute_ms);
  Candidate keep{StrategyKind::zero3, {}, 16, 1};
  keep.reshard_after_forward = false;
  EXPECT_DOUBLE_EQ(cost(keep).comm_ms, zero2.comm_ms);
  // Without prefetch (--max-inflight 1) zero3's gathers are all exposed.
  Candidate unprefetched{StrategyKind::zero3, {}, 16, 1};
  unprefetched.max_inflight = 1;
  EXPECT_GT(cost(unprefetched).comm_ms, zero3.comm_ms);
  // Checkpointing recomputes the blocks' forward.
  Candidate blocks{StrategyKind::zero2, {}, 16, 1, Recompute::blocks};
  EXPECT_NEAR(cost(blocks).compute_ms, zero2.compute_ms * recompute_factor(*t.model, 32), 1e-9);
}

// The bytes of a candidate with communication modes are comm_volume's with them: here every one of them
// exposed and no latency, so the communication is the bytes over the bandwidth.
TEST(TuneCost, CommunicationModesMoveCommVolumesBytes) {
  Tiny t(4, 16);
  t.problem.hosts = {2, 2};
  Calibration rates = nominal_calibration(t.problem);
  rates.comm_ms_per_call = 0;
  rates.exposed_fraction = 1;
  const int64_t psi = num_params(*t.model);
  const auto volume = [&](bool quantized, int64_t secondary) {
    return comm_volume({.kind = StrategyKind::zero3,
                        .world = 4,
                        .group = 4,
                        .psi = psi,
                        .gathered = 2 * psi,
                        .quantized_gathers = quantized,
                        .quantized_reductions = quantized ? ReductionQuantization::int4 : ReductionQuantization::none,
                        .secondary_gathered = secondary,
                        .secondary_group = 2});
  };
  Candidate c{StrategyKind::zero3, {}, 16, 1};
  const double plain = predict_step(t.problem, c, rates).comm_ms;
  EXPECT_DOUBLE_EQ(plain, volume(false, 0).total() / rates.comm_bytes_per_ms);
  c.quantize_gathers = GatherQuantization::int8;
  c.quantize_reductions = ReductionQuantization::int4;
  EXPECT_DOUBLE_EQ(predict_step(t.problem, c, rates).comm_ms, volume(true, 0).total() / rates.comm_bytes_per_ms);
  c.secondary_shard = {SecondaryShard::Kind::host, 0};
  const CommVolume with_hosts = volume(true, psi);
  EXPECT_GT(with_hosts.secondary, 0);
  EXPECT_DOUBLE_EQ(predict_step(t.problem, c, rates).comm_ms, with_hosts.total() / rates.comm_bytes_per_ms);
  // Without prefetch, backward's gathers inside the hosts are exposed with forward's.
  rates.exposed_fraction = 0;
  c.max_inflight = 1;
  EXPECT_DOUBLE_EQ(predict_step(t.problem, c, rates).comm_ms,
                   (with_hosts.gather + with_hosts.secondary) / rates.comm_bytes_per_ms);
}

// GPT-2: the blocks' forward is 2 FLOPs per block parameter and a third of attention's, per token.
TEST(TuneCost, RecomputeFactorIsTheBlocksForwardShare) {
  const std::unique_ptr<Model> model = build_model("tiny", model_config("tiny"));
  const std::vector<UnitSpec> units = model->units();
  double blocks = 0;
  for (size_t u = 1; u + 1 < units.size(); ++u) blocks += double(units[u].numel());
  const double step = model->flops_per_token(64), attention = step - 6.0 * double(num_params(*model));
  EXPECT_GT(attention, 0);
  EXPECT_DOUBLE_EQ(recompute_factor(*model, 64), 1 + (2 * blocks + attention / 3) / step);
  EXPECT_GT(recompute_factor(*model, 64), 1.05);
  EXPECT_LT(recompute_factor(*model, 64), 1.34);
  // LoRA's frozen base counts 4 FLOPs a parameter: attention's share is still the 6 * layers * T * dim.
  const std::unique_ptr<Model> lora = build_model("tiny", model_config("tiny", {{"lora_rank", 2}}));
  const std::vector<UnitSpec> lora_units = lora->units();
  double lora_blocks = 0;
  for (size_t u = 1; u + 1 < lora_units.size(); ++u) lora_blocks += double(lora_units[u].numel());
  const double lora_step = lora->flops_per_token(64), tiny_attention = 6.0 * 2 * 64 * 64;
  EXPECT_DOUBLE_EQ(recompute_factor(*lora, 64), 1 + (2 * lora_blocks + tiny_attention / 3) / lora_step);
}

// The tuner's runs reduce in fp32 whatever the parameters' dtype: ddp's traffic, all gradient, is the same.
TEST(TuneCost, Bf16ParametersReduceFp32Gradients) {
  Tiny fp32(4, 16), bf16(4, 16);
  bf16.problem.param_dtype = DType::bf16;
  const Candidate ddp{StrategyKind::ddp, {}, 16, 1};
  EXPECT_DOUBLE_EQ(predict_step(bf16.problem, ddp, nominal_calibration(bf16.problem)).comm_ms,
                   predict_step(fp32.problem, ddp, nominal_calibration(fp32.problem)).comm_ms);
}

// Ranks of unequal speed: the auto split gives the fast rank more, and is predicted faster than even.
TEST(TuneCost, AutoSplitFollowsMeasuredSpeeds) {
  Tiny t(3, 48);
  MeasuredRun m = measured_run();
  m.seq_per_s = {50, 50, 100};
  const Candidate even{StrategyKind::ddp, {}, 48, 1};
  const Calibration rates = calibrate(t.problem, even, m);
  EXPECT_TRUE(unequal_speeds(rates));
  Candidate split = even;
  split.auto_split = true;
  split.max_rank_batch = 46;
  EXPECT_EQ(predicted_split(split, 3, rates.seconds_per_seq), (std::vector<int>{12, 12, 24}));
  EXPECT_NEAR(predict_step(t.problem, even, rates).compute_ms / predict_step(t.problem, split, rates).compute_ms,
              16.0 / 12, 1e-9);
  m.seq_per_s = {100, 95, 110};
  EXPECT_FALSE(unequal_speeds(calibrate(t.problem, even, m)));
}

// A frozen parameter is gathered like the others, but has no gradient to reduce, no update to re-gather
// and no AdamW: the bytes are comm_volume's with the trainable parameters reduced and every one gathered,
// as the memory report predicts them, and the optimizer's time is the trainable parameters'.
TEST(TuneCost, FrozenParametersAreGatheredButNeitherReducedNorStepped) {
  Tiny t(4, 16);
  Calibration rates = nominal_calibration(t.problem);
  rates.comm_ms_per_call = 0;
  rates.exposed_fraction = 1;
  const Candidate ddp{StrategyKind::ddp, {}, 16, 1}, zero3{StrategyKind::zero3, {}, 16, 1};
  const StepCost all_trained = predict_step(t.problem, ddp, rates);
  t.problem.freeze = {"wte.weight"};
  const ParamCounts counts = count_params(freeze_matching(t.model->units(), t.problem.freeze));
  ASSERT_GT(counts.frozen, 0);
  const auto bytes = [&](StrategyKind kind) {
    return comm_volume({.kind = kind, .world = 4, .group = 4, .psi = counts.trainable, .gathered = 2 * counts.total()})
        .total();
  };
  EXPECT_DOUBLE_EQ(predict_step(t.problem, ddp, rates).comm_ms, bytes(StrategyKind::ddp) / rates.comm_bytes_per_ms);
  EXPECT_DOUBLE_EQ(predict_step(t.problem, zero3, rates).comm_ms, bytes(StrategyKind::zero3) / rates.comm_bytes_per_ms);
  EXPECT_NEAR(predict_step(t.problem, ddp, rates).optimizer_ms / all_trained.optimizer_ms,
              double(counts.trainable) / double(counts.total()), 1e-9);
}

}  // namespace
}  // namespace zshard
