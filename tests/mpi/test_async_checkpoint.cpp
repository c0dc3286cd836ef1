// Asynchronous checkpoints (--save-mode async) under mpirun: the files are those of a synchronous save,
// byte for byte, and a run resumed from them repeats the uninterrupted one bit for bit; training goes on
// while a save is in flight, whose manifest appears only once every rank's file is written; the host
// state is copied only when training overtakes the writer, and then that copy is the estimator's
// snapshot, on every rank.
// zshard-test-np: 2 3 4
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>

#include "kernels/allocator.h"
#include "shard/memory/estimator.h"
#include "runtime/train/save_policy.h"
#include "tests/support/test_support.h"
#include "tests/support/training_runs.h"

namespace zshard {
namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 6;
constexpr int kSaveEvery = 2;

// A job as zshard-train runs it: resume if asked, save per the options and at the end. Returns its losses.
std::vector<double> run_job(const TrainOptions& o) {
  Trainer trainer(o, test::world());
  SavePolicy saves(trainer, nullptr);
  trainer.run(nullptr, [&] { return saves.after_step(); });
  saves.save();
  std::vector<double> losses;
  for (const StepResult& r : trainer.history()) losses.push_back(r.loss);
  return losses;
}

std::vector<StrategyOptions> strategies() {
  std::vector<StrategyOptions> out = {{StrategyKind::zero2, {}, true, 2}, {StrategyKind::zero3, {}, true, 2}};
  if (test::world().size() % 2 == 0) out.push_back({StrategyKind::hybrid, ShardGroupRequest::equal(2), true, 2});
  return out;
}

std::string name_of(const StrategyOptions& s) { return std::string(strategy_name(s.kind)); }

TEST(AsyncCheckpoint, WritesTheFilesOfASyncSaveAndResumesAlike) {
  test::TempDir mine("zshard-async");
  const std::string root = test::shared_dir(mine);
  for (const StrategyOptions& s : strategies()) {
    TrainOptions o = test::tiny_options(kSteps);
    o.plan.strategy = s;
    o.saves.save_every = kSaveEvery;
    o.saves.mode = SaveMode::sync;
    o.saves.save_dir = root + "/" + name_of(s) + "-sync";
    const std::vector<double> sync_losses = run_job(o);
    o.saves.mode = SaveMode::async;
    o.saves.save_dir = root + "/" + name_of(s) + "-async";
    const std::vector<double> async_losses = run_job(o);
    EXPECT_EQ(async_losses, sync_losses) << name_of(s);
    if (test::world().rank() == 0) {
      int files = 0;
      for (int step = kSaveEvery; step <= kSteps; step += kSaveEvery) {
        const fs::path sync_dir = fs::path(root) / (name_of(s) + "-sync") / step_dir_name(step);
        const fs::path async_dir = fs::path(o.saves.save_dir) / step_dir_name(step);
        EXPECT_TRUE(is_committed(async_dir.string())) << async_dir;
        for (const auto& entry : fs::directory_iterator(sync_dir)) {
          ++files;
          EXPECT_TRUE(test::file_bytes(entry.path()) == test::file_bytes(async_dir / entry.path().filename()))
              << name_of(s) << ": " << async_dir / entry.path().filename() << " differs from the sync save's";
        }
      }
      EXPECT_GE(files, kSteps / kSaveEvery * 2) << name_of(s);  // a manifest and a rank file at least
    }
    // Resumed from the asynchronous save of step 2: the uninterrupted run's losses from step 3 on.
    TrainOptions resumed = test::tiny_options(kSteps);
    resumed.plan.strategy = s;
    resumed.saves.resume = o.saves.save_dir + "/" + step_dir_name(kSaveEvery);
    const std::vector<double> resumed_losses = run_job(resumed);
    EXPECT_EQ(resumed_losses, std::vector<double>(sync_losses.begin() + kSaveEvery, sync_losses.end())) << name_of(s);
  }
}

int64_t host_live() { return Allocator::of(Device::cpu).stats().live[int(Category::host)]; }

TEST(AsyncCheckpoint, TrainingGoesOnWhileTheSaveIsInFlight) {
  test::TempDir mine("zshard-async");
  const std::string root = test::shared_dir(mine);
  std::vector<StrategyOptions> kinds = strategies();
  kinds.insert(kinds.begin(), {StrategyKind::ddp, {}, true, 2});  // rank 0 alone writes the whole state
  for (const StrategyOptions& s : kinds) {
    TrainOptions o = test::tiny_options(4);
    o.plan.strategy = s;
    o.saves.save_every = 2;
    o.saves.save_dir = root + "/" + name_of(s);
    const std::string saved = o.saves.save_dir + "/" + step_dir_name(2);
    const test::ScopedHook slow("ZSHARD_TEST_SLOW_WRITER", "2000");  // every writer thread held 2 s
    Trainer trainer(o, test::world());
    SavePolicy saves(trainer, nullptr);
    trainer.run_step(nullptr);
    ASSERT_TRUE(saves.after_step());
    trainer.run_step(nullptr);
    const int64_t host_before = host_live();
    const auto started = std::chrono::steady_clock::now();
    ASSERT_TRUE(saves.after_step());  // step 2: the save starts
    // The state lives in host memory: the writers write it where it is, and the boundary copies nothing.
    EXPECT_EQ(host_live(), host_before) << name_of(s) << ": a copy at the step boundary";
    EXPECT_EQ(saves.snapshot_bytes(), 0) << name_of(s);
    // Step 3 runs while the writers are held, so its optimizer step copies every unit before changing
    // it: the copy the allocator measures is the estimator's snapshot for this rank's group (the first
    // group's ranks write; the others hold none).
    trainer.run_step(nullptr);
    const int64_t snapshot = host_live() - host_before;
    EstimateInput in;
    in.model = &trainer.model();
    in.plan = trainer.plan();
    in.group = trainer.plan().groups.group_of(test::world().rank());
    in.checkpoint_snapshot = true;
    EXPECT_EQ(snapshot, estimate_memory(in).checkpoint_snapshot) << name_of(s) << " rank " << test::world().rank();
    EXPECT_EQ(snapshot, saves.snapshot_bytes()) << name_of(s);
    if (in.group == 0) EXPECT_GT(snapshot, 0) << name_of(s);
    // The save is not committed yet.
    ASSERT_TRUE(saves.after_step());
    EXPECT_EQ(trainer.steps_done(), 3);
    EXPECT_FALSE(is_committed(saved)) << name_of(s) << ": committed before its files were written";
    // The final save waits for it, commits it, then saves step 3.
    saves.save();
    EXPECT_GE(std::chrono::steady_clock::now() - started, std::chrono::milliseconds(2000));
    EXPECT_TRUE(is_committed(saved)) << name_of(s);
    EXPECT_TRUE(is_committed(o.saves.save_dir + "/" + step_dir_name(3))) << name_of(s);
    EXPECT_EQ(host_live(), host_before) << name_of(s) << ": the snapshot outlived its save";
    // Written while training overtook it, the save holds step 2's state: a synchronous save's bytes.
    TrainOptions sync = o;
    sync.saves.mode = SaveMode::sync;
    sync.saves.save_dir = o.saves.save_dir + "-sync";
    run_job(sync);
    if (test::world().rank() == 0)
      for (const auto& entry : fs::directory_iterator(sync.saves.save_dir + "/" + step_dir_name(2)))
        if (entry.path().extension() == ".safetensors")
          EXPECT_TRUE(test::file_bytes(entry.path()) == test::file_bytes(fs::path(saved) / entry.path().filename()))
              << name_of(s) << ": " << entry.path().filename() << " differs from the sync save's";
  }
}

}  // namespace
}  // namespace zshard
