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
#include "shard/engine_internals.h"
#include "tests/support/training_runs.h"

namespace zshard {
namespace {

using namespace std::chrono_literals;

// The tiny model with a vocabulary of 4400: its embedding unit (4400 x 64 + 128 x 64 elements) spans two
// slices, the second shorter; the other units fit in one.
TrainOptions options() {
  TrainOptions o = test::tiny_options(3);
  o.model.overrides.insert_or_assign("vocab", 4400);
  return o;
}

struct TinyRun {
  comm::SelfCommunicator self;
  Trainer trainer{options(), self};
  ShardedParams& params() { return EngineInternals::params(trainer.engine()); }
  int64_t numel(int unit) { return params().layout(unit).shard_numel(); }
  float* live(size_t tensor) { return owned_state(params(), int(tensor / 3))[tensor % 3].data<float>(); }
  std::vector<float> values(size_t tensor) { return {live(tensor), live(tensor) + numel(int(tensor / 3))}; }
};

// Lets every update go when a check fails while one waits for the writer, so that the test ends.
struct FinishWriterAtExit {
  CopyOnUpdate& cow;
  ~FinishWriterAtExit() { cow.writer_finished(); }
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
  const int64_t n = run.numel(0);
  ASSERT_GT(n, kSaveSliceNumel) << "unit 0 fits in one slice: the test would not cover a slice after the first";
  const std::vector<float> m = run.values(1), v = run.values(2);
  CopyOnUpdate cow(run.params());
  std::future<void> update;
  const FinishWriterAtExit finish{cow};
  // The writer is in the middle of the second slice of unit 0's parameters when AdamW reaches the unit.
  cow.take(0, 0, kSaveSliceNumel);
  cow.done(0, 0);
  EXPECT_EQ(cow.take(0, kSaveSliceNumel, n - kSaveSliceNumel), run.live(0) + kSaveSliceNumel)
      << "an untouched slice is read in place";
  update = std::async(std::launch::async, [&] { cow.before_update(0); });
  ASSERT_EQ(update.wait_for(300ms), std::future_status::timeout)
      << "the update did not wait for the slice being written";
  cow.done(0, kSaveSliceNumel);
  ASSERT_EQ(update.wait_for(10s), std::future_status::ready);
  update.get();
  // AdamW now changes the unit: the writer gets m and v as they were, from the copy.
  for (size_t t = 0; t < 3; ++t) std::fill(run.live(t), run.live(t) + n, 7.0f);
  EXPECT_EQ(take_all(cow, 1, n), m);
  EXPECT_EQ(take_all(cow, 2, n), v);
  EXPECT_EQ(cow.copied_bytes(), 3 * n * int64_t(sizeof(float)));
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
  std::future<void> update;
  const FinishWriterAtExit finish{cow};
  cow.take(0, 0, std::min(kSaveSliceNumel, run.numel(0)));  // claimed, and then the write failed
  cow.writer_finished();
  update = std::async(std::launch::async, [&] {
    cow.before_update(0);
    cow.before_update(1);
  });
  ASSERT_EQ(update.wait_for(10s), std::future_status::ready) << "the update waits for a writer that stopped";
  update.get();
  EXPECT_EQ(cow.copied_bytes(), 0) << "what a stopped writer will not write needs no copy";
}

}  // namespace
}  // namespace zshard
