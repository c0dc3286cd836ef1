// CopyOnUpdate, the snapshot of an asynchronous save of host state, driven by hand: the test plays the
// writer thread (take/done) and the optimizer (before_update, or a real training step). What the writer
// takes must be the state as it was when the save began, whichever side reaches a slice first, and the
// optimizer waits for one slice's write at most, never for a writer that stopped.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <vector>

#include "comm/self_communicator.h"
#include "shard/async_checkpoint.h"
#include "shard/copy_on_update.h"
#include "tests/support/training_runs.h"

namespace zshard {
namespace {

using namespace std::chrono_literals;

struct TinyRun {
  comm::SelfCommunicator self;
  Trainer trainer{test::tiny_options(3), self};
  ShardedParams& params() { return trainer.engine().params(); }
  int64_t numel(int unit) { return params().layout(unit).shard_numel(); }
  float* live(size_t tensor) { return owned_state(params(), int(tensor / 3))[tensor % 3].data<float>(); }
  std::vector<float> values(size_t tensor) { return {live(tensor), live(tensor) + numel(int(tensor / 3))}; }
};

// What the writer would write of `tensor`, slice by slice.
std::vector<float> take_all(CopyOnUpdate& cow, size_t tensor, int64_t numel) {
  std::vector<float> out;
  for (int64_t begin = 0; begin < numel; begin += kSaveSliceNumel) {
    const int64_t n = std::min(kSaveSliceNumel, numel - begin);
    const float* values = cow.take(tensor, begin, n);
    out.insert(out.end(), values, values + n);
    cow.done(tensor, begin);
  }
  return out;
}

TEST(CopyOnUpdate, TheUpdateWaitsForTheSliceBeingWrittenAndCopiesTheRest) {
  TinyRun run;
  ASSERT_GE(run.params().num_units(), 2);
  const std::vector<float> m = run.values(1), v = run.values(2);
  CopyOnUpdate cow(run.params());
  EXPECT_EQ(cow.take(0, 0, std::min(kSaveSliceNumel, run.numel(0))), run.live(0))
      << "an untouched slice is read in place";
  auto update = std::async(std::launch::async, [&] { cow.before_update(0); });
  ASSERT_EQ(update.wait_for(300ms), std::future_status::timeout)
      << "the update did not wait for the slice being written";
  cow.done(0, 0);
  ASSERT_EQ(update.wait_for(10s), std::future_status::ready);
  update.get();
  // AdamW now changes m and v: the writer still gets them as they were, from the copy.
  std::fill(run.live(1), run.live(1) + run.numel(0), 7.0f);
  std::fill(run.live(2), run.live(2) + run.numel(0), 7.0f);
  EXPECT_EQ(take_all(cow, 1, run.numel(0)), m);
  EXPECT_EQ(take_all(cow, 2, run.numel(0)), v);
  EXPECT_EQ(cow.copied_bytes(), 3 * run.numel(0) * int64_t(sizeof(float)));
}

TEST(CopyOnUpdate, ATrainingStepCopiesWhatTheWriterHasNotReached) {
  TinyRun run;
  run.trainer.run_step(nullptr);
  const int units = run.params().num_units();
  std::vector<std::vector<float>> before;
  for (size_t t = 0; t < size_t(3 * units); ++t) before.push_back(run.values(t));
  std::vector<FlatLayout> layouts;
  for (int u = 0; u < units; ++u) layouts.push_back(run.params().layout(u));
  CopyOnUpdate cow(run.params());
  // The writer has written unit 0 only when the step's optimizer runs.
  for (size_t t = 0; t < 3; ++t) EXPECT_EQ(take_all(cow, t, run.numel(0)), before[t]);
  run.trainer.run_step(nullptr);
  ASSERT_NE(run.values(3), before[3]) << "the step changed nothing: the test would check nothing";
  for (size_t t = 3; t < size_t(3 * units); ++t)
    EXPECT_EQ(take_all(cow, t, run.numel(int(t / 3))), before[t]) << "tensor " << t;
  // Every unit but the first was copied: the snapshot the estimator predicts, less unit 0.
  EXPECT_EQ(cow.copied_bytes(), checkpoint_snapshot_bytes(layouts, 0) - 3 * run.numel(0) * int64_t(sizeof(float)));
}

TEST(CopyOnUpdate, AWriterThatStoppedHoldsNothingBack) {
  TinyRun run;
  ASSERT_GE(run.params().num_units(), 2);
  CopyOnUpdate cow(run.params());
  cow.take(0, 0, std::min(kSaveSliceNumel, run.numel(0)));  // claimed, and then the write failed
  cow.writer_finished();
  auto update = std::async(std::launch::async, [&] {
    cow.before_update(0);
    cow.before_update(1);
  });
  ASSERT_EQ(update.wait_for(10s), std::future_status::ready) << "the update waits for a writer that stopped";
  update.get();
  EXPECT_EQ(cow.copied_bytes(), 0) << "what a stopped writer will not write needs no copy";
}

}  // namespace
}  // namespace zshard
