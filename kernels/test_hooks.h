// Test hooks: environment variables through which a test makes a run misbehave in ways no flag asks for
// (a slow or failing rank, a stalled set-up, late copies, a held checkpoint writer), so that it can check
// what zshard does then. They are all read here, together, the first time any is asked for; the code that
// obeys them asks test_hooks(), never the environment, so a hook on the hot path costs a field read.
//
// One format for all of them. Unset or empty, a hook is off. A value is fields separated by ':', each
//   RANK STEP UNIT N SEED   a whole number (decimal digits only)
//   MS                      a duration, a whole number of milliseconds
//   FACTOR                  a positive decimal number
//   0|1                     off or on
//   a word                  one of those the hook lists
// A RANK leads the fields of a hook that one rank obeys. Any malformed value fails the first read with
// one message, "NAME='VALUE' is malformed: expected FORMAT". comm::init_world reads them before MPI
// starts, so each rank of a tool ends there with that line, before any collective.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace zshard {

struct TestHooks {
  // ZSHARD_TEST_SLOW_RANK=RANK:FACTOR (runtime/train/trainer.cpp): world rank RANK reports its compute
  // time FACTOR times longer than measured, so that a test can make --rank-batches auto re-split on an
  // idle machine (zshard never slows a rank down).
  struct SlowRank {
    int rank;
    double factor;
  };
  std::optional<SlowRank> slow_rank;

  // ZSHARD_TEST_FAIL_RANK=RANK:STEP (runtime/train/trainer.cpp): world rank RANK throws in step STEP, so
  // that a test can check that one failing rank ends the whole job instead of leaving its peers in a
  // collective.
  struct FailRank {
    int rank;
    int step;
  };
  std::optional<FailRank> fail_rank;

  // ZSHARD_TEST_NAN_STEP=STEP (runtime/train/trainer.cpp): a parameter turns NaN on every rank before
  // step STEP, as in a divergence.
  std::optional<int> nan_step;

  // ZSHARD_TEST_STALL_SET_UP=RANK[:MS[:WHERE]] (comm/launch.cpp, maybe_stall_in_set_up): holds world rank
  // RANK for MS (default an hour) where set-up, its flags read, is about to issue its first collective
  // (WHERE "plan", the default) or before its engine splits the process groups (WHERE "engine"), so that a
  // test can check set-up's deadline.
  struct StallSetUp {
    int rank;
    int64_t ms;
    std::string where;
  };
  std::optional<StallSetUp> stall_set_up;

  // ZSHARD_TEST_SKIP_GATHER=RANK:UNIT (shard/param_gather.cpp): rank RANK of its shard group skips unit
  // UNIT's all-gather once, as a rank whose protocol has diverged would (its copy of the unit is then
  // garbage): what --check-collectives must catch.
  struct SkipGather {
    int rank;
    int unit;
  };
  std::optional<SkipGather> skip_gather;

  // ZSHARD_TEST_COPY_STREAM=async[:SEED]|lazy (kernels/queued_copies.h): the cpu's copy streams run their
  // copies later than queued, on a thread of their own after random pauses drawn from SEED (default 1),
  // or only when a wait needs them (lazy).
  struct QueuedCopyStream {
    bool threaded;
    uint32_t seed;
  };
  std::optional<QueuedCopyStream> copy_stream;

  // ZSHARD_TEST_COPY_STREAM_SKIP_WAIT=N (kernels/queued_copies.h): each queued copy stream's N-th wait
  // (counted from 1; 0 none) returns at once, so that a test shows that the results depend on each wait.
  int64_t copy_stream_skip_wait = 0;

  // ZSHARD_TEST_OFFLOAD_COPIES=0|1 (shard/optimizer_offload.cpp): on the cpu in fp32 too, the offloaded
  // optimizer's host gradients are buffers of their own, copied as on a GPU.
  bool offload_copies = false;

  // ZSHARD_TEST_SLOW_WRITER=MS (shard/async_checkpoint.cpp): every checkpoint writer thread waits MS
  // before it writes, so that a test can see training go on while a save is in flight, and kill a job in
  // the middle of one.
  int64_t slow_writer_ms = 0;

  // ZSHARD_TEST_SLOW_SLICES=MS (shard/copy_on_update.cpp): a checkpoint writer holds each slice it claims
  // in host memory for MS, so that the next optimizer step overtakes the writer in the middle of the file.
  int64_t slow_slices_ms = 0;

  // ZSHARD_TEST_PAUSE_IN_SAVE=MS (shard/engine_checkpoint.cpp): rank 0 waits MS between the rank files
  // and the manifest of a save, so that a test can kill the job in the middle of one.
  int64_t pause_in_save_ms = 0;

  // ZSHARD_TEST_COUNT_DEVICE_WAITS=0|1 (kernels/engine_ops.cpp): every wait of the host for the device
  // (ops::synchronize, ops::read_back) adds one to device_waits_counted(), on the cpu too, where nothing
  // waits, so that a test can check how often a training step would drain a GPU.
  bool count_device_waits = false;

  // ZSHARD_POLL_BACKOFF=0|1 (comm/launch.cpp, comm/polling_work.h): no test hook but an override of a
  // measured choice, for A/B runs: whether waits back off to short sleeps, whatever the host's ranks and
  // cores. Unset: the choice is made from them.
  std::optional<bool> poll_backoff;
};

// The hooks this process was started with (or reloaded), read on the first call; throws zshard::Error on
// a malformed value.
const TestHooks& test_hooks();

// Under ZSHARD_TEST_COUNT_DEVICE_WAITS, what count_device_wait() has counted in this process so far (0
// otherwise). count_device_wait is called by the ops that wait, and costs a field read with the hook off.
int64_t device_waits_counted();
void count_device_wait();

// Reads the environment again, for a test that sets a hook in its own process: between runs only, never
// while one is in flight (its threads may be reading the hooks). A malformed value throws and keeps the
// hooks as they were.
void reload_test_hooks();

}  // namespace zshard
