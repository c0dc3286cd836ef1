// Frozen parameters (ParamSpec::frozen, EngineOptions::freeze, --freeze) under every strategy: they keep
// their bytes, the others train exactly as the single process does with the same parameters frozen, no
// gradient or optimizer memory is kept for them (measured beside the prediction), and a checkpoint, which
// names them rather than holding them, loads under another strategy only beside the same ones (another
// world: tests/cli/test_freeze.sh).
// zshard-test-np: 2 4
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include <zshard/error.h>

#include "shard/engine_internals.h"
#include "shard/frozen_params.h"
#include "shard/memory/estimator.h"
#include "tests/support/test_support.h"
#include "tests/support/training_runs.h"

namespace zshard {
namespace {

constexpr double kTolerance = 1e-5;

struct Frozen {
  std::string model;
  std::vector<std::string> patterns;
  int lora_rank = 0;  // LoRA adapters, everything else frozen
};

// For each model, an embedding, a whole block and the norms' gains frozen: every kind of backward op
// skips a weight gradient somewhere, and every unit kind (all frozen, part frozen, none) is there. Then
// LoRA, which freezes all but its adapters.
const std::vector<Frozen> kCases = {
    {"tiny", {"wte.weight", "wpe.weight", "h.0.*", "h.*.ln_*.weight"}},
    {"llama-tiny", {"model.embed_tokens.weight", "model.layers.0.*", "model.norm.weight"}},
    {"tiny", {}, 2},
};

TrainOptions frozen_options(const Frozen& f, int steps) {
  TrainOptions o = test::tiny_options(steps);
  o.model.name = f.model;
  o.model.freeze = f.patterns;
  if (f.lora_rank) o.model.overrides["lora_rank"] = f.lora_rank;
  return o;
}

// Whether each element of RunResult::params (units in order, UnitSpec order inside) is frozen.
std::vector<bool> frozen_mask(const TrainOptions& o) {
  const auto model = build_model(o.model.name, resolve_model_config(o.model));  // LoRA marks its own frozen
  std::vector<bool> mask;
  for (const UnitSpec& unit : freeze_matching(model->units(), o.model.freeze))
    for (const ParamSpec& p : unit.params) mask.insert(mask.end(), size_t(p.numel()), p.frozen);
  return mask;
}

// Every parameter, trained and frozen, units in order. Collective.
std::vector<float> params_of(Trainer& trainer) {
  ShardedParams& params = EngineInternals::params(trainer.engine());
  std::vector<float> out;
  for (int u = 0; u < params.num_units(); ++u) {
    const FlatValues whole = params.whole_unit_params(u);
    out.insert(out.end(), whole.begin(), whole.begin() + params.layout(u).numel() + params.frozen_layout(u).numel());
  }
  return out;
}

std::vector<float> initial_params(const TrainOptions& o) {
  Trainer trainer(o, test::world());
  return params_of(trainer);
}

TEST(FrozenParams, KeepTheirBytesWhileTheOthersTrain) {
  for (const Frozen& f : kCases) {
    const TrainOptions base = frozen_options(f, 10);
    const std::vector<bool> mask = frozen_mask(base);
    const std::vector<float> before = initial_params(base);
    ASSERT_EQ(before.size(), mask.size());
    for (const StrategyOptions& s : test::strategies_for(test::world().size())) {
      TrainOptions o = base;
      o.plan.strategy = s;
      const std::vector<float> after = test::train(o, test::world()).params;
      ASSERT_EQ(after.size(), before.size());
      size_t moved_frozen = 0, moved_trainable = 0, trainable = 0;
      for (size_t i = 0; i < mask.size(); ++i) {
        const bool moved = std::memcmp(&before[i], &after[i], sizeof(float)) != 0;
        (mask[i] ? moved_frozen : moved_trainable) += moved;
        trainable += !mask[i];
      }
      const std::string what = f.model + (f.lora_rank ? " LoRA " : " ") + test::describe(s);
      EXPECT_EQ(moved_frozen, 0u) << what << ": frozen parameters moved";
      EXPECT_GT(moved_trainable, trainable / 2) << what << ": the trainable parameters did not train";
    }
  }
}

TEST(FrozenParams, EveryStrategyMatchesSingleProcessWithTheSameFrozen) {
  for (const Frozen& f : kCases) {
    const TrainOptions base = frozen_options(f, 20);
    const test::RunResult reference = test::train_single_process(base);
    ASSERT_LT(reference.losses.back(), reference.losses.front()) << f.model;
    // Freezing changes the run: the same run with nothing frozen takes other steps.
    if (!f.lora_rank) {
      TrainOptions unfrozen = base;
      unfrozen.model.freeze.clear();
      EXPECT_NE(test::train_single_process(unfrozen).losses.back(), reference.losses.back()) << f.model;
    }
    for (const StrategyOptions& s : test::strategies_for(test::world().size())) {
      TrainOptions o = base;
      o.plan.strategy = s;
      const test::RunResult got = test::train(o, test::world());
      const std::string what = f.model + (f.lora_rank ? " LoRA " : " ") + test::describe(s);
      ASSERT_EQ(got.losses.size(), reference.losses.size()) << what;
      for (size_t i = 0; i < got.losses.size(); ++i)
        EXPECT_LE(std::abs(got.losses[i] - reference.losses[i]) / reference.losses[i], kTolerance)
            << what << ": step " << i + 1;
      EXPECT_LE(test::max_rel_diff(got.params, reference.params), kTolerance) << what;
    }
  }
}

// The memory report after one step of `o` under `kind`. Collective.
MemoryReport report_after_a_step(TrainOptions o, StrategyKind kind) {
  o.plan.strategy.kind = kind;
  Trainer trainer(o, test::world());
  trainer.run(nullptr);
  return trainer.engine().memory_report();
}

// Everything but the blocks' LayerNorms frozen: the frozen category holds the rest in the compute dtype,
// and gradients and optimizer state exist for the LayerNorms alone (and the padding of the units with
// nothing else), each category measured beside its prediction.
TEST(FrozenParams, MemoryHasNoGradientOrOptimizerStateForThem) {
  TrainOptions o = test::tiny_options(1);
  o.model.freeze = {"wte.weight", "wpe.weight", "h.*.attn.*", "h.*.mlp.*", "ln_f.*"};
  for (StrategyKind k : {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2, StrategyKind::zero3}) {
    o.plan.strategy.kind = k;
    Trainer trainer(o, test::world());
    trainer.run(nullptr);
    const MemoryReport report = trainer.engine().memory_report();
    const std::string what = std::string(strategy_name(k));
    ASSERT_GT(report.frozen_params, 0) << what;  // the trainer stays: the estimate below reads its model
    const MemStats& mine = report.ranks[size_t(test::world().rank())].stats;
    const ModelStateBytes& want = report.ranks[size_t(test::world().rank())].predicted;
    const auto ratio = [&](Category c, int64_t predicted) { return double(mine.live[int(c)]) / double(predicted); };
    EXPECT_NEAR(ratio(Category::frozen, want.frozen), 1.0, 0.01) << what;
    EXPECT_NEAR(ratio(Category::params, want.params), 1.0, 0.05) << what;
    EXPECT_NEAR(ratio(Category::grads, want.grads), 1.0, 0.05) << what;
    EXPECT_NEAR(ratio(Category::optimizer, want.optimizer), 1.0, 0.05) << what;
    // The LayerNorms are 2 x 2 x 64 of 119k parameters: gradients and Adam state of about that.
    EXPECT_LT(mine.live[int(Category::grads)], 4 * 1024) << what;
    EXPECT_LT(mine.live[int(Category::optimizer)], 8 * 4 * 1024) << what;
    EXPECT_GT(mine.live[int(Category::frozen)], 100'000 / (k == StrategyKind::ddp ? 1 : test::world().size())) << what;
    // zshard-mem's estimate (the layouts, padding included) of the same split.
    EstimateInput in;
    in.model = &trainer.model();
    in.plan = trainer.plan();
    in.freeze = o.model.freeze;
    in.group = trainer.plan().groups.group_of(test::world().rank());
    const MemoryEstimate e = estimate_memory(in);
    EXPECT_EQ(e.frozen_params, report.frozen_params) << what;
    EXPECT_NEAR(double(mine.live[int(Category::frozen)]) / double(e.model_states.frozen), 1.0, 0.01) << what;
    EXPECT_NEAR(double(mine.model_states_live()) / double(e.model_states.total()), 1.0, 0.05) << what;
  }
}

// LoRA on GPT-2 tiny's c_attn at rank 2: 2 x (2 x 64 + 192 x 2) = 1,024 adapter parameters of 126,720. The
// gradients and Adam state are theirs alone (and the padding of the units without any), the base frozen.
TEST(FrozenParams, LoraKeepsGradientsAndOptimizerStateForTheAdaptersAlone) {
  TrainOptions o = test::tiny_options(1);
  o.model.overrides["lora_rank"] = 2;
  const int n = test::world().size();
  for (StrategyKind k : {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2, StrategyKind::zero3}) {
    const MemoryReport report = report_after_a_step(o, k);
    const std::string what = std::string(strategy_name(k));
    EXPECT_EQ(report.params - report.frozen_params, 1024) << what;
    const MemStats& mine = report.ranks[size_t(test::world().rank())].stats;
    const ModelStateBytes& want = report.ranks[size_t(test::world().rank())].predicted;
    const int64_t grads_bound = (1024 + 4 * 16) * 4 / (k == StrategyKind::zero2 || k == StrategyKind::zero3 ? n : 1);
    EXPECT_LE(mine.live[int(Category::grads)], grads_bound) << what;
    EXPECT_LE(mine.live[int(Category::optimizer)], 2 * (1024 + 4 * 16) * 4 / (k == StrategyKind::ddp ? 1 : n)) << what;
    EXPECT_NEAR(double(mine.live[int(Category::grads)]) / double(want.grads), 1.0, 0.05) << what;
    EXPECT_NEAR(double(mine.live[int(Category::frozen)]) / double(want.frozen), 1.0, 0.01) << what;
  }
  // Mixed precision: the base in bf16, 2 bytes a parameter; the adapters with an fp32 master beside Adam's
  // m and v, 12 bytes an owned parameter.
  o.plan.placement.param_dtype = DType::bf16;
  const MemoryReport report = report_after_a_step(o, StrategyKind::zero3);
  const MemStats& mine = report.ranks[size_t(test::world().rank())].stats;
  const int64_t frozen = report.frozen_params;
  EXPECT_NEAR(double(mine.live[int(Category::frozen)]) / double(2 * frozen / n), 1.0, 0.01);
  EXPECT_NEAR(double(mine.live[int(Category::optimizer)]) / double(12 * 1024 / n), 1.0, 0.1);
}

// Saved under zero3 at this world, loaded under ddp: the frozen parameters are not in the files, and a
// model whose frozen parameters came from another seed is refused, naming both.
TEST(FrozenParams, CheckpointResumesOnlyBesideTheSameFrozenWeights) {
  const test::TempDir mine("frozen-ck");
  const std::string dir = test::shared_dir(mine);
  TrainOptions o = frozen_options(kCases[0], 3);
  o.plan.strategy.kind = StrategyKind::zero3;
  std::vector<float> saved;
  {
    Trainer trainer(o, test::world());
    trainer.run(nullptr);
    trainer.engine().save(dir + "/step");
    saved = params_of(trainer);
  }
  o.plan.strategy.kind = StrategyKind::ddp;
  {
    Trainer trainer(o, test::world());
    EXPECT_EQ(trainer.engine().load(dir + "/step").step, 3);
    EXPECT_EQ(params_of(trainer), saved) << "the trained parameters from the files, the frozen ones as they were";
  }
  o.model.seed += 1;
  Trainer other(o, test::world());
  try {
    other.engine().load(dir + "/step");
    ADD_FAILURE() << "a checkpoint loaded beside other frozen weights";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("from seed " + std::to_string(o.model.seed - 1)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("from seed " + std::to_string(o.model.seed)), std::string::npos) << e.what();
  }
  // A frozen parameter reshaped (a shorter context's position table): the trained units match, the frozen
  // elements do not, whatever their source.
  o.model.seed -= 1;
  o.model.overrides["ctx"] = 64;
  Trainer reshaped(o, test::world());
  EXPECT_NE(test::error_of([&] { reshaped.engine().load(dir + "/step"); })
                .find(" frozen parameter elements, but this model freezes "),
            std::string::npos);
}

TEST(FrozenParams, PatternsThatFreezeNothingOrEverythingAreRefused) {
  for (const std::vector<std::string>& patterns :
       {std::vector<std::string>{"wte.weight", "h.*.nothing"}, std::vector<std::string>{"*"}}) {
    TrainOptions o = test::tiny_options(1);
    o.model.freeze = patterns;
    try {
      Trainer trainer(o, test::world());
      ADD_FAILURE() << "--freeze " << patterns.back() << " was accepted";
    } catch (const AgreedFailure& e) {  // every rank refuses alike, as a bad value: exit code 2
      const std::string message = e.what();
      EXPECT_EQ(e.exit_code(), 2) << message;
      EXPECT_NE(message.find("--freeze"), std::string::npos) << message;
      EXPECT_NE(message.find(patterns.size() == 2 ? "'h.*.nothing' matches no parameter" : "nothing is left to train"),
                std::string::npos)
          << message;
    }
  }
}

}  // namespace
}  // namespace zshard
