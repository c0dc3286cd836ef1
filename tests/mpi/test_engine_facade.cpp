// What a training loop of one's own gets from the Engine beside forward_backward and step: a step's global
// loss, norm and tokens, the same on every rank; an evaluation's global mean; the non-finite gate before
// the optimizer; the full weights in and out as a safetensors file; a save in the background, committed
// only once every rank's file is written, one at a time.
// zshard-test-np: 1 2 3
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include <zshard/engine.h>

#include "models/gpt2.h"
#include "kernels/allocator.h"
#include "shard/checkpoint_format.h"
#include "shard/engine_internals.h"
#include "tests/support/test_support.h"

namespace zshard {
namespace {

using ::testing::HasSubstr;
using test::world;

constexpr int kB = 2, kT = 8;

// This rank's micro-batch, its tokens its own: the ranks' losses differ.
struct Tokens {
  std::vector<int32_t> inputs, targets;
  explicit Tokens(int salt = 0) {
    for (int i = 0; i < kB * kT; ++i) {
      inputs.push_back((7 * i + 31 * (world().rank() + salt) + 3) % 256);
      targets.push_back((5 * i + 17 * (world().rank() + salt) + 10) % 256);
    }
  }
  Batch batch() const { return {inputs.data(), targets.data(), kB, kT}; }
};

std::unique_ptr<Engine> zero3_engine() {
  return std::make_unique<Engine>(test::tiny_gpt2(), world(), test::plan({StrategyKind::zero3}),
                                  EngineOptions{.seed = 3, .grad_accum = 1, .tokens_per_step = int64_t(kB) * kT * world().size()});
}

double global_sum(double value) {
  comm::all_reduce_sum(world(), &value, 1);
  return value;
}

// Whether `value` is the same on every rank.
bool agreed(double value) {
  std::vector<double> all(size_t(world().size()));
  world().all_gather(&value, all.data(), 1, DType::f64)->wait();
  for (double v : all)
    if (v != value) return false;
  return true;
}

TEST(EngineFacade, AStepReturnsTheWholeBatchsLossNormAndTokensOnEveryRank) {
  const std::unique_ptr<Engine> engine = zero3_engine();
  const Tokens tokens;
  const double mine = engine->forward_backward(tokens.batch());
  const double norm = engine->grad_norm();
  const StepStats stats = engine->step({.lr = 1e-2f});
  EXPECT_EQ(stats.loss, global_sum(mine) / double(kB * kT * world().size()));
  EXPECT_EQ(stats.grad_norm, norm);
  EXPECT_EQ(stats.tokens, int64_t(kB) * kT * world().size());
  EXPECT_TRUE(agreed(stats.loss));
  EXPECT_TRUE(agreed(stats.grad_norm));
}

TEST(EngineFacade, AnEvaluationsMeanIsOverEveryRanksTokens) {
  const std::unique_ptr<Engine> engine = zero3_engine();
  const Tokens first, second(5);
  const double mine = engine->forward(first.batch()) + engine->forward(second.batch());
  const double mean = engine->finish_eval();
  EXPECT_EQ(mean, global_sum(mine) / double(2 * kB * kT * world().size()));
  EXPECT_TRUE(agreed(mean));
  EXPECT_EQ(test::error_of([&] { engine->finish_eval(); }),
            "finish_eval(): no rank evaluated a token since the last call: call forward first");
}

// The gate the training loop had: a NaN in the weights stops the step before AdamW, on every rank alike.
TEST(EngineFacade, ANonFiniteLossStopsTheStepBeforeTheOptimizer) {
  const std::unique_ptr<Engine> engine = zero3_engine();
  ShardedParams& params = EngineInternals::params(*engine);
  FlatValues unit = params.full_unit_params(0);
  unit[0] = std::numeric_limits<float>::quiet_NaN();
  params.set_unit_params(0, unit.data());
  engine->forward_backward(Tokens().batch());
  EXPECT_THAT(test::error_of([&] { engine->step({}); }),
              HasSubstr("step 1: non-finite loss (loss nan, gradient norm nan); stopped before the optimizer step"));
  EXPECT_EQ(engine->steps_done(), 0);
}

TEST(EngineFacade, WeightsExportedAndImportedRestoreTheModel) {
  test::TempDir tmp;
  const std::string path = test::shared_dir(tmp) + "/weights.safetensors";
  const std::unique_ptr<Engine> engine = zero3_engine();
  const Tokens tokens;
  engine->export_weights(path);
  engine->forward(tokens.batch());
  const double before = engine->finish_eval();
  engine->forward_backward(tokens.batch());
  engine->step({.lr = 1e-2f});
  engine->forward(tokens.batch());
  ASSERT_NE(engine->finish_eval(), before);
  engine->import_weights(path);
  engine->forward(tokens.batch());
  EXPECT_EQ(engine->finish_eval(), before);
  EXPECT_EQ(engine->steps_done(), 1) << "the optimizer's step count stays";
  // A bad file is refused on every rank alike, before anything changes.
  EXPECT_THAT(test::error_of([&] { engine->import_weights(path + ".missing"); }),
              HasSubstr(path + ".missing: cannot open (No such file or directory)"));
  engine->forward(tokens.batch());
  EXPECT_EQ(engine->finish_eval(), before);
}

// An export streams: rank 0 writes each unit as it is gathered and drops it, so that no rank holds the
// model whole; a write that fails leaves no rank waiting in a gather, and the engine as it was.
TEST(EngineFacade, AnExportHoldsOneUnitAtATime) {
  test::TempDir tmp;
  const std::string dir = test::shared_dir(tmp);
  GPT2 model(GPT2Config{8, 64, 4, 256, 64});  // ten units, none an eighth of the model
  Engine engine(model, world(), test::plan({StrategyKind::zero3}),
                EngineOptions{.seed = 3, .grad_accum = 1, .tokens_per_step = int64_t(kB) * kT * world().size()});
  int64_t largest = 0, whole = 0;
  for (const UnitSpec& unit : model.units()) {
    largest = std::max(largest, unit.numel() * int64_t(sizeof(float)));
    whole += unit.numel() * int64_t(sizeof(float));
  }
  Allocator& host = Allocator::of(Device::cpu);
  host.reset_peaks();
  const int64_t live = host.stats().live[size_t(Category::comm)];
  engine.export_weights(dir + "/weights.safetensors");
  const int64_t held = host.stats().peak[size_t(Category::comm)] - live;
  // The unit kept for the file is dropped before the next is gathered: one unit, and its padding.
  EXPECT_GE(held, largest) << "the gathers are counted";
  EXPECT_LE(held, largest + largest / 8) << "the model is " << whole << " B";
  EXPECT_LT(held, whole / 3);
  const Tokens tokens;
  engine.forward(tokens.batch());
  const double before = engine.finish_eval();
  EXPECT_THAT(test::error_of([&] { engine.export_weights(dir + "/missing/weights.safetensors"); }),
              HasSubstr(world().rank() == 0 ? dir + "/missing/weights.safetensors" : "another rank failed"));
  engine.forward(tokens.batch());
  EXPECT_EQ(engine.finish_eval(), before);
  engine.import_weights(dir + "/weights.safetensors");
  engine.forward(tokens.batch());
  EXPECT_EQ(engine.finish_eval(), before) << "the streamed file holds the model";
}

TEST(EngineFacade, AnAsyncSaveCommitsOnceEveryFileIsWritten) {
  test::TempDir tmp;
  const std::string root = test::shared_dir(tmp);
  const std::unique_ptr<Engine> engine = zero3_engine();
  const Tokens tokens;
  engine->forward(tokens.batch());
  const double saved = engine->finish_eval();
  {
    const test::ScopedHook slow("ZSHARD_TEST_SLOW_WRITER", "1500");  // every writer thread held 1.5 s
    AsyncSave saving = engine->save_async(root + "/ck", R"({"mine": 1})");
    EXPECT_EQ(saving.step(), 0);
    EXPECT_FALSE(saving.test()) << "a writer is held";
    EXPECT_FALSE(is_committed(root + "/ck"));
    EXPECT_EQ(test::error_of([&] { (void)engine->save_async(root + "/other"); }),
              "save_async: the save of step 0 into " + root + "/ck is in flight: wait() for it first");
    // Training goes on meanwhile; the save keeps the state it was started with.
    engine->forward_backward(tokens.batch());
    engine->step({.lr = 1e-2f});
    EXPECT_GT(saving.wait(), 0);
    EXPECT_TRUE(is_committed(root + "/ck"));
    EXPECT_TRUE(saving.test());
  }
  // Neither waited for nor tested complete, a save commits nothing.
  (void)engine->save_async(root + "/abandoned");  // the handle dropped at once
  EXPECT_FALSE(is_committed(root + "/abandoned"));
  const CheckpointInfo info = engine->load(root + "/ck");
  EXPECT_EQ(info.step, 0);
  EXPECT_EQ(info.run_json, R"({"mine":1})");
  engine->forward(tokens.batch());
  EXPECT_EQ(engine->finish_eval(), saved);
}

// The engine destroyed before its save's handle: the save is given up, nothing committed, and the
// handle's calls throw without reaching into the engine that is gone.
TEST(EngineFacade, ASaveOutlivingItsEngineIsGivenUp) {
  test::TempDir tmp;
  const std::string root = test::shared_dir(tmp);
  std::unique_ptr<Engine> engine = zero3_engine();
  std::optional<AsyncSave> saving;
  {
    const test::ScopedHook slow("ZSHARD_TEST_SLOW_WRITER", "300");
    saving.emplace(engine->save_async(root + "/ck"));
    engine.reset();
  }
  EXPECT_THROW(saving->wait(), Error);
  EXPECT_THROW(saving->test(), Error);
  saving.reset();
  EXPECT_FALSE(is_committed(root + "/ck"));
}

}  // namespace
}  // namespace zshard
